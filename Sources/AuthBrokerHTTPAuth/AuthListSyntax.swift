import AuthBrokerCore

/// The byte-level grammar shared by `WWW-Authenticate`, `Proxy-Authenticate` and
/// `Authentication-Info`: comma-separated lists of challenges and auth-params (RFC 9110 §5.6,
/// §11.2, §11.6.1).
///
/// Everything here works on UTF-8 bytes and is total: a malformed element is reported as such,
/// never trapped on, so a hostile server can at worst make the broker ignore its challenge.
enum AuthListSyntax {
    // MARK: Byte classes (RFC 9110 §5.6.2, §5.6.4, §11.2)

    /// The characters of a token68 before its trailing `=` padding.
    static func isToken68Char(_ b: UInt8) -> Bool {
        switch b {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
            UInt8(ascii: "~"), UInt8(ascii: "+"), UInt8(ascii: "/"):
            return true
        default:
            return false
        }
    }

    /// OWS: space and horizontal tab.
    static func isOWS(_ b: UInt8) -> Bool { b == UInt8(ascii: " ") || b == UInt8(ascii: "\t") }

    /// `qdtext`: what may appear unescaped between the quotes of a quoted-string. obs-text
    /// (0x80-0xFF) is accepted because real servers put UTF-8 in realms.
    static func isQDText(_ b: UInt8) -> Bool {
        b == UInt8(ascii: "\t") || b == UInt8(ascii: " ") || b == 0x21 || (0x23...0x5B).contains(b)
            || (0x5D...0x7E).contains(b) || b >= 0x80
    }

    /// What may follow a backslash in a quoted-pair: HTAB, SP, VCHAR, obs-text.
    static func isQuotedPairChar(_ b: UInt8) -> Bool {
        b == UInt8(ascii: "\t") || b == UInt8(ascii: " ") || (0x21...0x7E).contains(b) || b >= 0x80
    }

    static func isToken(_ bytes: some Collection<UInt8>) -> Bool {
        !bytes.isEmpty && bytes.allSatisfy(HTTPSyntax.isTChar)
    }

    /// `token68 = 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
    static func isToken68(_ bytes: ArraySlice<UInt8>) -> Bool {
        var end = bytes.endIndex
        while end > bytes.startIndex, bytes[end - 1] == UInt8(ascii: "=") { end -= 1 }
        let body = bytes[bytes.startIndex..<end]
        return !body.isEmpty && body.allSatisfy(isToken68Char)
    }

    // MARK: Lists

    /// Splits one field line at the commas outside quoted strings, each element trimmed of OWS.
    /// Empty elements are kept (as empty slices) so that callers can skip them, as RFC 9110
    /// §5.6.1.2 requires of a recipient.
    ///
    /// A quoted string that is still open at the end of the line ends with the line: the last
    /// element then fails to parse, and nothing after it on other lines is swallowed.
    static func splitList(_ bytes: ArraySlice<UInt8>) -> [ArraySlice<UInt8>] {
        var elements: [ArraySlice<UInt8>] = []
        var start = bytes.startIndex
        var index = bytes.startIndex
        var inQuotes = false
        while index < bytes.endIndex {
            let b = bytes[index]
            if inQuotes {
                if b == UInt8(ascii: "\\") {
                    index += 1  // skip the escaped byte, whatever it is
                } else if b == UInt8(ascii: "\"") {
                    inQuotes = false
                }
            } else if b == UInt8(ascii: "\"") {
                inQuotes = true
            } else if b == UInt8(ascii: ",") {
                elements.append(trimOWS(bytes[start..<index]))
                start = index + 1
            }
            index += 1
        }
        elements.append(trimOWS(bytes[start..<min(index, bytes.endIndex)]))
        return elements
    }

    static func trimOWS(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        var slice = bytes
        while let first = slice.first, isOWS(first) { slice = slice.dropFirst() }
        while let last = slice.last, isOWS(last) { slice = slice.dropLast() }
        return slice
    }

    // MARK: Elements

    /// What one list element turned out to be.
    enum Element: Equatable {
        /// `token BWS "=" BWS ( token / quoted-string )`, the value unquoted.
        case parameter(name: String, value: String)
        /// `auth-scheme [ 1*SP ( token68 / auth-param ) ]`: the start of a new challenge.
        case challenge(scheme: String, body: ChallengeBody)
        /// Nothing the grammar allows.
        case malformed
    }

