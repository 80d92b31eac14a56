/// A pattern naming the hosts a trust anchor, pin or rule applies to.
///
/// Three forms: an exact DNS name (`example.com`), a wildcard over the subdomains of a name
/// (`*.example.com`, which matches `a.example.com` and `a.b.example.com` but not `example.com`
/// itself), or an IP literal (`192.0.2.1`, `::1` or `[::1]`). DNS names are lower-cased and
/// must be ASCII: internationalised names are written in their A-label (`xn--`) form, as in
/// certificates (RFC 5890 §2.3.2.1, RFC 6125 §6.4.2). IP literals compare by address, so
/// `::1` and `0:0::1` are the same pattern.
///
/// The parser is total: every input yields a pattern or a `HostPatternError` whose message says
/// what to write instead.
package struct HostPattern: Codable, Hashable, Sendable, CustomStringConvertible {
    private enum Kind: Hashable, Sendable {
        case exact(String)
        /// The name after `*.`; matches hosts with at least one more label.
        case wildcard(suffix: String)
        /// 4 or 16 bytes in network order.
        case ipAddress([UInt8])
    }

    private let kind: Kind

    /// Longest input looked at, checked before anything else (a DNS name is at most 253
    /// characters; the rest is room for brackets and a friendlier error).
    package static let maxInputLength = 300

    /// Parses a user-written host pattern.
    package init(parsing input: String) throws(HostPatternError) {
        guard input.utf8.count <= Self.maxInputLength else {
            throw HostPatternError(
                .tooLong,
                "The host pattern is \(input.utf8.count) bytes long; a host name has at most 253 characters. Give a single host name such as example.com."
            )
        }
        let text = Self.trimmingSpaces(input)
        guard !text.isEmpty else {
            throw HostPatternError(
                .empty,
                "The host pattern is empty. Give a host name (example.com), a wildcard (*.example.com) or an IP address (192.0.2.1)."
            )
        }
        guard text.unicodeScalars.allSatisfy(\.isASCII) else {
            throw HostPatternError(
                .notASCII,
                "'\(text)' contains non-ASCII characters. Use the punycode form of the name (the one starting with xn--, as shown in the server's certificate)."
            )
        }
        if text.contains("://") || text.contains("/") || text.contains("?") || text.contains("@") {
            throw HostPatternError(
                .url,
                "'\(text)' looks like a URL. Give a host name, not a URL: for https://example.com/path write example.com."
            )
        }
        if text.contains(where: { $0 == " " || $0 == "\t" }) {
            throw HostPatternError(
                .badLabel,
                "'\(text)' contains white space. Give one host name such as example.com; to name several hosts, give several patterns."
            )
        }

        // Bracketed IPv6, possibly with a port.
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else {
                throw HostPatternError(
                    .badIPAddress,
                    "'\(text)' has no closing ']'. Write an IPv6 address as ::1 or [::1]."
                )
            }
            let inner = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            if !rest.isEmpty {
                if rest.hasPrefix(":") {
                    throw HostPatternError(
                        .port,
                        "'\(text)' includes a port. Host patterns match any port: write [\(inner)] without ':\(rest.dropFirst())'."
                    )
                }
                throw HostPatternError(
                    .badIPAddress,
                    "'\(text)' has text after ']'. Write an IPv6 address as ::1 or [::1]."
                )
            }
            guard let bytes = Self.parseIPv6(inner) else {
                throw HostPatternError(
                    .badIPAddress,
                    "'\(inner)' is not a valid IPv6 address. Write it as, for example, 2001:db8::1."
                )
            }
            self.kind = .ipAddress(bytes)
            return
        }

        if text.contains(":") {
            if let bytes = Self.parseIPv6(text) {
                self.kind = .ipAddress(bytes)
                return
            }
            // One colon followed by digits: host:port.
            let parts = text.split(separator: ":", omittingEmptySubsequences: false)
            if parts.count == 2 {
                throw HostPatternError(
                    .port,
                    "'\(text)' includes a port. Host patterns match any port: write \(parts[0]) without ':\(parts[1])'."
                )
            }
            throw HostPatternError(
                .badIPAddress,
                "'\(text)' is not a valid IPv6 address or host name. Write an IPv6 address as, for example, 2001:db8::1."
            )
        }

        var name = text.lowercased()
        if name.hasSuffix(".") {
            // A fully qualified name's trailing dot names the same host.
            name.removeLast()
        }
        guard !name.isEmpty, !name.hasSuffix(".") else {
            throw HostPatternError(.badLabel, "'\(text)' is not a host name. Give a name such as example.com.")
        }

        if name == "*" {
            throw HostPatternError(
                .wildcardOnly,
                "'*' alone would match every host. To apply to every host, give no host pattern at all; otherwise write a wildcard over one domain, such as *.example.com."
            )
        }

        var labels = name.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        var isWildcard = false
        if labels.first == "*" {
            isWildcard = true
            labels.removeFirst()
        }
        if labels.contains(where: { $0.contains("*") }) {
            throw HostPatternError(
                .badWildcard,
                "In '\(text)' the '*' is not the whole leftmost label. A wildcard is written *.example.com and matches the names under example.com."
            )
        }

        // An all-numeric last label is an IPv4 address (no top-level domain is numeric, RFC 3696 §2).
        if let last = labels.last, !last.isEmpty, last.allSatisfy(\.isASCIIDigitCharacter) {
            if isWildcard {
                throw HostPatternError(
                    .badWildcard,
                    "'\(text)' puts a wildcard on an IP address. Wildcards apply to DNS names only; give each IP address on its own."
                )
            }
            guard let bytes = Self.parseIPv4(name) else {
                throw HostPatternError(
                    .badIPAddress,
                    "'\(text)' is not a valid IPv4 address. Write four decimal numbers 0–255 without leading zeros, such as 192.0.2.1."
                )
            }
            self.kind = .ipAddress(bytes)
            return
        }

        let suffix = labels.joined(separator: ".")
        guard suffix.utf8.count <= 253 else {
            throw HostPatternError(
                .tooLong,
                "'\(text)' is longer than the 253 characters a host name may have (RFC 1035 §2.3.4)."
            )
        }
        for label in labels {
            if let problem = Self.labelProblem(label) {
                throw HostPatternError(
                    .badLabel,
                    "'\(text)' is not a valid host name: \(problem). Labels hold letters, digits and inner hyphens, 1 to 63 characters each, as in example.com."
                )
            }
        }
        self.kind = isWildcard ? .wildcard(suffix: suffix) : .exact(suffix)
    }

    /// Whether `host` is one of the hosts this pattern names.
    ///
    /// `host` is expected canonical (lower-case, IPv6 without brackets); a trailing dot and
    /// brackets are tolerated anyway, since a false negative here would only deny trust.
    package func matches(_ host: String) -> Bool {
        var host = host.lowercased()
        if host.hasPrefix("["), host.hasSuffix("]"), host.count >= 2 {
            host = String(host.dropFirst().dropLast())
        }
        if host.hasSuffix(".") { host.removeLast() }
        switch self.kind {
        case .exact(let name):
            return host == name
        case .wildcard(let suffix):
            // At least one non-empty label before ".suffix".
            guard host.utf8.count > suffix.utf8.count + 1, host.hasSuffix("." + suffix) else { return false }
            return !host.hasPrefix(".")
        case .ipAddress(let bytes):
            return Self.ipAddressBytes(host) == bytes
        }
    }

    /// How narrowly the pattern names hosts, to choose between several that match one host: an
    /// exact name or address beats any wildcard, and a wildcard over a longer name beats a shorter one.
    package var specificity: Int {
        switch self.kind {
        case .exact, .ipAddress: Int.max
        case .wildcard(let suffix): suffix.split(separator: ".").count
        }
    }

    /// The canonical text: lower-case name, `*.` wildcard, or IP literal (IPv6 in RFC 5952 form, no brackets).
    package var description: String {
        switch self.kind {
        case .exact(let name): return name
        case .wildcard(let suffix): return "*." + suffix
        case .ipAddress(let bytes): return Self.ipAddressText(bytes) ?? "?"
        }
    }

    /// Whether the pattern is an IP literal.
    package var isIPAddress: Bool {
        if case .ipAddress = self.kind { return true }
        return false
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        do {
            try self.init(parsing: text)
        } catch {
            throw DecodingError.dataCorruptedError(in: container, debugDescription: error.message)
        }
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(self.description)
    }

    // MARK: - IP literals

    /// The 4 or 16 bytes of an IPv4 dotted quad or IPv6 literal (no brackets), or nil.
    ///
    /// Strict: IPv4 is four decimal parts 0–255 without leading zeros (so `010` is never read
    /// as octal); IPv6 follows RFC 4291 §2.2, including an embedded dotted quad and no zone id.
    package static func ipAddressBytes(_ text: String) -> [UInt8]? {
        if text.contains(":") { return parseIPv6(text) }
        return parseIPv4(text)
    }

    /// The text form of 4 or 16 address bytes: dotted quad, or RFC 5952 IPv6 (lower-case, longest
    /// run of two or more zero groups compressed, first run on ties).
    package static func ipAddressText(_ bytes: some Collection<UInt8>) -> String? {
        let bytes = Array(bytes)
        if bytes.count == 4 {
            return bytes.map(String.init).joined(separator: ".")
        }
        guard bytes.count == 16 else { return nil }
        if bytes[0..<10].allSatisfy({ $0 == 0 }), bytes[10] == 0xff, bytes[11] == 0xff {
            // IPv4-mapped: mixed notation (RFC 5952 §5).
            return "::ffff:" + bytes[12...].map(String.init).joined(separator: ".")
        }
        var groups: [UInt16] = []
        for i in stride(from: 0, to: 16, by: 2) {
            groups.append(UInt16(bytes[i]) << 8 | UInt16(bytes[i + 1]))
        }
        var bestStart = -1
        var bestLength = 0
        var index = 0
        while index < 8 {
            if groups[index] == 0 {
                var end = index
                while end < 8, groups[end] == 0 { end += 1 }
                if end - index > bestLength {
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
        guard bestLength >= 2 else { return hex(0..<8) }
        return hex(0..<bestStart) + "::" + hex((bestStart + bestLength)..<8)
    }

    private static func parseIPv4(_ text: String) -> [UInt8]? {
        let parts = text.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 4 else { return nil }
        var bytes: [UInt8] = []
        for part in parts {
            guard !part.isEmpty, part.count <= 3, part.allSatisfy(\.isASCIIDigitCharacter) else { return nil }
            guard part == "0" || !part.hasPrefix("0") else { return nil }
            guard let value = UInt8(part) else { return nil }
            bytes.append(value)
        }
        return bytes
    }

    private static func parseIPv6(_ text: String) -> [UInt8]? {
        guard !text.isEmpty, text.utf8.count <= 45 else { return nil }
        var text = Substring(text)
        var tail: [UInt8] = []
        // An embedded IPv4 address takes the last 32 bits.
        if let lastColon = text.lastIndex(of: ":"), text[lastColon...].contains(".") {
            guard let v4 = parseIPv4(String(text[text.index(after: lastColon)...])) else { return nil }
            tail = v4
            text = text[...lastColon]
            // Keep "::" intact when the dotted quad followed it; otherwise drop the separator.
            if text.hasSuffix("::") {
                // fine as is
            } else {
                text = text.dropLast()
            }
        }
        func groups(_ part: Substring) -> [UInt16]? {
            if part.isEmpty { return [] }
            var result: [UInt16] = []
            for field in part.split(separator: ":", omittingEmptySubsequences: false) {
                guard (1...4).contains(field.count), field.allSatisfy(\.isHexDigit), field.allSatisfy(\.isASCII),
                    let value = UInt16(field, radix: 16)
                else { return nil }
                result.append(value)
            }
            return result
        }
        let maxGroups = tail.isEmpty ? 8 : 6
        var all: [UInt16]
        if let range = text.firstRange(of: "::") {
            guard let head = groups(text[..<range.lowerBound]),
                let rest = groups(text[range.upperBound...]),
                !text[range.upperBound...].contains("::"),
                head.count + rest.count < maxGroups
            else { return nil }
            all = head + Array(repeating: 0, count: maxGroups - head.count - rest.count) + rest
        } else {
            guard let only = groups(text), only.count == maxGroups else { return nil }
            all = only
        }
        var bytes: [UInt8] = []
        for group in all {
            bytes.append(UInt8(group >> 8))
            bytes.append(UInt8(group & 0xff))
        }
        return bytes + tail
    }

    // MARK: - DNS labels

    /// What is wrong with one DNS label (RFC 1123 §2.1 host-name syntax), or nil.
    private static func labelProblem(_ label: String) -> String? {
        if label.isEmpty { return "it has an empty label (two dots in a row, or a leading dot)" }
        if label.utf8.count > 63 { return "the label '\(label.prefix(20))…' is longer than 63 characters" }
        if label.hasPrefix("-") || label.hasSuffix("-") { return "the label '\(label)' starts or ends with a hyphen" }
        if let bad = label.first(where: { !($0.isASCIILetterOrDigit || $0 == "-") }) {
            return "the character '\(bad)' is not allowed"
        }
        return nil
    }

    private static func trimmingSpaces(_ text: String) -> String {
        var slice = Substring(text)
        while let first = slice.first, first.isWhitespace { slice.removeFirst() }
        while let last = slice.last, last.isWhitespace { slice.removeLast() }
        return String(slice)
    }
}

/// Why a host pattern was refused, and what to write instead.
package struct HostPatternError: Error, CustomStringConvertible, Equatable {
    fileprivate enum Code: String {
        case empty
        case tooLong = "too_long"
        case notASCII = "not_ascii"
        case url
        case port
        case badLabel = "bad_label"
        case wildcardOnly = "wildcard_only"
        case badWildcard = "bad_wildcard"
        case badIPAddress = "bad_ip_address"
    }

    private let _code: Code
    /// A stable snake_case code for scripts and tests.
    package var code: String { self._code.rawValue }
    /// What happened and what to write instead.
    package let message: String

    fileprivate init(_ code: Code, _ message: String) {
        self._code = code
        self.message = message
    }

    package var description: String { self.message }

    /// Equal when the codes are equal: messages may be reworded.
    package static func == (lhs: HostPatternError, rhs: HostPatternError) -> Bool {
        lhs._code == rhs._code
    }
}

extension Character {
    fileprivate var isASCIIDigitCharacter: Bool { self.isASCII && self.isNumber }
    fileprivate var isASCIILetterOrDigit: Bool { self.isASCII && (self.isLetter || self.isNumber) }
}
