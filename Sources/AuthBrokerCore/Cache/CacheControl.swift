/// The directives of Cache-Control (RFC 9111 §5.2), from all of a message's field lines.
///
/// A pure reading of the syntax: what the directives mean for storing and reusing a response is
/// the cache's decision. In particular a cache should take a name in `conflicting`, or
/// "malformed" in `unknown`, as a reason to treat the response as stale (RFC 9111 §4.2.1).
package struct CacheControl: Sendable, Equatable {
    /// A delta-seconds argument: its value (clamped to 2^31 as §1.2.2 says), or invalid (present
    /// without a valid value).
    package enum Seconds: Sendable, Equatable {
        case value(Int)
        case invalid
    }

    /// max-stale's argument (§5.2.1.2): none means any staleness is accepted.
    package enum MaxStale: Sendable, Equatable {
        case any
        case seconds(Int)
    }

    // Response directives
    package var maxAge: Seconds?
    /// s-maxage.
    package var sharedMaxAge: Seconds?
    /// Unqualified or qualified.
    package var noCache = false
    /// Lowercased field names of a qualified no-cache.
    package var noCacheFields: [String] = []
    package var noStore = false
    package var isPrivate = false
    /// Lowercased field names of a qualified private.
    package var privateFields: [String] = []
    package var isPublic = false
    package var mustRevalidate = false
    package var proxyRevalidate = false
    package var mustUnderstand = false
    package var noTransform = false
    /// RFC 8246.
    package var immutable = false
    /// RFC 5861.
    package var staleWhileRevalidate: Seconds?
    /// RFC 5861.
    package var staleIfError: Seconds?

    // Request directives
    /// max-stale with or without a value. An invalid value is taken as `.seconds(0)`: the safe
    /// reading (no staleness accepted), where `.any` would let a garbled request take anything.
    package var maxStale: MaxStale?
    package var minFresh: Seconds?
    package var onlyIfCached = false

    /// Directives this parser does not know, lowercased, kept for diagnostics; each once, in the
    /// order first seen. "malformed" stands for the elements that could not be read at all.
    package var unknown: [String] = []
    /// A directive that appeared more than once with different arguments (§4.2.1: the response
    /// should then be considered stale): its name. Each name once. Arguments are compared by
    /// what they mean: `max-age=60` and `max-age="060"` agree, as do `private="A, b"` and `private=" a,b"`.
    package var conflicting: [String] = []

    package init() {}

    /// Parses the field lines' values (each may hold a comma-separated list). Directive names are
    /// case-insensitive; arguments are token or quoted-string (quoted-pair unescaped);
    /// `max-age="60"` is accepted (§5.2: recipients should accept the quoted form). Empty list
    /// elements (", ,") are skipped (RFC 9110 §5.6.1). A malformed element (e.g. a name that is not
    /// a token, an unterminated quoted string) is skipped up to the next top-level comma and noted
    /// in `unknown` as "malformed". Total: never throws.
    ///
    /// The grammar is `token [ "=" ( token / quoted-string ) ]` with no whitespace around "=",
    /// so `max-age = 60` is malformed. When a directive repeats, its first occurrence counts.
    /// A directive defined without an argument (no-store, public...) is honoured even if one
    /// is given. no-cache and private also take the token form (`private=set-cookie`), a
    /// one-name list; an empty list (`no-cache=""`) reads as the unqualified directive.
    package init(fieldValues: some Sequence<String>) {
        var parser = Parser()
        for value in fieldValues {
            parser.parse(Array(value.utf8), into: &self)
        }
    }

    /// The greatest delta-seconds a cache need represent (§1.2.2): larger values, and ages
    /// whose sums grow past it, are taken as this.
    package static let maxDeltaSeconds = 2_147_483_648

    /// delta-seconds (§1.2.2): 1*DIGIT, a value above 2^31 taken as 2^31; anything else
    /// (none, empty, a sign, a fraction) is invalid.
    package static func deltaSeconds(parsing text: String) -> Seconds {
        Self.deltaSeconds(Optional(Array(text.utf8)))
    }

    fileprivate static func deltaSeconds(_ argument: [UInt8]?) -> Seconds {
        guard let argument, !argument.isEmpty else { return .invalid }
        let limit = Self.maxDeltaSeconds
        var value = 0
        for byte in argument {
            guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return .invalid }
            // Saturates before multiplying past the limit, so no digit string can overflow.
            value = value > limit / 10 ? limit : min(value * 10 + Int(byte - UInt8(ascii: "0")), limit)
        }
        return .value(value)
    }
}

