/// The error types of RFC 9209 §2.3 that the broker reports in `Proxy-Status`.
///
/// The raw value is the registered token, so it goes on the wire unchanged and scripts
/// can match on it.
package enum ProxyErrorType: String, Sendable, Codable, CaseIterable {
    case dnsError = "dns_error"
    case dnsTimeout = "dns_timeout"
    case destinationNotFound = "destination_not_found"
    case destinationUnavailable = "destination_unavailable"
    case connectionRefused = "connection_refused"
    case connectionTerminated = "connection_terminated"
    case connectionTimeout = "connection_timeout"
    case connectionLimitReached = "connection_limit_reached"
    case tlsProtocolError = "tls_protocol_error"
    case tlsCertificateError = "tls_certificate_error"
    case httpRequestError = "http_request_error"
    case httpRequestDenied = "http_request_denied"
    case httpResponseIncomplete = "http_response_incomplete"
    case httpResponseHeaderSectionSize = "http_response_header_section_size"
    case httpResponseTimeout = "http_response_timeout"
    case httpProtocolError = "http_protocol_error"
    case proxyInternalError = "proxy_internal_error"
    case proxyConfigurationError = "proxy_configuration_error"

    /// 504 for the timeouts (RFC 9110 §15.6.5), 502 for everything else the upstream did.
    package var httpStatus: Int {
        switch self {
        case .dnsTimeout, .connectionTimeout, .httpResponseTimeout: 504
        case .proxyInternalError, .proxyConfigurationError: 500
        case .connectionLimitReached: 503
        default: 502
        }
    }
}

/// Renders and reads the broker's own member of a `Proxy-Status` field (RFC 9209 §2).
package enum ProxyStatusField {
    /// The identifier the broker uses for itself in `Proxy-Status` and `Via`.
    package static let proxyName = "authbrokerd"

    /// `authbrokerd; error=tls_certificate_error; next-hop="proxy:3128"; details="..."`.
    /// `details` and `next-hop` are reduced to printable ASCII and escaped as sf-strings
    /// (RFC 8941 §3.3.3); `next-hop` names the hop the broker was talking to (RFC 9209 §2.1.3).
    package static func render(error: ProxyErrorType, details: String?, nextHop: String? = nil) -> String {
        var value = "\(proxyName); error=\(error.rawValue)"
        if let nextHop, !nextHop.isEmpty {
            value += "; next-hop=\"\(sfStringEscaped(nextHop))\""
        }
        if let details, !details.isEmpty {
            value += "; details=\"\(sfStringEscaped(details))\""
        }
        return value
    }

    /// The `error` parameter of the broker's own member, or nil when the field carries none
    /// (the response came from upstream unchanged).
    package static func brokerError(in fieldValue: String) -> ProxyErrorType? {
        for member in members(of: fieldValue) {
            let parts = member.split(separator: ";").map { $0.trimmingASCIIWhitespace() }
            guard parts.first == Substring(proxyName) || parts.first == "\"\(proxyName)\"" else { continue }
            for parameter in parts.dropFirst() {
                let pair = parameter.split(separator: "=", maxSplits: 1)
                if pair.count == 2, pair[0] == "error" {
                    return ProxyErrorType(rawValue: String(pair[1]))
                }
            }
        }
        return nil
    }

    /// The list members of a structured field (RFC 8941 §3.1), trimmed, commas inside
    /// sf-strings kept; empty members dropped.
    package static func members(of field: String) -> [Substring] {
        var members: [Substring] = []
        var inString = false
        var escaped = false
        var start = field.startIndex
        for index in field.indices {
            let character = field[index]
            if escaped {
                escaped = false
            } else if inString, character == "\\" {
                escaped = true
            } else if character == "\"" {
                inString.toggle()
            } else if character == ",", !inString {
                members.append(field[start..<index])
                start = field.index(after: index)
            }
        }
        members.append(field[start...])
        return members.map { $0.trimmingASCIIWhitespace() }.filter { !$0.isEmpty }
    }

    /// `fieldValue` without the members whose proxy identifier is `name` (bare or quoted).
    package static func removingMembers(named name: String, from fieldValue: String) -> String {
        members(of: fieldValue).filter { member in
            let identifier = member.prefix { $0 != ";" }.trimmingASCIIWhitespace()
            return identifier != Substring(name) && identifier != Substring("\"\(name)\"")
        }.joined(separator: ", ")
    }

    private static func sfStringEscaped(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\\": out += "\\\\"
            case "\"": out += "\\\""
            case " "..."~": out.unicodeScalars.append(scalar)
            default: out += "?"
            }
        }
        return out
    }
}

extension Substring {
    package func trimmingASCIIWhitespace() -> Substring {
        var slice = self
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return slice
    }
}
