/// One `auth-param` (RFC 9110 §11.2): a case-insensitive name and its unquoted value.
package struct AuthParameter: Sendable, Hashable, CustomStringConvertible {
    /// As the server wrote it; compare with `lowercasedName`.
    package var name: String
    /// Unquoted: escapes removed.
    package var value: String

    package init(name: String, value: String) {
        self.name = name
        self.value = value
    }

    package var lowercasedName: String { AuthListSyntax.lowercasedASCII(name) }

    package var description: String { "\(name)=\(AuthListSyntax.tokenOrQuoted(value) ?? "<unrepresentable>")" }
}

/// One challenge of a `WWW-Authenticate` or `Proxy-Authenticate` field (RFC 9110 §11.6.1, §11.7.1).
///
/// Either a `token68` or a list of parameters follows the scheme, never both (RFC 9110 §11.3).
/// The scheme and names keep the server's spelling so that a forwarded header looks like the
/// original; every comparison is case-insensitive.
package struct AuthChallenge: Sendable, Hashable, CustomStringConvertible {
    package var scheme: String
    package var token68: String?
    /// In the server's order; names are unique case-insensitively (the parser drops a challenge
    /// that repeats one, RFC 9110 §11.2).
    package var parameters: [AuthParameter]

    package init(scheme: String, token68: String? = nil, parameters: [AuthParameter] = []) {
        self.scheme = scheme
        self.token68 = token68
        self.parameters = parameters
    }

    /// Convenience for tests and callers building challenges by hand.
    package init(scheme: String, _ parameters: KeyValuePairs<String, String>) {
        self.init(scheme: scheme, parameters: parameters.map { AuthParameter(name: $0.key, value: $0.value) })
    }

    /// The scheme lower-cased (schemes are case-insensitive, RFC 9110 §11.1).
    package var lowercasedScheme: String { AuthListSyntax.lowercasedASCII(scheme) }

    /// The value of the parameter named `name`, compared case-insensitively.
    package subscript(parameter name: String) -> String? {
        let wanted = AuthListSyntax.lowercasedASCII(name)
        return parameters.first { $0.lowercasedName == wanted }?.value
    }

    /// The `realm` parameter (RFC 9110 §11.5), if any.
    package var realm: String? { self[parameter: "realm"] }

    package var description: String { serialized() ?? "<unrepresentable \(scheme) challenge>" }

    // MARK: - Limits

    /// Longest field line parsed; a longer line is ignored whole. Real challenges are well under
    /// 1 KiB; the limit bounds the work a hostile server can cause.
    package static let maxFieldLineBytes = 16 * 1024
    /// Bytes parsed across all field lines of one response; lines past this budget are ignored.
    package static let maxTotalBytes = 64 * 1024
    /// Challenges returned at most; the rest are ignored.
    package static let maxChallenges = 32
    /// Parameters one challenge may have; a challenge with more is dropped as malformed.
    package static let maxParametersPerChallenge = 32

    // MARK: - Parsing

    /// The usable challenges in the values of one response's `WWW-Authenticate` (or
    /// `Proxy-Authenticate`) field lines, in order.
    ///
    /// Total: broken input never traps and never throws. A malformed challenge (an unterminated
    /// quote, a stray `=`, a control character, a repeated parameter, a parameter after a
    /// token68, too many parameters) is dropped and the others are kept; a parameter before any
    /// scheme is ignored. Lines are combined as RFC 9110 §5.3 says (a parameter on a later line
    /// belongs to the last challenge of an earlier one), except that a quoted string never spans
    /// lines, so one broken line cannot swallow the next. Limits are checked before any parsing.
    package static func parse(fieldValues: some Sequence<String>) -> [AuthChallenge] {
        var builder = ChallengeListBuilder()
        var budget = maxTotalBytes
        for line in fieldValues {
            let count = line.utf8.count
            guard count <= maxFieldLineBytes, count <= budget else {
                // An ignored line may have held parameters of the current challenge: end it here
                // so that what follows cannot attach to it.
                builder.endCurrent()
                if count > budget { break }
                continue
            }
            budget -= count
            builder.add(line: Array(line.utf8))
            if builder.isFull { break }
        }
        return builder.finish()
    }

    /// The challenges in one field value.
    package static func parse(fieldValue: String) -> [AuthChallenge] {
        parse(fieldValues: CollectionOfOne(fieldValue))
    }

    // MARK: - Serialising

    /// The challenge as field-value text, ready to forward in a filtered header; nil when the
    /// scheme, a name or a value cannot be written (a control character, an invalid token68).
    ///
    /// `realm`, `domain`, `nonce`, `opaque` and `qop` are always quoted and `algorithm` and
    /// `stale` never are, because RFC 7616 §3.3 requires it and older clients rely on it; other
    /// values are quoted only when they are not tokens.
    package func serialized() -> String? {
        guard AuthListSyntax.isToken(scheme.utf8) else { return nil }
        if let token68 {
            guard AuthListSyntax.isToken68(Array(token68.utf8)[...]) else { return nil }
            return scheme + " " + token68
        }
        if parameters.isEmpty { return scheme }
        var parts: [String] = []
        for parameter in parameters {
            guard AuthListSyntax.isToken(parameter.name.utf8) else { return nil }
            let lower = parameter.lowercasedName
            let value: String?
            if Self.alwaysQuoted.contains(lower) {
                value = AuthListSyntax.quoted(parameter.value)
            } else if Self.neverQuoted.contains(lower), AuthListSyntax.isToken(parameter.value.utf8) {
                value = parameter.value
            } else {
                value = AuthListSyntax.tokenOrQuoted(parameter.value)
            }
            guard let value else { return nil }
            parts.append(parameter.name + "=" + value)
        }
        return scheme + " " + parts.joined(separator: ", ")
    }

    private static let alwaysQuoted: Set<String> = ["realm", "domain", "nonce", "opaque", "qop"]
    private static let neverQuoted: Set<String> = ["algorithm", "stale"]
}

