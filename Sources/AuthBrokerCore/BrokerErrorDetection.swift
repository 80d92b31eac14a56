import Foundation
import NIOHTTP1

/// Tells a broker error apart from the origin's own response on the data plane.
///
/// By the `Authbroker-Error` mark alone (`BrokerHeaders.error`): the daemon removes every
/// `Authbroker-*` field, and its own `Proxy-Status` members, from upstream responses, so an
/// origin cannot pass its 502 and problem body off as the broker's (with "To fix" commands of
/// its choosing). Without the mark a response is the origin's, whatever it carries. Pure, so it
/// can be tested on heads alone.
package enum BrokerErrorDetection {
    /// What the head alone says.
    package enum Verdict: Equatable, Sendable {
        /// The broker's own error about the upstream: its RFC 9209 `error` token (kept even when
        /// it is a type this code does not know: the daemon may grow) and the `details`
        /// parameter, if any.
        case brokerError(proxyStatus: String, details: String?)
        /// The broker's own error without a `Proxy-Status` member (a bad request, a refused
        /// identity): its problem body says what.
        case brokerProblem
        /// The origin's response.
        case origin
    }

    /// The prefix of every problem type the broker produces.
    package static let problemTypePrefix = "urn:authbroker:problem:"
    /// Largest problem body read to tell a broker error from the origin's response.
    package static let maxProblemBytes = 1024 * 1024

    package static func classify(_ head: HTTPResponseHead) -> Verdict {
        guard head.headers.contains(name: BrokerHeaders.error) else { return .origin }
        let proxyStatus = head.headers["Proxy-Status"].joined(separator: ", ")
        if let member = firstMember(of: proxyStatus), let error = brokerErrorType(in: member) {
            return .brokerError(proxyStatus: error, details: parameter("details", in: member))
        }
        return .brokerProblem
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
        ProxyStatusField.members(of: field).first.map(String.init)
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
