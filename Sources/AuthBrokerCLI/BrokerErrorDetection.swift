import AuthBrokerCore
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
        /// The broker's own error; `details` is the `details` parameter, if any.
        case brokerError(ProxyErrorType, details: String?)
        /// A problem+json error without the broker's `Proxy-Status` member: the body decides
        /// (its `type` is `urn:authbroker:problem:...` only when the broker wrote it).
        case possibleBrokerProblem
        /// The origin's response.
        case origin
    }

    /// The prefix of every problem type the broker produces.
    package static let problemTypePrefix = "urn:authbroker:problem:"

    package static func classify(_ head: HTTPResponseHead) -> Verdict {
        let proxyStatus = head.headers["Proxy-Status"].joined(separator: ", ")
        if let member = firstMember(of: proxyStatus), let error = ProxyStatusField.brokerError(in: member) {
            return .brokerError(error, details: parameter("details", in: member))
        }
        let contentType = head.headers.first(name: "Content-Type")?.lowercased() ?? ""
        let mediaType = contentType.split(separator: ";").first.map { String($0.trimmingASCIIWhitespace()) }
        if head.status.code >= 400, mediaType == ProblemDetails.mediaType { return .possibleBrokerProblem }
        return .origin
    }

    /// A body that is the broker's own problem+json, or nil.
    package static func brokerProblem(in body: Data) -> ProblemDetails? {
        guard let problem = try? BrokerJSON.decoder().decode(ProblemDetails.self, from: body),
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
