import NIOHTTP1

/// The header rules of a forwarding proxy: hop-by-hop fields stay on their hop, `Via` records
/// the broker, and `Authbroker-*` steering fields never leave the broker.
///
/// RFC 9110 §7.6.1: a proxy removes `Connection` and every field it names, plus the fields that
/// are hop-by-hop by definition; §7.6.3: it appends itself to `Via`. RFC 9112 §3.2.2: with an
/// absolute-form target the proxy sets `Host` from the target, whatever the client sent.
package enum ProxyHeaders {
    /// The broker's `Via` entry (RFC 9110 §7.6.3): protocol version and a pseudonym, no host name.
    package static let via: String = "1.1 authbrokerd"

    /// Name prefix of the request fields that steer the broker per request.
    package static let directivePrefix = "authbroker-"

    /// Fields a request never carries past this hop. `Transfer-Encoding` is here because the
    /// broker frames the upstream body itself; `TE` and `Trailer` because it forwards no trailers.
    static let hopByHopRequestFields: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade",
    ]

    /// Fields a response never carries past this hop.
    static let hopByHopResponseFields: Set<String> = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "trailer",
        "transfer-encoding", "upgrade",
    ]

    /// Fields that naming in `Connection` does not remove.
    ///
    /// - Warning: `Connection: content-length` would otherwise strip the length the body is framed
    ///   by, a known request-smuggling lever; `Host` is always set by the broker anyway.
    static let protectedFields: Set<String> = ["content-length", "host"]

    /// Headers to send upstream.
    ///
    /// Drops `Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
    /// `Proxy-Authorization` (credentials for this hop), `TE`, `Trailer`, `Transfer-Encoding`
    /// (the broker re-frames), `Upgrade`, and every `Authbroker-*` field. `Host` becomes
    /// `origin.hostHeader` and goes first (RFC 9110 §7.2); `Via` gains the broker's entry. All other
    /// fields, `Content-Length` and `Expect` included, keep their order and values.
    package static func upstreamRequestHeaders(_ headers: HTTPHeaders, origin: CanonicalOrigin) -> HTTPHeaders {
        // Per request: look in both sets rather than build their union.
        let named = connectionOptions(headers)
        let drop = { (lower: String) in hopByHopRequestFields.contains(lower) || named.contains(lower) }
        var result = HTTPHeaders()
        result.reserveCapacity(headers.count + 1)
        result.add(name: "Host", value: origin.hostHeader)
        var via: [String] = []
        for (name, value) in headers {
            let lower = name.lowercased()
            if lower == "host" || lower.hasPrefix(directivePrefix) || drop(lower) { continue }
            if lower == "via" {
                via.append(value)
                continue
            }
            result.add(name: name, value: value)
        }
        result.add(name: "Via", value: Self.viaValue(appendingTo: via))
        return result
    }

    /// Headers to send the client.
    ///
    /// Drops `Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
    /// `Proxy-Authenticate` (the upstream's challenge to a proxy, which is not the client),
    /// `Trailer`, `Transfer-Encoding` (the broker re-frames) and `Upgrade`; `Via` gains the broker's
    /// entry. Everything else keeps its order.
    package static func clientResponseHeaders(_ headers: HTTPHeaders) -> HTTPHeaders {
        let named = connectionOptions(headers)
        let drop = { (lower: String) in hopByHopResponseFields.contains(lower) || named.contains(lower) }
        var result = HTTPHeaders()
        result.reserveCapacity(headers.count + 1)
        var via: [String] = []
        for (name, value) in headers {
            let lower = name.lowercased()
            if drop(lower) { continue }
            if lower == "via" {
                via.append(value)
                continue
            }
            result.add(name: name, value: value)
        }
        result.add(name: "Via", value: Self.viaValue(appendingTo: via))
        return result
    }

    private static func viaValue(appendingTo earlier: [String]) -> String {
        earlier.isEmpty ? Self.via : (earlier + [Self.via]).joined(separator: ", ")
    }

    /// The `Authbroker-*` fields the client sent, in order, names lower-cased.
    package static func brokerDirectives(_ headers: HTTPHeaders) -> [(name: String, value: String)] {
        headers.compactMap { name, value in
            let lower = name.lowercased()
            return lower.hasPrefix(directivePrefix) ? (name: lower, value: value) : nil
        }
    }

    /// The field names listed in every `Connection` field (RFC 9110 §7.6.1), lower-cased, minus
    /// the protected ones.
    static func connectionOptions(_ headers: HTTPHeaders) -> Set<String> {
        var names = Set<String>()
        guard headers.contains(name: "connection") else { return names }
        for value in headers[canonicalForm: "connection"] {
            let token = trimOWS(value).lowercased()
            if !token.isEmpty, !protectedFields.contains(token) { names.insert(token) }
        }
        return names
    }

    /// Strips OWS (space and horizontal tab, RFC 9110 §5.6.3) from both ends.
    private static func trimOWS(_ value: Substring) -> Substring {
        var slice = value
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return slice
    }
}