/// Assembles challenges from list elements; see `AuthChallenge.parse(fieldValues:)`.
private struct ChallengeListBuilder {
    private struct Partial {
        var scheme: String
        var token68: String?
        var parameters: [AuthParameter] = []
        var names: Set<String> = []
        var malformed = false

        mutating func add(name: String, value: String) {
            guard token68 == nil else {
                // RFC 9110 §11.3: token68 or parameters, not both.
                malformed = true
                return
            }
            let lower = AuthListSyntax.lowercasedASCII(name)
            guard !names.contains(lower) else {
                // RFC 9110 §11.2: each parameter name only once per challenge.
                malformed = true
                return
            }
            guard parameters.count < AuthChallenge.maxParametersPerChallenge else {
                malformed = true
                return
            }
            names.insert(lower)
            parameters.append(AuthParameter(name: name, value: value))
        }
    }

    private var current: Partial?
    private var result: [AuthChallenge] = []

    var isFull: Bool { result.count >= AuthChallenge.maxChallenges }

    mutating func add(line: [UInt8]) {
        for element in AuthListSyntax.splitList(line[...]) where !element.isEmpty {
            if isFull { return }
            switch AuthListSyntax.classify(element) {
            case .parameter(let name, let value):
                // A parameter before any scheme belongs to nothing: ignored.
                current?.add(name: name, value: value)
            case .challenge(let scheme, let body):
                endCurrent()
                var partial = Partial(scheme: scheme)
                switch body {
                case .none: break
                case .token68(let token): partial.token68 = token
                case .parameter(let name, let value): partial.add(name: name, value: value)
                case .malformed: partial.malformed = true
                }
                current = partial
            case .malformed:
                current?.malformed = true
            }
        }
    }

    mutating func endCurrent() {
        if let partial = current, !partial.malformed, !isFull {
            result.append(AuthChallenge(scheme: partial.scheme, token68: partial.token68, parameters: partial.parameters))
        }
        current = nil
    }

    mutating func finish() -> [AuthChallenge] {
        endCurrent()
        return result
    }
}
