/// The two schemes the data plane fetches.
package enum UpstreamScheme: String, Sendable, Hashable {
    case http, https

    /// The port a URL of this scheme means when it names none (RFC 9110 §4.2.1, §4.2.2).
    package var defaultPort: Int {
        switch self {
        case .http: 80
        case .https: 443
        }
    }
}

/// The one canonicalisation of an origin (DESIGN.md "Canonical requests"): scheme and host
/// lower-cased, IPv6 literal without brackets, default port made explicit in `port` but omitted
/// from `description`.
///
/// Pools, protection spaces and caches key on this value, so two spellings of one origin
/// (`HTTPS://Example.COM:443` and `https://example.com`) must give equal values (RFC 9110 §4.2.3).
/// IPv6 literals are rendered in the RFC 5952 form (`[0:0::1]` becomes `::1`) for the same reason.
package struct CanonicalOrigin: Hashable, Sendable, CustomStringConvertible {
    package var scheme: UpstreamScheme
    /// Lower-case; an IPv6 literal in RFC 5952 form, without brackets.
    package var host: String
    package var port: Int

    /// Whether `host` is an IP literal (IPv4 dotted quad or IPv6), which goes in no SNI extension
    /// (RFC 6066 §3) and is matched against iPAddress subject alternative names.
    package var isIPAddress: Bool {
        self.isIPv6 || HostSyntax.parseIPv4(Array(host.utf8)[...]) != nil
    }

    /// Only an IPv6 literal has a colon in `host`. (By byte: `String.contains` compares
    /// Characters, and the `Host` of every relayed request asks.)
    private var isIPv6: Bool { host.utf8.contains(UInt8(ascii: ":")) }

    /// The `Host` header value for this origin (RFC 9110 §7.2): the port only when it is not the default.
    package var hostHeader: String {
        let name = self.isIPv6 ? "[\(host)]" : host
        return port == scheme.defaultPort ? name : "\(name):\(port)"
    }

    /// `host:port` with the port always written, IPv6 in brackets: a CONNECT request-target
    /// (authority-form, RFC 9112 §3.2.3) and a `next-hop` in `Proxy-Status`.
    package var authorityForm: String {
        Self.authorityForm(host: self.host, port: self.port)
    }

    /// `host:port` as `authorityForm` writes it, for a host and port that are no origin of their
    /// own (a `connect_to` address).
    package static func authorityForm(host: String, port: Int) -> String {
        (host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]" : host) + ":\(port)"
    }

    /// `https://host`, `https://host:8443`, `http://[::1]:8080`.
    package var description: String { "\(scheme.rawValue)://\(hostHeader)" }

    /// Validates and canonicalises an origin given in parts.
    ///
    /// `host` may be a DNS name, an IPv4 dotted quad, or an IPv6 literal with or without brackets;
    /// `port` nil means the scheme's default.
    package init(scheme: UpstreamScheme, host: String, port: Int?) throws(RequestTargetError) {
        var bytes = Array(host.utf8)[...]
        guard !bytes.isEmpty else { throw .missingHost(HostSyntax.text(host)) }
        let parsed: String
        if bytes.first == UInt8(ascii: "["), bytes.last == UInt8(ascii: "]"), bytes.count >= 2 {
            bytes = bytes.dropFirst().dropLast()
            parsed = try HostSyntax.parseIPv6Literal(bytes).get()
        } else if bytes.contains(UInt8(ascii: ":")) {
            parsed = try HostSyntax.parseIPv6Literal(bytes).get()
        } else {
            parsed = try HostSyntax.parseNameOrIPv4(bytes).get()
        }
        let resolvedPort = port ?? scheme.defaultPort
        guard (1...65535).contains(resolvedPort) else { throw .invalidPort(String(resolvedPort)) }
        self.init(validatedScheme: scheme, host: parsed, port: resolvedPort)
    }

    /// Parses an absolute `http(s)` URL and keeps only its origin; the path, if any, is ignored.
    ///
    /// Used by the control API (`inspect`) and the CLI, so that a URL a user pastes names the same
    /// origin the data plane would fetch from.
    package init(parsing url: String) throws(RequestTargetError) {
        switch RequestTarget.parse(method: "GET", uri: url) {
        case .success(.absolute(let origin, _)):
            self = origin
        case .success:
            throw .notAbsolute(HostSyntax.text(url))
        case .failure(let error):
            throw error
        }
    }

    /// For parts already validated by `HostSyntax`.
    init(validatedScheme scheme: UpstreamScheme, host: String, port: Int) {
        self.scheme = scheme
        self.host = host
        self.port = port
    }
}