extension CacheControl.Seconds {
    /// What duplicates are compared by.
    fileprivate var key: String {
        switch self {
        case .value(let seconds): String(seconds)
        case .invalid: "invalid"
        }
    }
}

/// The state of one parse across field lines: what each directive was first given, so a
/// repeat can be told apart from a conflict.
private struct Parser {
    /// Directive name to the first occurrence's argument as read (see `key`).
    var firstArguments: [String: String] = [:]
    var unknownSeen: Set<String> = []
    var conflictingSeen: Set<String> = []

    private static let comma = UInt8(ascii: ",")
    private static let quote = UInt8(ascii: "\"")
    private static let backslash = UInt8(ascii: "\\")

    mutating func parse(_ bytes: [UInt8], into result: inout CacheControl) {
        var position = 0
        while position < bytes.count {
            let byte = bytes[position]
            // OWS before an element, and empty elements (RFC 9110 §5.6.1).
            if byte == Self.comma || Self.isWhitespace(byte) {
                position += 1
                continue
            }
            if let element = Self.element(bytes, from: position) {
                apply(name: element.name, argument: element.argument, to: &result)
                position = element.end
            } else {
                note(unknown: "malformed", in: &result)
                position = Self.nextTopLevelComma(bytes, from: position)
            }
        }
    }

    private mutating func apply(name: String, argument: [UInt8]?, to result: inout CacheControl) {
        switch name {
        case "max-age":
            let seconds = CacheControl.deltaSeconds(argument)
            if isFirst(name, seconds.key, in: &result) { result.maxAge = seconds }
        case "s-maxage":
            let seconds = CacheControl.deltaSeconds(argument)
            if isFirst(name, seconds.key, in: &result) { result.sharedMaxAge = seconds }
        case "stale-while-revalidate":
            let seconds = CacheControl.deltaSeconds(argument)
            if isFirst(name, seconds.key, in: &result) { result.staleWhileRevalidate = seconds }
        case "stale-if-error":
            let seconds = CacheControl.deltaSeconds(argument)
            if isFirst(name, seconds.key, in: &result) { result.staleIfError = seconds }
        case "min-fresh":
            let seconds = CacheControl.deltaSeconds(argument)
            if isFirst(name, seconds.key, in: &result) { result.minFresh = seconds }
        case "max-stale":
            let maxStale: CacheControl.MaxStale
            switch (argument, CacheControl.deltaSeconds(argument)) {
            case (nil, _): maxStale = .any
            case (_, .value(let seconds)): maxStale = .seconds(seconds)
            // The safe reading, as the property's comment says.
            case (_, .invalid): maxStale = .seconds(0)
            }
            let key = if case .seconds(let seconds) = maxStale { String(seconds) } else { "any" }
            if isFirst(name, key, in: &result) { result.maxStale = maxStale }
        case "no-cache":
            let fields = Self.fieldNames(argument)
            if isFirst(name, fields.joined(separator: ","), in: &result) {
                result.noCache = true
                result.noCacheFields = fields
            }
        case "private":
            let fields = Self.fieldNames(argument)
            if isFirst(name, fields.joined(separator: ","), in: &result) {
                result.isPrivate = true
                result.privateFields = fields
            }
        default:
            // Directives without arguments, and unknown ones: compared by their raw argument.
            let key = argument.map { "=" + String(decoding: $0, as: UTF8.self) } ?? ""
            guard isFirst(name, key, in: &result) else { return }
            switch name {
            case "no-store": result.noStore = true
            case "public": result.isPublic = true
            case "must-revalidate": result.mustRevalidate = true
            case "proxy-revalidate": result.proxyRevalidate = true
            case "must-understand": result.mustUnderstand = true
            case "no-transform": result.noTransform = true
            case "immutable": result.immutable = true
            case "only-if-cached": result.onlyIfCached = true
            default: note(unknown: name, in: &result)
            }
        }
    }

