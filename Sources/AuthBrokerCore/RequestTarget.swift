/// What a request line's target asks of the broker (RFC 9112 §3.2).
///
/// The form decides the plane: absolute-form is fetched upstream, origin-form under `/v1` is the
/// control API, and nothing else is served. Parsing is total: every string yields a target or
/// one `RequestTargetError` saying what to send instead.
package enum RequestTarget: Sendable, Equatable {
    /// Absolute-form (RFC 9112 §3.2.2): the data plane. `pathAndQuery` is `/` for an empty path
    /// (`/?x` for `http://host?x`) and otherwise the client's bytes unchanged, since a proxy must
    /// not rewrite the path (RFC 9110 §7.6).
    case absolute(origin: CanonicalOrigin, pathAndQuery: String)
    /// Origin-form under the control API: the path is exactly `/v1` or starts with `/v1/`.
    case control(path: String, query: String?)
    /// Authority-form for CONNECT (RFC 9112 §3.2.3): host lower-cased, IPv6 without brackets.
    /// The daemon answers 501; tunnels would hide the exchange the broker exists to inspect.
    case authority(host: String, port: Int)
    /// Asterisk-form for `OPTIONS *` (RFC 9112 §3.2.4).
    case asterisk

    /// Longest target accepted, checked before anything else is looked at. RFC 9112 §3
    /// recommends supporting at least 8000 octets.
    package static let maximumLength = 8192

    /// Parses a request target as it appears on the request line; `method` is case-sensitive (RFC 9110 §9.1).
    package static func parse(method: String, uri: String) -> Result<RequestTarget, RequestTargetError> {
        let utf8 = uri.utf8
        guard utf8.count <= maximumLength else { return .failure(.tooLong(utf8.count)) }
        let bytes = Array(utf8)[...]
        guard !bytes.isEmpty else { return .failure(.emptyTarget()) }
        if let index = bytes.firstIndex(where: { $0 <= 0x20 || $0 == 0x7F }) {
            return .failure(.invalidCharacter(bytes[index], at: index, in: bytes))
        }
        if bytes.contains(UInt8(ascii: "#")) { return .failure(.fragmentNotAllowed(HostSyntax.text(bytes))) }
        if method == "CONNECT" { return parseAuthorityForm(bytes) }
        if bytes.count == 1, bytes.first == UInt8(ascii: "*") {
            return method == "OPTIONS" ? .success(.asterisk) : .failure(.asteriskWithoutOptions(method))
        }
        if bytes.first == UInt8(ascii: "/") { return parseOriginForm(bytes) }
        return parseAbsoluteForm(bytes)
    }

    private static func parseAuthorityForm(_ bytes: ArraySlice<UInt8>) -> Result<RequestTarget, RequestTargetError> {
        if bytes.contains(UInt8(ascii: "@")) { return .failure(.userinfoNotAllowed()) }
        if bytes.contains(UInt8(ascii: "/")) || bytes.contains(UInt8(ascii: "?")) {
            return .failure(
                .invalidHost(HostSyntax.text(bytes), "CONNECT takes only `host:port` (RFC 9112 §3.2.3), e.g. `CONNECT example.com:443`")
            )
        }
        return HostSyntax.parseAuthority(bytes, requirePort: true).map { .authority(host: $0.host, port: $0.port ?? 0) }
    }

    private static func parseOriginForm(_ bytes: ArraySlice<UInt8>) -> Result<RequestTarget, RequestTargetError> {
        if bytes.count >= 2, bytes[bytes.startIndex + 1] == UInt8(ascii: "/") {
            return .failure(.notAbsolute(HostSyntax.text(bytes)))
        }
        if let index = bytes.firstIndex(where: { $0 >= 0x80 }) {
            return .failure(.invalidCharacter(bytes[index], at: index, in: bytes))
        }
        let question = bytes.firstIndex(of: UInt8(ascii: "?"))
        let path = String(decoding: bytes[..<(question ?? bytes.endIndex)], as: UTF8.self)
        let query = question.map { String(decoding: bytes[($0 + 1)...], as: UTF8.self) }
        guard path == "/v1" || path.hasPrefix("/v1/") else {
            return .failure(.notAbsolute(HostSyntax.text(bytes)))
        }
        return .success(.control(path: path, query: query))
    }

    /// The scheme and authority of an absolute-form target parsed before, exactly as the client
    /// wrote them (`http://Example.com:8080`), with the origin they name.
    package struct AbsolutePrefix: Sendable {
        let bytes: [UInt8]
        package let origin: CanonicalOrigin
        /// `origin.description`, kept: it is logged once per request.
        package let originDescription: String
        /// `origin.hostHeader`, kept: it goes upstream with every request.
        package let hostHeader: String
    }

    /// `parse(method:uri:)` for an absolute-form target, remembering its scheme and authority:
    /// a client sends its requests to one origin over and over, and with `known` from its
    /// previous request only the path and query of a target that starts the same are parsed.
    /// Any other target (or a `CONNECT`) is parsed in full. The target is the same either way.
    package static func parse(
        method: String, uri: String, reusing known: AbsolutePrefix?
    ) -> (Result<RequestTarget, RequestTargetError>, AbsolutePrefix?) {
        let utf8 = uri.utf8
        if let known, method != "CONNECT", utf8.count <= maximumLength, utf8.count > known.bytes.count {
            // Over the target's bytes in place (a copy into an array was two allocations per
            // request); a target without contiguous bytes takes the full parse below.
            let pathAndQuery = utf8.withContiguousStorageIfAvailable { bytes -> String? in
                guard bytes.starts(with: known.bytes) else { return nil }
                let rest = bytes[known.bytes.count...]
                guard rest.first == UInt8(ascii: "/") || rest.first == UInt8(ascii: "?"),
                    !rest.contains(where: { $0 <= 0x20 || $0 == 0x7F || $0 >= 0x80 || $0 == UInt8(ascii: "#") })
                else { return nil }
                return Self.pathAndQuery(rest)
            }
            if let pathAndQuery = pathAndQuery ?? nil {
                return (.success(.absolute(origin: known.origin, pathAndQuery: pathAndQuery)), known)
            }
        }
        let result = parse(method: method, uri: uri)
        guard case .success(.absolute(let origin, _)) = result, method != "CONNECT" else { return (result, nil) }
        // Scheme, "://" and authority end at the first "/" or "?" after the "//".
        let bytes = Array(utf8)
        guard let doubleSlash = bytes.firstIndex(of: UInt8(ascii: ":")).map({ $0 + 3 }), doubleSlash <= bytes.count else {
            return (result, nil)
        }
        let end = bytes[doubleSlash...].firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") }) ?? bytes.count
        let prefix = AbsolutePrefix(
            bytes: Array(bytes[..<end]), origin: origin, originDescription: origin.description, hostHeader: origin.hostHeader
        )
        return (result, prefix)
    }

    /// An absolute-form target's path and query from what follows its authority (checked).
    private static func pathAndQuery(_ rest: some Collection<UInt8>) -> String {
        if rest.isEmpty { return "/" }
        if rest.first == UInt8(ascii: "?") { return "/" + String(decoding: rest, as: UTF8.self) }
        return String(decoding: rest, as: UTF8.self)
    }

    private static func parseAbsoluteForm(_ bytes: ArraySlice<UInt8>) -> Result<RequestTarget, RequestTargetError> {
        // A host or `host:port` typed without a scheme (a person's slip, not a client's): no
        // colon at all, or a port's digits after the first one (`ftp:x` names a scheme).
        let colon = bytes.firstIndex(of: UInt8(ascii: ":"))
        if colon.map({ bytes.index(after: $0) < bytes.endIndex && HostSyntax.isDigit(bytes[bytes.index(after: $0)]) }) ?? true {
            return .failure(.noScheme(HostSyntax.text(bytes)))
        }
        // scheme = ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ) (RFC 3986 §3.1)
        guard let colon = bytes.firstIndex(of: UInt8(ascii: ":")),
            let first = bytes.first, HostSyntax.isAlpha(first),
            bytes[..<colon].allSatisfy({
                HostSyntax.isAlphaNumeric($0) || $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ".")
            })
        else {
            return .failure(.notAbsolute(HostSyntax.text(bytes)))
        }
        let schemeText = String(decoding: bytes[..<colon], as: UTF8.self).lowercased()
        guard let scheme = UpstreamScheme(rawValue: schemeText) else {
            return .failure(.unsupportedScheme(HostSyntax.text(schemeText)))
        }
        let afterColon = bytes[(colon + 1)...]
        guard afterColon.starts(with: [UInt8(ascii: "/"), UInt8(ascii: "/")]) else {
            return .failure(.missingHost(HostSyntax.text(bytes)))
        }
        let authorityStart = afterColon.startIndex + 2
        let authorityEnd =
            bytes[authorityStart...].firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") })
            ?? bytes.endIndex
        let authority = bytes[authorityStart..<authorityEnd]
        if authority.contains(UInt8(ascii: "@")) { return .failure(.userinfoNotAllowed()) }
        let hostAndPort: (host: String, port: Int?)
        switch HostSyntax.parseAuthority(authority, requirePort: false) {
        case .success(let value): hostAndPort = value
        case .failure(let error): return .failure(error)
        }
        let rest = bytes[authorityEnd...]
        if let index = rest.firstIndex(where: { $0 >= 0x80 }) {
            return .failure(.invalidCharacter(bytes[index], at: index, in: bytes))
        }
        let origin = CanonicalOrigin(
            validatedScheme: scheme, host: hostAndPort.host, port: hostAndPort.port ?? scheme.defaultPort)
        return .success(.absolute(origin: origin, pathAndQuery: pathAndQuery(rest)))
    }
}