/// Host and port syntax (RFC 3986 §3.2.2, §3.2.3), strict where a lenient reading could make two
/// parties see different hosts.
///
/// Refused on purpose: percent-encoded hosts, non-ASCII names (use punycode), unbracketed IPv6,
/// IPv6 zone ids and IPvFuture, and numeric names that resolvers read as IPv4 in odd ways
/// (`127.1`, `0x7f.0.0.1`, `2130706433`, `010.0.0.1`): each would otherwise reach the resolver,
/// TLS and the pool under different names.
enum HostSyntax {
    static let maximumNameLength = 253
    static let maximumLabelLength = 63

    /// Splits `host[:port]` or `[v6][:port]`; an empty port (`host:`) means the default (RFC 3986 §3.2.3).
    static func parseAuthority(
        _ bytes: ArraySlice<UInt8>, requirePort: Bool
    ) -> Result<(host: String, port: Int?), RequestTargetError> {
        guard !bytes.isEmpty else { return .failure(.missingHost(text(bytes))) }
        let hostResult: Result<String, RequestTargetError>
        let portBytes: ArraySlice<UInt8>?
        if bytes.first == UInt8(ascii: "[") {
            guard let close = bytes.firstIndex(of: UInt8(ascii: "]")) else {
                return .failure(
                    .invalidHost(text(bytes), "the IPv6 literal has no closing `]`; write it as `[2001:db8::1]`")
                )
            }
            hostResult = parseIPv6Literal(bytes[(bytes.startIndex + 1)..<close])
            let rest = bytes[(close + 1)...]
            if rest.isEmpty {
                portBytes = nil
            } else if rest.first == UInt8(ascii: ":") {
                portBytes = rest.dropFirst()
            } else {
                return .failure(
                    .invalidHost(text(bytes), "only `:port` may follow the `]` of an IPv6 literal")
                )
            }
        } else {
            let colons = bytes.indices.filter { bytes[$0] == UInt8(ascii: ":") }
            guard colons.count <= 1 else {
                return .failure(
                    .invalidHost(
                        text(bytes), "an IPv6 address must be written in brackets, e.g. `http://[2001:db8::1]:8080/`")
                )
            }
            if let colon = colons.first {
                let name = bytes[..<colon]
                guard !name.isEmpty else { return .failure(.missingHost(text(bytes))) }
                hostResult = parseNameOrIPv4(name)
                portBytes = bytes[(colon + 1)...]
            } else {
                hostResult = parseNameOrIPv4(bytes)
                portBytes = nil
            }
        }
        let host: String
        switch hostResult {
        case .success(let value): host = value
        case .failure(let error): return .failure(error)
        }
        guard let portBytes, !portBytes.isEmpty else {
            if requirePort { return .failure(.invalidPort("", detail: "a port is required here, as in `host:443`")) }
            return .success((host, nil))
        }
        switch parsePort(portBytes) {
        case .success(let port): return .success((host, port))
        case .failure(let error): return .failure(error)
        }
    }

    /// A decimal port 1...65535: digits only (no sign, no spaces), at most five of them.
    static func parsePort(_ bytes: ArraySlice<UInt8>) -> Result<Int, RequestTargetError> {
        guard !bytes.isEmpty, bytes.count <= 5, bytes.allSatisfy(isDigit) else {
            return .failure(.invalidPort(text(bytes)))
        }
        let value = bytes.reduce(0) { $0 * 10 + Int($1 - UInt8(ascii: "0")) }
        guard (1...65535).contains(value) else { return .failure(.invalidPort(text(bytes))) }
        return .success(value)
    }