    enum ChallengeBody: Equatable {
        case none
        case token68(String)
        case parameter(name: String, value: String)
        /// The scheme was readable but what follows it is not: the challenge is broken.
        case malformed
    }

    /// Classifies one non-empty, OWS-trimmed list element.
    static func classify(_ element: ArraySlice<UInt8>) -> Element {
        var index = element.startIndex
        while index < element.endIndex, HTTPSyntax.isTChar(element[index]) { index += 1 }
        guard index > element.startIndex else { return .malformed }
        let first = string(element[element.startIndex..<index])
        let afterToken = index
        while index < element.endIndex, isOWS(element[index]) { index += 1 }
        if index == element.endIndex {
            return .challenge(scheme: first, body: .none)
        }
        if element[index] == UInt8(ascii: "=") {
            // `token BWS "="`: a parameter of the current challenge.
            guard let value = parameterValue(element[(index + 1)...]) else { return .malformed }
            return .parameter(name: first, value: value)
        }
        guard index > afterToken else {
            // A token glued to something that is neither `=` nor white space (`a/b`, `x"y"`).
            return .malformed
        }
        let rest = element[index...]
        if isToken68(rest) {
            return .challenge(scheme: first, body: .token68(string(rest)))
        }
        if case .parameter(let name, let value) = classify(rest) {
            return .challenge(scheme: first, body: .parameter(name: name, value: value))
        }
        return .challenge(scheme: first, body: .malformed)
    }

    /// `BWS ( token / quoted-string )` filling the rest of the element; nil when it does not.
    private static func parameterValue(_ bytes: ArraySlice<UInt8>) -> String? {
        let value = trimOWS(bytes)
        guard let first = value.first else { return nil }
        if first == UInt8(ascii: "\"") {
            return unquote(value)
        }
        return isToken(value) ? string(value) : nil
    }

    /// The content of a quoted-string that spans all of `bytes`, escapes removed; nil when the
    /// bytes are not exactly one well-formed quoted-string.
    static func unquote(_ bytes: ArraySlice<UInt8>) -> String? {
        guard bytes.count >= 2, bytes.first == UInt8(ascii: "\"") else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count - 2)
        var index = bytes.startIndex + 1
        while index < bytes.endIndex {
            let b = bytes[index]
            if b == UInt8(ascii: "\"") {
                // The closing quote must be the last byte.
                return index == bytes.endIndex - 1 ? string(out[...]) : nil
            }
            if b == UInt8(ascii: "\\") {
                index += 1
                guard index < bytes.endIndex, isQuotedPairChar(bytes[index]) else { return nil }
                out.append(bytes[index])
            } else {
                guard isQDText(b) else { return nil }
                out.append(b)
            }
            index += 1
        }
        return nil  // unterminated
    }

    /// A value as a token when it is one, otherwise as a quoted-string; nil when no
    /// quoted-string can carry it (control characters other than HTAB, or DEL).
    static func tokenOrQuoted(_ value: String, forceQuotes: Bool = false) -> String? {
        if !forceQuotes, isToken(value.utf8) { return value }
        return quoted(value)
    }

    /// `value` as a quoted-string with `"` and `\` escaped; nil when it holds a byte no
    /// quoted-string may carry.
    static func quoted(_ value: String) -> String? {
        var out = "\""
        for scalar in value.unicodeScalars {
            switch scalar.value {
            case 0x22, 0x5C:
                out += "\\"
                out.unicodeScalars.append(scalar)
            case 0x09, 0x20...0x7E, 0x80...:
                out.unicodeScalars.append(scalar)
            default:
                return nil
            }
        }
        return out + "\""
    }

    static func string(_ bytes: ArraySlice<UInt8>) -> String {
        String(decoding: bytes, as: UTF8.self)
    }

    /// ASCII-only lower-casing, for tokens (scheme and parameter names are case-insensitive,
    /// RFC 9110 §11.1, §11.2), so that no locale or Unicode rule can make two names equal.
    static func lowercasedASCII(_ text: String) -> String {
        String(
            decoding: text.utf8.map { b in
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(b) ? b + 32 : b
            },
            as: UTF8.self
        )
    }
}
