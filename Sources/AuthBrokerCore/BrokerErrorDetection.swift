import Foundation
import NIOHTTP1

/// Tells a broker error apart from the origin's own response on the data plane.
///
/// The broker marks its own errors with a `Proxy-Status` field whose first member is
/// `authbrokerd` carrying an `error` parameter (RFC 9209 §2); anything else is the origin's
/// response, passed through, even a 502. Pure, so it can be tested on heads alone.
package enum BrokerErrorDetection {
    /// What the head alone says.
    package enum Verdict: Equatable, Sendable {
        /// The broker's own error: its RFC 9209 `error` token (kept even when it is a type this
        /// code does not know: the daemon may grow) and the `details` parameter, if any.
        case brokerError(proxyStatus: String, details: String?)
        /// A problem+json error without the broker's `Proxy-Status` member: the body decides
        /// (its `type` is `urn:authbroker:problem:...` only when the broker wrote it).
        case possibleBrokerProblem
        /// The origin's response.
        case origin
    }

    /// The prefix of every problem type the broker produces.
    package static let problemTypePrefix = "urn:authbroker:problem:"
    /// Largest problem body read to tell a broker error from the origin's response.
    package static let maxProblemBytes = 1024 * 1024

    package static func classify(_ head: HTTPResponseHead) -> Verdict {
        let proxyStatus = head.headers["Proxy-Status"].joined(separator: ", ")
        if let member = firstMember(of: proxyStatus), let error = brokerErrorType(in: member) {
            return .brokerError(proxyStatus: error, details: parameter("details", in: member))
        }
        let contentType = head.headers.first(name: "Content-Type")?.lowercased() ?? ""
        let mediaType = contentType.split(separator: ";").first.map { String($0.trimmingASCIIWhitespace()) }
        if head.status.code >= 400, mediaType == ProblemDetails.mediaType { return .possibleBrokerProblem }
        return .origin
    }

    /// The `error` token of the broker's own member (`authbrokerd; error=...`), or nil.
    package static func brokerErrorType(in member: String) -> String? {
        let parts = member.split(separator: ";").map { $0.trimmingASCIIWhitespace() }
        guard parts.first == Substring(ProxyStatusField.proxyName) || parts.first == "\"\(ProxyStatusField.proxyName)\"" else {
            return nil
        }
        for parameter in parts.dropFirst() {
            let pair = parameter.split(separator: "=", maxSplits: 1)
            if pair.count == 2, pair[0] == "error" { return String(pair[1]) }
        }
        return nil
    }

    /// A body that is the broker's own problem+json, or nil.
    package static func brokerProblem(in body: some Sequence<UInt8>) -> ProblemDetails? {
        guard let problem = try? BrokerJSON.decoder().decode(ProblemDetails.self, from: Data(body)),
            problem.type.hasPrefix(problemTypePrefix)
        else { return nil }
        return problem
    }

    /// The first list member of a structured field (RFC 8941 §3.1), commas inside strings kept.
    package static func firstMember(of field: String) -> String? {
        var inString = false
        var escaped = false
        var end = field.endIndex
        for index in field.indices {
            let character = field[index]
            if escaped {
                escaped = false
            } else if inString, character == "\\" {
                escaped = true
            } else if character == "\"" {
                inString.toggle()
            } else if character == ",", !inString {
                end = index
                break
            }
        }
        let member = Substring(field[..<end]).trimmingASCIIWhitespace()
        return member.isEmpty ? nil : String(member)
    }

    /// The value of parameter `name` in a member, an sf-string unescaped (RFC 8941 §3.3.3).
    package static func parameter(_ name: String, in member: String) -> String? {
        guard let range = member.range(of: ";" + name + "=") ?? member.range(of: "; " + name + "=") else {
            return nil
        }
        let rest = member[range.upperBound...]
        guard rest.first == "\"" else {
            return String(rest.prefix { $0 != ";" }.trimmingASCIIWhitespace())
        }
        var value = ""
        var escaped = false
        for character in rest.dropFirst() {
            if escaped {
                value.append(character)
                escaped = false
            } else if character == "\\" {
                escaped = true
            } else if character == "\"" {
                return value
            } else {
                value.append(character)
            }
        }
        return value
    }
}