    /// A DNS name (letters, digits, `-`, `_`, dots between non-empty labels) or a strict IPv4 dotted quad.
    static func parseNameOrIPv4(_ bytes: ArraySlice<UInt8>) -> Result<String, RequestTargetError> {
        let shown = text(bytes)
        guard !bytes.isEmpty else { return .failure(.missingHost(shown)) }
        if bytes.contains(where: { $0 >= 0x80 }) {
            return .failure(
                .invalidHost(
                    shown,
                    "non-ASCII host names are not accepted; write the name in its punycode (`xn--`) form, e.g. as `idn2` prints it"
                )
            )
        }
        if bytes.contains(UInt8(ascii: "%")) {
            return .failure(.invalidHost(shown, "percent-encoded host names are not accepted; write the name plainly"))
        }
        if let bad = bytes.first(where: { !(isAlphaNumeric($0) || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_")) }) {
            return .failure(
                .invalidHost(shown, "the character \(describe(byte: bad)) cannot appear in a host name")
            )
        }
        guard bytes.count <= maximumNameLength else {
            return .failure(.invalidHost(shown, "a host name is at most \(maximumNameLength) characters"))
        }
        let labels = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        if labels.contains(where: \.isEmpty) {
            return .failure(
                .invalidHost(shown, "the host name has an empty label (a leading, trailing or doubled dot); remove it")
            )
        }
        if labels.contains(where: { $0.count > maximumLabelLength }) {
            return .failure(.invalidHost(shown, "each dot-separated label is at most \(maximumLabelLength) characters"))
        }
        // WHATWG URL's "ends in a number" rule: such a name is an IPv4 address to resolvers,
        // so only the one unambiguous spelling is accepted.
        if let last = labels.last, last.allSatisfy(isDigit) || isHexNumberLabel(last) {
            guard parseIPv4(bytes) != nil else {
                return .failure(
                    .invalidHost(
                        shown,
                        "a numeric host must be an IPv4 address written as four decimal numbers 0-255 without leading zeros, e.g. `192.0.2.1`"
                    )
                )
            }
        }
        return .success(String(decoding: bytes, as: UTF8.self).lowercased())
    }

    /// A strict dotted quad: four decimal octets 0-255, no leading zeros (which some resolvers read as octal).
    static func parseIPv4(_ bytes: ArraySlice<UInt8>) -> [UInt8]? {
        let parts = bytes.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var octets: [UInt8] = []
        for part in parts {
            guard (1...3).contains(part.count), part.allSatisfy(isDigit) else { return nil }
            if part.count > 1, part.first == UInt8(ascii: "0") { return nil }
            let value = part.reduce(0) { $0 * 10 + Int($1 - UInt8(ascii: "0")) }
            guard value <= 255 else { return nil }
            octets.append(UInt8(value))
        }
        return octets
    }

    /// An IPv6 address (RFC 4291 §2.2) in its RFC 5952 text form; zone ids and IPvFuture refused.
    static func parseIPv6Literal(_ bytes: ArraySlice<UInt8>) -> Result<String, RequestTargetError> {
        let shown = text(bytes)
        if bytes.contains(UInt8(ascii: "%")) {
            return .failure(.invalidHost(shown, "IPv6 zone identifiers are not accepted; use a global or unique-local address"))
        }
        if let first = bytes.first, first == UInt8(ascii: "v") || first == UInt8(ascii: "V") {
            return .failure(.invalidHost(shown, "IPvFuture literals are not supported"))
        }
        guard let groups = parseIPv6(bytes) else {
            return .failure(.invalidHost(shown, "this is not a valid IPv6 address (RFC 4291 §2.2)"))
        }
        return .success(formatIPv6(groups))
    }

    static func parseIPv6(_ s: ArraySlice<UInt8>) -> [UInt16]? {
        let colon = UInt8(ascii: ":")
        var before: [UInt16] = []
        var after: [UInt16] = []
        var compressed = false
        var i = s.startIndex
        guard i < s.endIndex else { return nil }
        if s[i] == colon {
            guard s.index(after: i) < s.endIndex, s[s.index(after: i)] == colon else { return nil }
            compressed = true
            i += 2
        }
        while i < s.endIndex {
            let start = i
            while i < s.endIndex, isHexDigit(s[i]) { i += 1 }
            if i < s.endIndex, s[i] == UInt8(ascii: ".") {
                // An embedded IPv4 address ends the literal.
                guard let v4 = parseIPv4(s[start...]) else { return nil }
                let pair = [UInt16(v4[0]) << 8 | UInt16(v4[1]), UInt16(v4[2]) << 8 | UInt16(v4[3])]
                if compressed { after += pair } else { before += pair }
                i = s.endIndex
                break
            }
            guard (1...4).contains(i - start) else { return nil }
            let value = s[start..<i].reduce(UInt16(0)) { $0 << 4 | UInt16(hexValue($1)) }
            if compressed { after.append(value) } else { before.append(value) }
            if i == s.endIndex { break }
            guard s[i] == colon else { return nil }
            i += 1
            if i < s.endIndex, s[i] == colon {
                guard !compressed else { return nil }
                compressed = true
                i += 1
            } else if i == s.endIndex {
                return nil
            }
        }
        let count = before.count + after.count
        if compressed {
            // "::" stands for at least one group of zeros (RFC 4291 §2.2).
            guard count <= 7 else { return nil }
            return before + Array(repeating: 0, count: 8 - count) + after
        }
        return count == 8 ? before : nil
    }

    /// RFC 5952 §4: lower-case hex, no leading zeros, the longest run (first on ties) of two or
    /// more zero groups as `::`.
    static func formatIPv6(_ groups: [UInt16]) -> String {
        var bestStart = -1
        var bestLength = 0
        var index = 0
        while index < groups.count {
            if groups[index] == 0 {
                var end = index
                while end < groups.count, groups[end] == 0 { end += 1 }
                if end - index > bestLength, end - index >= 2 {
                    bestStart = index
                    bestLength = end - index
                }
                index = end
            } else {
                index += 1
            }
        }
        func hex(_ range: Range<Int>) -> String {
            groups[range].map { String($0, radix: 16) }.joined(separator: ":")
        }
        guard bestStart >= 0 else { return hex(0..<8) }
        return hex(0..<bestStart) + "::" + hex((bestStart + bestLength)..<8)
    }

    static func isIPLiteral(_ host: String) -> Bool {
        host.contains(":") || parseIPv4(Array(host.utf8)[...]) != nil
    }

    private static func isHexNumberLabel(_ label: ArraySlice<UInt8>) -> Bool {
        guard label.count >= 2, label.first == UInt8(ascii: "0") else { return false }
        let x = label[label.startIndex + 1]
        return (x == UInt8(ascii: "x") || x == UInt8(ascii: "X")) && label.dropFirst(2).allSatisfy(isHexDigit)
    }

    static func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }
    static func isAlpha(_ b: UInt8) -> Bool {
        (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z"))
    }
    static func isAlphaNumeric(_ b: UInt8) -> Bool { isAlpha(b) || isDigit(b) }
    static func isHexDigit(_ b: UInt8) -> Bool {
        isDigit(b) || (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "f")) || (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "F"))
    }
    private static func hexValue(_ b: UInt8) -> UInt8 {
        if isDigit(b) { return b - UInt8(ascii: "0") }
        if b >= UInt8(ascii: "a") { return b - UInt8(ascii: "a") + 10 }
        return b - UInt8(ascii: "A") + 10
    }