    /// True for a directive's first occurrence; a later one with another key is a conflict.
    private mutating func isFirst(_ name: String, _ key: String, in result: inout CacheControl) -> Bool {
        guard let first = firstArguments[name] else {
            firstArguments[name] = key
            return true
        }
        if first != key, conflictingSeen.insert(name).inserted {
            result.conflicting.append(name)
        }
        return false
    }

    private mutating func note(unknown name: String, in result: inout CacheControl) {
        if unknownSeen.insert(name).inserted {
            result.unknown.append(name)
        }
    }

    /// One well-formed element at `start` (a tchar): its lowercased name, its argument
    /// (unescaped if quoted), and the position of the comma or end after it. nil when malformed.
    private static func element(_ bytes: [UInt8], from start: Int) -> (name: String, argument: [UInt8]?, end: Int)? {
        var position = start
        while position < bytes.count, HTTPSyntax.isTChar(bytes[position]) { position += 1 }
        guard position > start else { return nil }
        // Tokens are ASCII, so lowercasing byte-wise is exact.
        let name = String(decoding: bytes[start..<position].map(lowercased), as: UTF8.self)
        var argument: [UInt8]?
        if position < bytes.count, bytes[position] == UInt8(ascii: "=") {
            position += 1
            if position < bytes.count, bytes[position] == quote {
                guard let quoted = quotedString(bytes, from: position) else { return nil }
                argument = quoted.value
                position = quoted.end
            } else {
                // Possibly empty (`max-age=`): present, and invalid where a value is needed.
                let valueStart = position
                while position < bytes.count, HTTPSyntax.isTChar(bytes[position]) { position += 1 }
                argument = Array(bytes[valueStart..<position])
            }
        }
        while position < bytes.count, isWhitespace(bytes[position]) { position += 1 }
        guard position == bytes.count || bytes[position] == comma else { return nil }
        return (name, argument, position)
    }

    /// RFC 9110 §5.6.4: the unescaped content of the quoted-string whose opening quote is at
    /// `start`, and the position after its closing quote; nil if unterminated or holding a
    /// control character.
    private static func quotedString(_ bytes: [UInt8], from start: Int) -> (value: [UInt8], end: Int)? {
        var value: [UInt8] = []
        var position = start + 1
        while position < bytes.count {
            let byte = bytes[position]
            switch byte {
            case quote:
                return (value, position + 1)
            case backslash:
                // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
                guard position + 1 < bytes.count, isQuotableByte(bytes[position + 1]) else { return nil }
                value.append(bytes[position + 1])
                position += 2
            default:
                // qdtext: the same bytes less DQUOTE and "\", handled above.
                guard isQuotableByte(byte) else { return nil }
                value.append(byte)
                position += 1
            }
        }
        return nil
    }

    /// Where a malformed element ends: the next comma outside a quoted string, or the end.
    /// Quotes are followed loosely here (any byte inside, "\" escapes), only to find the comma.
    private static func nextTopLevelComma(_ bytes: [UInt8], from start: Int) -> Int {
        var inQuotes = false
        var escaped = false
        var position = start
        while position < bytes.count {
            let byte = bytes[position]
            if inQuotes {
                if escaped {
                    escaped = false
                } else if byte == backslash {
                    escaped = true
                } else if byte == quote {
                    inQuotes = false
                }
            } else if byte == quote {
                inQuotes = true
            } else if byte == comma {
                return position
            }
            position += 1
        }
        return position
    }

    /// no-cache's and private's list (§5.2.2.4, §5.2.2.7): names split on commas, trimmed,
    /// lowercased, empties dropped; none for no argument.
    private static func fieldNames(_ argument: [UInt8]?) -> [String] {
        guard let argument else { return [] }
        return argument.split(separator: comma).compactMap { part in
            let trimmed = part.drop(while: isWhitespace).reversed().drop(while: isWhitespace).reversed()
            return trimmed.isEmpty ? nil : String(decoding: trimmed.map(lowercased), as: UTF8.self)
        }
    }

    private static func isWhitespace(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t")
    }

    /// HTAB, SP, VCHAR, obs-text: what a quoted-string may hold.
    private static func isQuotableByte(_ byte: UInt8) -> Bool {
        byte == UInt8(ascii: "\t") || (byte >= 0x20 && byte != 0x7F)
    }

    private static func lowercased(_ byte: UInt8) -> UInt8 {
        (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte | 0x20 : byte
    }
}
