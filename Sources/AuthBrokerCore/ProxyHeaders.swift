import NIOHTTP1

/// Names of the headers the broker itself adds.
package enum BrokerHeaders {
    package static let requestID = "Authbroker-Request-Id"
    static let requestIDLowercased = requestID.lowercased()
    /// On the broker's own error responses only, with the error's code: the one mark that
    /// tells them from an origin's response (which may carry any `Proxy-Status` and problem
    /// body it likes). Every `Authbroker-*` field of an upstream response is removed, so only
    /// the daemon can set it.
    package static let error = "Authbroker-Error"
    /// On a response a `[[respond]]` rule made: which rule (`respond config.toml:12`).
    package static let rule = "Authbroker-Rule"
}

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
    static let hopByHopRequestFields = [
        "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
        "transfer-encoding", "upgrade",
    ]

    /// Fields a response never carries past this hop. `Transfer-Encoding` passes: its codings
    /// before `chunked` are the body's, and the client's framer (`OutboundBodyFraming`) redoes
    /// the `chunked`.
    static let hopByHopResponseFields = [
        "connection", "keep-alive", "proxy-connection", "proxy-authenticate", "trailer", "upgrade",
    ]

    /// Fields that naming in `Connection` does not remove.
    ///
    /// - Warning: `Connection: content-length` would otherwise strip the length the body is framed
    ///   by, a known request-smuggling lever; `Host` is always set by the broker anyway.
    static let protectedFields = ["content-length", "host"]

    /// Whether the field name `name` is `lowercased` up to ASCII case (RFC 9110 §5.1). Compared
    /// byte by byte: a lower-cased copy of every name of every message was a measurable part of
    /// the broker's work per request.
    package static func fieldName(_ name: some StringProtocol, is lowercased: String) -> Bool {
        guard name.utf8.count == lowercased.utf8.count else { return false }
        // Over the bytes in place where both have them (native and small strings do): iterating
        // two UTF-8 views in step cost more than the rest of the header rules together.
        let inPlace = name.utf8.withContiguousStorageIfAvailable { nameBytes in
            lowercased.utf8.withContiguousStorageIfAvailable { lowerBytes in
                for index in nameBytes.indices where asciiLowercased(nameBytes[index]) != lowerBytes[index] {
                    return false
                }
                return true
            }
        }
        if let inPlace = inPlace ?? nil { return inPlace }
        return zip(name.utf8, lowercased.utf8).allSatisfy { byte, lower in asciiLowercased(byte) == lower }
    }

    private static func fieldName(_ name: some StringProtocol, isIn lowercasedNames: [String]) -> Bool {
        lowercasedNames.contains { fieldName(name, is: $0) }
    }

    private static func asciiLowercased(_ byte: UInt8) -> UInt8 {
        byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z") ? byte | 0x20 : byte
    }

    /// Whether `name` starts with `Authbroker-`, in any case.
    package static func isDirective(_ name: String) -> Bool {
        var bytes = name.utf8.makeIterator()
        for lower in directivePrefix.utf8 {
            guard let byte = bytes.next(), asciiLowercased(byte) == lower else { return false }
        }
        return true
    }

    /// Headers to send upstream.
    ///
    /// Drops `Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
    /// `Proxy-Authorization` (credentials for this hop), `TE`, `Trailer`, `Transfer-Encoding`
    /// (the broker re-frames), `Upgrade`, and every `Authbroker-*` field. `Host` becomes
    /// `hostHeader` (the origin's `CanonicalOrigin.hostHeader`) and goes first (RFC 9110 §7.2); `Via` gains the broker's entry. All other
    /// fields, `Content-Length` and `Expect` included, keep their order and values.
    package static func upstreamRequestHeaders(_ headers: HTTPHeaders, hostHeader: String) -> HTTPHeaders {
        let named = connectionOptions(headers)
        // Collected as pairs and made into headers once: `HTTPHeaders.add` checks every name it
        // is given, and these names all passed the request decoder's checks already.
        var result: [(String, String)] = []
        result.reserveCapacity(headers.count + 2)
        result.append(("Host", hostHeader))
        var via: [String] = []
        for (name, value) in headers {
            if fieldName(name, is: "host") || isDirective(name) || fieldName(name, isIn: hopByHopRequestFields)
                || fieldName(name, isIn: named)
            {
                continue
            }
            if fieldName(name, is: "via") {
                via.append(value)
                continue
            }
            result.append((name, value))
        }
        result.append(("Via", Self.viaValue(appendingTo: via)))
        return HTTPHeaders(result)
    }

    /// Headers to send the client.
    ///
    /// Drops `Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
    /// `Proxy-Authenticate` (the upstream's challenge to a proxy, which is not the client),
    /// `Trailer` and `Upgrade`; `Via` gains the broker's
    /// entry. Everything else keeps its order, except an `Authbroker-Request-Id` of the origin's:
    /// the broker's own, `requestID` when given, comes last instead.
    package static func clientResponseHeaders(_ headers: HTTPHeaders, requestID: String?) -> HTTPHeaders {
        let named = connectionOptions(headers)
        // As in `upstreamRequestHeaders`: the names passed the response decoder's checks.
        var result: [(String, String)] = []
        result.reserveCapacity(headers.count + 2)
        var via: [String] = []
        for (name, value) in headers {
            // `Authbroker-*` from upstream would pass for the broker's own (its request id,
            // the error mark): they are the broker's to set.
            if fieldName(name, isIn: hopByHopResponseFields) || fieldName(name, isIn: named) || isDirective(name) {
                continue
            }
            if fieldName(name, is: "via") {
                via.append(value)
                continue
            }
            if fieldName(name, is: "proxy-status") || fieldName(name, is: "cache-status") {
                // Members naming this broker were not written by it (RFC 9209 §2, RFC 9211 §2:
                // each proxy or cache adds its own): an origin cannot claim a broker error or a
                // cache hit. The origin's or other proxies' members pass.
                let kept = ProxyStatusField.removingMembers(named: ProxyStatusField.proxyName, from: value)
                if !kept.isEmpty { result.append((name, kept)) }
                continue
            }
            result.append((name, value))
        }
        result.append(("Via", Self.viaValue(appendingTo: via)))
        if let requestID { result.append((BrokerHeaders.requestID, requestID)) }
        return HTTPHeaders(result)
    }

    /// Whether a message's body is chunked: its `Transfer-Encoding` list ends with `chunked`.
    package static func isChunked(_ headers: HTTPHeaders) -> Bool {
        ((try? TransferCodings(headers)) ?? nil)?.isChunked ?? false
    }

    private static func viaValue(appendingTo earlier: [String]) -> String {
        earlier.isEmpty ? Self.via : (earlier + [Self.via]).joined(separator: ", ")
    }

    /// The `Authbroker-*` fields the client sent, in order, names lower-cased.
    package static func brokerDirectives(_ headers: HTTPHeaders) -> [(name: String, value: String)] {
        headers.compactMap { name, value in isDirective(name) ? (name: name.lowercased(), value: value) : nil }
    }

    /// The field names listed in every `Connection` field (RFC 9110 §7.6.1), lower-cased, minus
    /// the protected ones and `keep-alive` (the usual one, dropped anyway).
    static func connectionOptions(_ headers: HTTPHeaders) -> [String] {
        var names: [String] = []
        // By hand rather than `headers[canonicalForm:]`, which builds an array of every token of
        // every field: this runs for every response, nearly all of them `Connection: keep-alive`.
        for (name, value) in headers where fieldName(name, is: "connection") {
            var start = value.utf8.startIndex
            while true {
                let end = value.utf8[start...].firstIndex(of: UInt8(ascii: ",")) ?? value.utf8.endIndex
                let token = trimOWS(value[start..<end])
                if !token.isEmpty, !fieldName(token, is: "keep-alive"), !fieldName(token, isIn: protectedFields) {
                    names.append(token.lowercased())
                }
                guard end < value.utf8.endIndex else { break }
                start = value.utf8.index(after: end)
            }
        }
        return names
    }

    /// Strips OWS (space and horizontal tab, RFC 9110 §5.6.3) from both ends.
    private static func trimOWS(_ value: Substring) -> Substring {
        let isOWS = { (byte: UInt8) in byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        guard let first = value.utf8.firstIndex(where: { !isOWS($0) }),
            let last = value.utf8.lastIndex(where: { !isOWS($0) })
        else { return value[value.endIndex...] }
        // After the last byte that is not OWS comes OWS or the end: a character boundary.
        return value[first..<value.utf8.index(after: last)]
    }
}