    /// A byte as a user can read it in a message: `'x'` for printable ASCII, `0xNN` otherwise.
    static func describe(byte: UInt8) -> String {
        (0x21..<0x7F).contains(byte) ? "'\(Character(Unicode.Scalar(byte)))'" : "0x" + hexByte(byte)
    }

    /// Input shown back in a message, safe for logs and terminals: printable ASCII kept, anything
    /// else as `\xNN`, cut at 100 bytes.
    static func text(_ bytes: ArraySlice<UInt8>) -> String {
        var out = ""
        for byte in bytes.prefix(100) {
            if (0x20..<0x7F).contains(byte), byte != UInt8(ascii: "\\") {
                out.unicodeScalars.append(Unicode.Scalar(byte))
            } else {
                out += "\\x" + hexByte(byte)
            }
        }
        return bytes.count > 100 ? out + "…" : out
    }

    static func text(_ string: String) -> String { text(Array(string.utf8)[...]) }

    private static func hexByte(_ byte: UInt8) -> String {
        let digits = Array("0123456789ABCDEF")
        return String([digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
    }
}

/// Where an upstream connection goes and who it says it is: connections are pooled per route, so
/// one that presented a client identity is never reused for a request that chose another (or none),
/// and one through the upstream proxy never for a request that goes direct (or the reverse).
package struct UpstreamRoute: Hashable, Sendable, CustomStringConvertible {
    package let origin: CanonicalOrigin
    /// The name of the client identity presented in the TLS handshake, if any.
    package let clientIdentity: String?
    /// The HTTP proxy the connection goes through (`[upstream] proxy`): `http` requests in
    /// absolute form, `https` through a CONNECT tunnel. nil: straight to the origin.
    package let proxy: CanonicalOrigin?
    /// The connection's TLS keys are logged (`[debug] tls_key_log_scope = "marked"` and a request
    /// with `Authbroker-Debug: keylog`): such requests get connections of their own, whose keys
    /// are logged, and never share them with the others.
    package let keyLogged: Bool
    /// The fields' hash, computed once: the pool looks a route up twice per request, and hashing
    /// its strings each time was a measurable part of that.
    private let fieldsHash: Int

    package init(_ origin: CanonicalOrigin, clientIdentity: String? = nil, proxy: CanonicalOrigin? = nil, keyLogged: Bool = false) {
        self.origin = origin
        self.clientIdentity = clientIdentity
        self.proxy = proxy
        self.keyLogged = keyLogged
        var hasher = Hasher()
        hasher.combine(origin)
        hasher.combine(clientIdentity)
        hasher.combine(proxy)
        hasher.combine(keyLogged)
        self.fieldsHash = hasher.finalize()
    }

    package static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.fieldsHash == rhs.fieldsHash && lhs.origin == rhs.origin && lhs.clientIdentity == rhs.clientIdentity
            && lhs.proxy == rhs.proxy && lhs.keyLogged == rhs.keyLogged
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(self.fieldsHash)
    }

    /// Where the TCP connection goes: the proxy, or the origin.
    package var firstHop: CanonicalOrigin { self.proxy ?? self.origin }

    package var description: String {
        var text = self.origin.description
        if let clientIdentity { text += " (as identity '\(clientIdentity)')" }
        if let proxy { text += " via proxy \(proxy.hostHeader)" }
        if keyLogged { text += " (TLS keys logged)" }
        return text
    }
}