/// Why a request target was refused, with what to send instead.
///
/// `code` is stable snake_case for scripts and for the problem+json `code`; equality compares the
/// code only, so messages can improve without breaking callers. Every message shows the input
/// with control and non-ASCII bytes escaped, so it is safe to log.
package struct RequestTargetError: Error, Equatable, CustomStringConvertible {
    package enum Code: String, CaseIterable {
        case emptyTarget = "empty_target"
        case notAbsolute = "not_absolute"
        case unsupportedScheme = "unsupported_scheme"
        case missingHost = "missing_host"
        case invalidHost = "invalid_host"
        case invalidPort = "invalid_port"
        case userinfoNotAllowed = "userinfo_not_allowed"
        case fragmentNotAllowed = "fragment_not_allowed"
        case invalidCharacter = "invalid_character"
        case tooLong = "too_long"
    }

    /// The code as a closed set, for callers that must handle each (the daemon maps each to a
    /// `BrokerErrorCode`).
    package private(set) var kind: Code
    package var message: String

    /// `empty_target`, `not_absolute`, `unsupported_scheme`, `missing_host`, `invalid_host`,
    /// `invalid_port`, `userinfo_not_allowed`, `fragment_not_allowed`, `invalid_character`, `too_long`.
    package var code: String { kind.rawValue }

    package var description: String { "\(code): \(message)" }

    private init(_ kind: Code, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package static func == (lhs: Self, rhs: Self) -> Bool { lhs.kind == rhs.kind }

    static func emptyTarget() -> Self {
        Self(.emptyTarget, "The request target is empty; send an absolute URL such as `GET https://host/path`.")
    }

    static func notAbsolute(_ shown: String) -> Self {
        Self(
            .notAbsolute,
            "The request target `\(shown)` is not an absolute URL. To fetch through the broker send e.g. `GET https://host/path`; the control API lives under /v1/..."
        )
    }

    static func noScheme(_ shown: String) -> Self {
        Self(
            .notAbsolute,
            "`\(shown)` is not an absolute URL: it names no scheme. Write it as `https://\(shown)` (or `http://\(shown)`)."
        )
    }

    static func asteriskWithoutOptions(_ method: String) -> Self {
        Self(
            .notAbsolute,
            "The target `*` is only valid with OPTIONS (RFC 9112 §3.2.4), not \(HostSyntax.text(method)); send e.g. `GET https://host/path`."
        )
    }

    static func unsupportedScheme(_ shown: String) -> Self {
        Self(.unsupportedScheme, "The scheme `\(shown)` is not supported; the broker fetches only http:// and https:// URLs.")
    }

    static func missingHost(_ shown: String) -> Self {
        Self(.missingHost, "The URL `\(shown)` names no host; write it as `https://host/path`.")
    }

    static func invalidHost(_ shown: String, _ reason: String) -> Self {
        Self(.invalidHost, "The host `\(shown)` is not valid: \(reason).")
    }

    static func invalidPort(_ shown: String, detail: String = "a port is a decimal number from 1 to 65535") -> Self {
        Self(.invalidPort, "The port `\(shown)` is not valid: \(detail).")
    }

    static func userinfoNotAllowed() -> Self {
        Self(
            .userinfoNotAllowed,
            "Credentials in URLs (`user:password@host`) are refused because they would end up in logs; remove them and store the credential with `authbrokerctl` instead."
        )
    }

    static func fragmentNotAllowed(_ shown: String) -> Self {
        Self(
            .fragmentNotAllowed,
            "The target `\(shown)` has a fragment (`#...`), which is never sent in a request (RFC 9110 §4.2.5); remove it."
        )
    }

    static func invalidCharacter(_ byte: UInt8, at index: Int, in bytes: ArraySlice<UInt8>) -> Self {
        Self(
            .invalidCharacter,
            "The target `\(HostSyntax.text(bytes))` has the byte \(HostSyntax.describe(byte: byte)) at offset \(index - bytes.startIndex), which cannot appear in a request target; percent-encode it (e.g. a space as %20)."
        )
    }

    static func tooLong(_ length: Int) -> Self {
        Self(
            .tooLong,
            "The request target is \(length) bytes long; the limit is \(RequestTarget.maximumLength). Move large data into the request body."
        )
    }
}
