/// One value of the TOML subset the broker reads.
///
/// TOML 1.0 (https://toml.io/en/v1.0.0) without dates, inline tables, nested arrays or
/// multi-line strings: the configuration needs none of them, and every feature left out is a
/// feature a hostile or mistaken file cannot reach.
package enum TOMLValue: Sendable, Equatable {
    case string(String)
    case integer(Int)
    case float(Double)
    case boolean(Bool)
    /// Elements are scalars; the parser rejects nested arrays.
    case array([TOMLValue])

    /// "a string", "an integer", ...: the type as an error message names it.
    package var typeName: String {
        switch self {
        case .string: "a string"
        case .integer: "an integer"
        case .float: "a float"
        case .boolean: "a boolean"
        case .array: "an array"
        }
    }

    /// The type and a short rendering of the value, for "got ..." in error messages:
    /// `a string ("ten")`. Long values are cut so one bad line cannot flood the log.
    package var messageDescription: String {
        "\(typeName) (\(shortRendering))"
    }

    private var shortRendering: String {
        switch self {
        case .string(let text): return "\"\(TOMLValue.escapedForMessage(text))\""
        case .integer(let value): return String(value)
        case .float(let value): return String(value)
        case .boolean(let value): return String(value)
        case .array(let elements):
            let shown = elements.prefix(3).map(\.shortRendering).joined(separator: ", ")
            return elements.count > 3 ? "[\(shown), …]" : "[\(shown)]"
        }
    }

    /// `text` with quotes, backslashes and control characters escaped and cut to 40 characters.
    package static func escapedForMessage(_ text: String) -> String {
        var out = ""
        var count = 0
        for scalar in text.unicodeScalars {
            if count == 40 {
                out += "…"
                break
            }
            count += 1
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    out += "\\u" + hex(scalar.value, width: 4)
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        return out
    }
}

/// The result of parsing: values by table, and where each came from.
///
/// Lines are kept beside the values so that a later check (a setting out of range, say) can
/// still point at the line to edit.
package struct TOMLDocument: Sendable, Equatable {
    /// Values keyed by table name, then key. Keys before the first `[table]` header are under
    /// `""`, which is always present (possibly empty).
    package var tables: [String: [String: TOMLValue]] = ["": [:]]
    /// The 1-based line of each key, keyed like `tables`.
    package var keyLines: [String: [String: Int]] = ["": [:]]
    /// The 1-based line of each `[table]` header (the root table has none).
    package var tableLines: [String: Int] = [:]
    /// `[[name]]` entries, in file order, by name.
    package var arrayTables: [String: [ArrayTableEntry]] = [:]

    /// One `[[name]]` entry: its values, the line of each key, and the line of its header.
    package struct ArrayTableEntry: Sendable, Equatable {
        package var values: [String: TOMLValue] = [:]
        package var keyLines: [String: Int] = [:]
        package var headerLine: Int

        package init(headerLine: Int) {
            self.headerLine = headerLine
        }
    }

    package init() {}

    /// The line `key` was set on in `table`, if it was set.
    package func line(of key: String, in table: String) -> Int? {
        keyLines[table]?[key]
    }
}

/// Why a text is not in the TOML subset, and on which line.
package struct TOMLError: Error, Sendable, Equatable, CustomStringConvertible {
    package enum Code: String, Sendable, Equatable {
        case inputTooLarge
        case arrayTooLong
        case invalidCharacter
        case unterminatedString
        case unterminatedArray
        case invalidEscape
        case invalidNumber
        case numberOutOfRange
        case invalidValue
        case missingKey
        case missingEquals
        case missingValue
        case invalidTableHeader
        case unexpectedText
        case duplicateKey
        case duplicateTable
        /// Valid TOML that the subset leaves out (dates, inline tables, dotted keys, ...).
        case unsupported
    }

    package var code: Code
    /// 1-based line of the problem.
    package var line: Int
    /// What is wrong and what to write instead.
    package var message: String

    package init(_ code: Code, line: Int, message: String) {
        self.code = code
        self.line = line
        self.message = message
    }

    package var description: String { "line \(line): \(message)" }
}

/// A total parser for the TOML subset the broker's configuration uses.
///
/// Accepted: comments, blank lines, `[table]` and `[[array-of-tables]]` headers with bare names, `key = value` with bare
/// keys, and values that are basic strings (TOML 1.0 §String escapes), literal strings,
/// decimal integers, floats (including `inf` and `nan`), booleans, and arrays of those that may
/// span lines, hold comments and end with a comma. Everything else is a `TOMLError` naming the
/// line; nothing traps, and the work done is linear in the input, which is bounded first.
package enum TOMLSubset {
    /// The largest input accepted, checked before anything else (a configuration file is a few
    /// kilobytes; a larger one is a mistake such as pointing at the wrong file).
    package static let maxInputBytes = 1 << 20
    /// The most elements one array may hold, checked as each element arrives.
    package static let maxArrayElements = 4096

    /// Parses `text`, or throws the first problem found, by line.
    package static func parse(
        _ text: String,
        maxInputBytes: Int = TOMLSubset.maxInputBytes,
        maxArrayElements: Int = TOMLSubset.maxArrayElements
    ) throws(TOMLError) -> TOMLDocument {
        let size = text.utf8.count
        guard size <= maxInputBytes else {
            throw TOMLError(
                .inputTooLarge, line: 1,
                message: "the file is \(size) bytes, more than the \(maxInputBytes) allowed; check that this is the right file"
            )
        }
        var parser = Parser(bytes: Array(text.utf8), maxArrayElements: maxArrayElements)
        try parser.parseDocument()
        return parser.document
    }
}

// MARK: - The parser

private enum ASCII {
    static let tab: UInt8 = 0x09
    static let newline: UInt8 = 0x0A
    static let carriageReturn: UInt8 = 0x0D
    static let space: UInt8 = 0x20
    static let quote: UInt8 = 0x22
    static let hash: UInt8 = 0x23
    static let apostrophe: UInt8 = 0x27
    static let plus: UInt8 = 0x2B
    static let comma: UInt8 = 0x2C
    static let minus: UInt8 = 0x2D
    static let dot: UInt8 = 0x2E
    static let zero: UInt8 = 0x30
    static let nine: UInt8 = 0x39
    static let colon: UInt8 = 0x3A
    static let equals: UInt8 = 0x3D
    static let leftBracket: UInt8 = 0x5B
    static let backslash: UInt8 = 0x5C
    static let rightBracket: UInt8 = 0x5D
    static let underscore: UInt8 = 0x5F
    static let leftBrace: UInt8 = 0x7B
    static let delete: UInt8 = 0x7F

    static func isDigit(_ byte: UInt8) -> Bool { byte >= zero && byte <= nine }
    static func isLetter(_ byte: UInt8) -> Bool { (byte | 0x20) >= 0x61 && (byte | 0x20) <= 0x7A }
    /// TOML control characters: U+0000–U+001F and U+007F.
    static func isControl(_ byte: UInt8) -> Bool { byte < 0x20 || byte == delete }
    /// Bare keys are `A-Za-z0-9_-` (TOML 1.0 §Keys).
    static func isBareKey(_ byte: UInt8) -> Bool {
        isLetter(byte) || isDigit(byte) || byte == underscore || byte == minus
    }
    /// Characters that can make up an unquoted value (numbers, booleans, and the dates and bare
    /// words we reject with a precise message).
    static func isToken(_ byte: UInt8) -> Bool {
        isBareKey(byte) || byte == plus || byte == dot || byte == colon
    }
    static func hexValue(_ byte: UInt8) -> UInt32? {
        switch byte {
        case zero...nine: UInt32(byte - zero)
        case 0x41...0x46: UInt32(byte - 0x41 + 10)
        case 0x61...0x66: UInt32(byte - 0x61 + 10)
        default: nil
        }
    }
}

private func hex(_ value: UInt32, width: Int) -> String {
    let digits = String(value, radix: 16, uppercase: true)
    return String(repeating: "0", count: max(0, width - digits.count)) + digits
}

private struct Parser {
    let bytes: [UInt8]
    let maxArrayElements: Int
    var index = 0
    var line = 1
    var document = TOMLDocument()
    var currentTable = ""
    /// Set while keys go into the last `[[name]]` entry of this name.
    var currentArrayTable: String?

    init(bytes: [UInt8], maxArrayElements: Int) {
        self.bytes = bytes
        self.maxArrayElements = maxArrayElements
    }

    var peek: UInt8? { index < bytes.count ? bytes[index] : nil }

    func peek(ahead offset: Int) -> UInt8? {
        index + offset < bytes.count ? bytes[index + offset] : nil
    }

    func failure(_ code: TOMLError.Code, _ message: String) -> TOMLError {
        TOMLError(code, line: line, message: message)
    }

    /// The character at `position` as a message shows it: `'x'`, `'é' (U+00E9)`, `U+0000`,
    /// `a line break`, `the end of the file`.
    func describe(at position: Int) -> String {
        guard position < bytes.count else { return "the end of the file" }
        let byte = bytes[position]
        if byte == ASCII.newline || byte == ASCII.carriageReturn { return "a line break" }
        if byte == ASCII.tab { return "a tab" }
        if ASCII.isControl(byte) { return "the control character U+\(hex(UInt32(byte), width: 4))" }
        if byte < 0x80 { return "'\(Character(Unicode.Scalar(byte)))'" }
        var iterator = bytes[position...].makeIterator()
        var decoder = UTF8()
        if case .scalarValue(let scalar) = decoder.decode(&iterator) {
            return "'\(Character(scalar))' (U+\(hex(scalar.value, width: 4)))"
        }
        return "the byte 0x\(hex(UInt32(byte), width: 2))"
    }

    // MARK: Lines

    mutating func parseDocument() throws(TOMLError) {
        // A UTF-8 byte order mark is harmless; some editors write one.
        if bytes.starts(with: [0xEF, 0xBB, 0xBF]) { index = 3 }
        while true {
            skipSpaces()
            guard let byte = peek else { return }
            switch byte {
            case ASCII.newline, ASCII.carriageReturn:
                try consumeNewline()
            case ASCII.hash:
                try skipComment()
            case ASCII.leftBracket:
                try parseTableHeader()
                try expectEndOfLine(after: "the table header")
            default:
                try parseKeyValue()
                try expectEndOfLine(after: "the value")
            }
        }
    }

    mutating func skipSpaces() {
        while let byte = peek, byte == ASCII.space || byte == ASCII.tab { index += 1 }
    }

    /// Consumes LF or CRLF; a lone CR is not a line ending in TOML.
    mutating func consumeNewline() throws(TOMLError) {
        if peek == ASCII.carriageReturn {
            guard peek(ahead: 1) == ASCII.newline else {
                throw failure(.invalidCharacter, "a carriage return must be followed by a line feed; save the file with Unix (LF) or Windows (CRLF) line endings")
            }
            index += 1
        }
        index += 1
        line += 1
    }

    /// Skips from `#` to the end of the line; TOML forbids control characters other than tab
    /// in comments.
    mutating func skipComment() throws(TOMLError) {
        index += 1
        while let byte = peek, byte != ASCII.newline {
            if byte == ASCII.carriageReturn, peek(ahead: 1) == ASCII.newline { return }
            if ASCII.isControl(byte), byte != ASCII.tab {
                throw failure(.invalidCharacter, "\(describe(at: index)) is not allowed in a comment; remove it")
            }
            index += 1
        }
    }

    mutating func expectEndOfLine(after what: String) throws(TOMLError) {
        skipSpaces()
        if peek == ASCII.hash { try skipComment() }
        guard let byte = peek, byte != ASCII.newline, byte != ASCII.carriageReturn else { return }
        throw failure(
            .unexpectedText,
            "unexpected \(describe(at: index)) after \(what); put each setting on a line of its own and start comments with #"
        )
    }

    mutating func readBareKey() -> String {
        let start = index
        while let byte = peek, ASCII.isBareKey(byte) { index += 1 }
        return String(decoding: bytes[start..<index], as: UTF8.self)
    }

    mutating func parseTableHeader() throws(TOMLError) {
        let headerLine = line
        index += 1
        let isArray = peek == ASCII.leftBracket
        if isArray { index += 1 }
        skipSpaces()
        if peek == ASCII.quote || peek == ASCII.apostrophe {
            throw failure(.unsupported, "quoted table names are not supported; table names are bare words like [daemon]")
        }
        let name = readBareKey()
        if name.isEmpty {
            if peek == ASCII.rightBracket {
                throw failure(.invalidTableHeader, "the table header [] has no name; name the table, like [daemon]")
            }
            throw failure(
                .invalidTableHeader,
                "a table name cannot start with \(describe(at: index)); table names are bare words like [daemon]"
            )
        }
        skipSpaces()
        if peek == ASCII.dot {
            throw failure(.unsupported, "dotted table names ([\(name).…]) are not supported; use a single bare name like [daemon]")
        }
        guard peek == ASCII.rightBracket, !isArray || peek(ahead: 1) == ASCII.rightBracket else {
            let close = isArray ? "]]" : "]"
            throw failure(.invalidTableHeader, "expected '\(close)' to close the table header \(isArray ? "[[" : "[")\(name), found \(describe(at: index))")
        }
        index += isArray ? 2 : 1
        if isArray {
            if let previous = document.tableLines[name] {
                throw failure(.duplicateTable, "[[\(name)]] names the table [\(name)] of line \(previous); use one form or the other")
            }
            document.arrayTables[name, default: []].append(TOMLDocument.ArrayTableEntry(headerLine: headerLine))
            currentArrayTable = name
            return
        }
        if let previous = document.tableLines[name] {
            throw failure(.duplicateTable, "the table [\(name)] is already defined on line \(previous); merge the two into one")
        }
        if let first = document.arrayTables[name]?.first {
            throw failure(.duplicateTable, "[\(name)] names the array of tables [[\(name)]] of line \(first.headerLine); use one form or the other")
        }
        document.tableLines[name] = headerLine
        document.tables[name] = [:]
        document.keyLines[name] = [:]
        currentTable = name
        currentArrayTable = nil
    }

    mutating func parseKeyValue() throws(TOMLError) {
        let keyLine = line
        if peek == ASCII.quote || peek == ASCII.apostrophe {
            throw failure(.unsupported, "quoted keys are not supported; keys are bare words like log_level")
        }
        if peek == ASCII.equals {
            throw failure(.missingKey, "missing key before '='; write key = value")
        }
        let key = readBareKey()
        guard !key.isEmpty else {
            throw failure(
                .missingKey,
                "expected a key (letters, digits, '_' or '-') or a [table] header, found \(describe(at: index))"
            )
        }
        skipSpaces()
        if peek == ASCII.dot {
            throw failure(.unsupported, "dotted keys (\(key).… = ...) are not supported; put the key under a [\(key)] table header")
        }
        guard peek == ASCII.equals else {
            throw failure(.missingEquals, "expected '=' after the key '\(key)', found \(describe(at: index)); write \(key) = value")
        }
        index += 1
        skipSpaces()
        if let arrayTable = currentArrayTable, let entries = document.arrayTables[arrayTable], let entry = entries.last {
            if let previous = entry.keyLines[key] {
                throw failure(.duplicateKey, "the key '\(key)' is already set on line \(previous) in this [[\(arrayTable)]]; remove one of the two")
            }
            let value = try parseValue(inArrayOpenedOn: nil)
            let last = entries.count - 1
            document.arrayTables[arrayTable]?[last].values[key] = value
            document.arrayTables[arrayTable]?[last].keyLines[key] = keyLine
            return
        }
        if let previous = document.keyLines[currentTable]?[key] {
            let place = currentTable.isEmpty ? "" : " in [\(currentTable)]"
            throw failure(.duplicateKey, "the key '\(key)' is already set on line \(previous)\(place); remove one of the two")
        }
        let value = try parseValue(inArrayOpenedOn: nil)
        document.tables[currentTable, default: [:]][key] = value
        document.keyLines[currentTable, default: [:]][key] = keyLine
    }

    // MARK: Values

    mutating func parseValue(inArrayOpenedOn arrayLine: Int?) throws(TOMLError) -> TOMLValue {
        guard let byte = peek else {
            throw failure(.missingValue, "missing value after '='; write key = value")
        }
        switch byte {
        case ASCII.newline, ASCII.carriageReturn, ASCII.hash:
            throw failure(.missingValue, "missing value after '='; write key = value")
        case ASCII.quote:
            if peek(ahead: 1) == ASCII.quote, peek(ahead: 2) == ASCII.quote {
                throw failure(.unsupported, "multi-line strings (\"\"\") are not supported; write the string on one line, using \\n for line breaks")
            }
            return .string(try parseBasicString())
        case ASCII.apostrophe:
            if peek(ahead: 1) == ASCII.apostrophe, peek(ahead: 2) == ASCII.apostrophe {
                throw failure(.unsupported, "multi-line literal strings (''') are not supported; write the string on one line")
            }
            return .string(try parseLiteralString())
        case ASCII.leftBracket:
            if let arrayLine {
                throw failure(
                    .unsupported,
                    "nested arrays are not supported (or the array opened on line \(arrayLine) is missing its ']')"
                )
            }
            return try parseArray()
        case ASCII.leftBrace:
            throw failure(.unsupported, "inline tables ({ ... }) are not supported; use a [table] header")
        default:
            return try parseToken()
        }
    }

    mutating func parseBasicString() throws(TOMLError) -> String {
        index += 1
        var out: [UInt8] = []
        while true {
            guard let byte = peek else {
                throw failure(.unterminatedString, "unterminated string; end it with \" on the same line")
            }
            switch byte {
            case ASCII.quote:
                index += 1
                return String(decoding: out, as: UTF8.self)
            case ASCII.backslash:
                try parseEscape(into: &out)
            case ASCII.newline, ASCII.carriageReturn:
                throw failure(.unterminatedString, "unterminated string; end it with \" on the same line")
            default:
                if ASCII.isControl(byte), byte != ASCII.tab {
                    throw failure(
                        .invalidCharacter,
                        "\(describe(at: index)) is not allowed in a string; write it as an escape such as \\u\(hex(UInt32(byte), width: 4))"
                    )
                }
                out.append(byte)
                index += 1
            }
        }
    }

    /// TOML 1.0 §String: `\b \t \n \f \r \" \\ \uXXXX \UXXXXXXXX`, the last two naming a
    /// Unicode scalar value (so no surrogates).
    mutating func parseEscape(into out: inout [UInt8]) throws(TOMLError) {
        index += 1
        guard let letter = peek else {
            throw failure(.unterminatedString, "unterminated string; end it with \" on the same line")
        }
        index += 1
        switch letter {
        case 0x62: out.append(0x08)  // b
        case 0x74: out.append(ASCII.tab)  // t
        case 0x6E: out.append(ASCII.newline)  // n
        case 0x66: out.append(0x0C)  // f
        case 0x72: out.append(ASCII.carriageReturn)  // r
        case ASCII.quote: out.append(ASCII.quote)
        case ASCII.backslash: out.append(ASCII.backslash)
        case 0x75, 0x55:  // u, U
            let width = letter == 0x75 ? 4 : 8
            var value: UInt32 = 0
            for _ in 0..<width {
                guard let byte = peek, let digit = ASCII.hexValue(byte) else {
                    throw failure(
                        .invalidEscape,
                        "\\\(Character(Unicode.Scalar(letter))) must be followed by exactly \(width) hexadecimal digits"
                    )
                }
                value = value << 4 | digit
                index += 1
            }
            guard let scalar = Unicode.Scalar(value) else {
                throw failure(.invalidEscape, "the escape U+\(hex(value, width: 4)) is not a Unicode scalar value (surrogates and values above 10FFFF are not)")
            }
            UTF8.encode(scalar) { out.append($0) }
        default:
            throw failure(
                .invalidEscape,
                "unknown escape \\\(describe(at: index - 1)); use one of \\\" \\\\ \\n \\t \\r \\b \\f \\uXXXX \\UXXXXXXXX, or a 'literal string' for backslashes"
            )
        }
    }

    mutating func parseLiteralString() throws(TOMLError) -> String {
        index += 1
        let start = index
        while true {
            guard let byte = peek else {
                throw failure(.unterminatedString, "unterminated literal string; end it with ' on the same line")
            }
            if byte == ASCII.apostrophe { break }
            if byte == ASCII.newline || byte == ASCII.carriageReturn {
                throw failure(.unterminatedString, "unterminated literal string; end it with ' on the same line")
            }
            if ASCII.isControl(byte), byte != ASCII.tab {
                throw failure(
                    .invalidCharacter,
                    "\(describe(at: index)) is not allowed in a string; use a \"basic string\" with an escape such as \\u\(hex(UInt32(byte), width: 4))"
                )
            }
            index += 1
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        index += 1
        return text
    }

    mutating func parseArray() throws(TOMLError) -> TOMLValue {
        let openLine = line
        index += 1
        var elements: [TOMLValue] = []
        while true {
            try skipArrayTrivia(openLine: openLine)
            if peek == ASCII.rightBracket {
                index += 1
                return .array(elements)
            }
            if peek == ASCII.comma {
                throw failure(.invalidValue, "expected a value or ']' before ',' in the array opened on line \(openLine)")
            }
            let element = try parseValue(inArrayOpenedOn: openLine)
            guard elements.count < maxArrayElements else {
                throw failure(.arrayTooLong, "the array opened on line \(openLine) has more than \(maxArrayElements) elements; shorten it")
            }
            elements.append(element)
            try skipArrayTrivia(openLine: openLine)
            switch peek {
            case ASCII.comma:
                index += 1
            case ASCII.rightBracket:
                index += 1
                return .array(elements)
            default:
                let hint = line > openLine ? "; is its closing ']' missing?" : ""
                throw failure(
                    .unexpectedText,
                    "expected ',' or ']' in the array opened on line \(openLine), found \(describe(at: index))\(hint)"
                )
            }
        }
    }

    /// Whitespace, line breaks and comments between array elements; the end of the file here
    /// means the array was never closed.
    mutating func skipArrayTrivia(openLine: Int) throws(TOMLError) {
        while true {
            skipSpaces()
            guard let byte = peek else {
                throw failure(.unterminatedArray, "the array opened on line \(openLine) is not closed; add ']'")
            }
            switch byte {
            case ASCII.newline, ASCII.carriageReturn: try consumeNewline()
            case ASCII.hash: try skipComment()
            default: return
            }
        }
    }

    // MARK: Bare values: booleans and numbers

    mutating func parseToken() throws(TOMLError) -> TOMLValue {
        let start = index
        while let byte = peek, ASCII.isToken(byte) { index += 1 }
        guard index > start else {
            throw failure(.invalidValue, "a value cannot start with \(describe(at: index)); strings must be quoted, like \"...\"")
        }
        let token = Array(bytes[start..<index])
        let text = String(decoding: token, as: UTF8.self)
        let shown = TOMLValue.escapedForMessage(text)
        switch text {
        case "true": return .boolean(true)
        case "false": return .boolean(false)
        case "inf", "+inf": return .float(.infinity)
        case "-inf": return .float(-.infinity)
        case "nan", "+nan", "-nan": return .float(.nan)
        default: break
        }
        var unsigned = token[...]
        if let first = unsigned.first, first == ASCII.plus || first == ASCII.minus { unsigned = unsigned.dropFirst() }
        guard let first = unsigned.first, ASCII.isDigit(first) else {
            if unsigned.first == ASCII.dot {
                throw failure(.invalidNumber, "\(shown) is not a valid number: a float needs a digit before the '.', like 0.5")
            }
            throw failure(
                .invalidValue, "the value \(shown) is not valid: a string must be quoted (\"\(shown)\"), and a boolean is true or false, in lower case"
            )
        }
        if token.contains(ASCII.colon) || looksLikeDate(unsigned) {
            throw failure(.unsupported, "dates and times are not supported; write \(shown) as a quoted string")
        }
        if first == ASCII.zero, let second = unsigned.dropFirst().first, ASCII.isLetter(second),
            second | 0x20 == 0x78 || second | 0x20 == 0x6F || second | 0x20 == 0x62
        {
            throw failure(.unsupported, "hexadecimal, octal and binary integers (\(shown)) are not supported; write the number in decimal")
        }
        if token.contains(ASCII.dot) || token.contains(0x65) || token.contains(0x45) {
            return .float(try parseFloat(token, shown: shown))
        }
        return .integer(try parseInteger(token, shown: shown))
    }

    func looksLikeDate(_ unsigned: ArraySlice<UInt8>) -> Bool {
        let prefix = Array(unsigned.prefix(5))
        return prefix.count == 5 && prefix[0..<4].allSatisfy(ASCII.isDigit) && prefix[4] == ASCII.minus
    }

    /// Digits with `_` only between two digits (TOML 1.0 §Integer); nil when malformed.
    func digitsWithoutUnderscores(_ part: ArraySlice<UInt8>) -> [UInt8]? {
        guard let first = part.first, let last = part.last, ASCII.isDigit(first), ASCII.isDigit(last) else { return nil }
        var digits: [UInt8] = []
        var previousWasUnderscore = false
        for byte in part {
            if byte == ASCII.underscore {
                if previousWasUnderscore { return nil }
                previousWasUnderscore = true
            } else if ASCII.isDigit(byte) {
                previousWasUnderscore = false
                digits.append(byte)
            } else {
                return nil
            }
        }
        return digits
    }

    func parseInteger(_ token: [UInt8], shown: String) throws(TOMLError) -> Int {
        var body = token[...]
        var negative = false
        if let first = body.first, first == ASCII.plus || first == ASCII.minus {
            negative = first == ASCII.minus
            body = body.dropFirst()
        }
        guard let digits = digitsWithoutUnderscores(body) else {
            throw failure(.invalidNumber, "\(shown) is not a valid integer; write digits, optionally with '_' between them, like 10_000")
        }
        if digits.count > 1, digits[0] == ASCII.zero {
            throw failure(.invalidNumber, "leading zeros are not allowed in \(shown); remove them")
        }
        var value = 0
        for digit in digits {
            let (shifted, overflowMultiply) = value.multipliedReportingOverflow(by: 10)
            let (next, overflowAdd) =
                negative
                ? shifted.subtractingReportingOverflow(Int(digit - ASCII.zero))
                : shifted.addingReportingOverflow(Int(digit - ASCII.zero))
            if overflowMultiply || overflowAdd {
                throw failure(.numberOutOfRange, "the integer \(shown) is out of range; integers must lie between \(Int.min) and \(Int.max)")
            }
            value = next
        }
        return value
    }

    /// `[sign] dec-int ( exp / frac [exp] )` (TOML 1.0 §Float), checked here because
    /// `Double.init(_:)` accepts forms TOML does not (hex floats, `.5`, `1.`).
    func parseFloat(_ token: [UInt8], shown: String) throws(TOMLError) -> Double {
        let invalid = failure(.invalidNumber, "\(shown) is not a valid number; write it like 1.5, 1e3 or 2.5e-3")
        var rest = token[...]
        var literal: [UInt8] = []
        if let first = rest.first, first == ASCII.plus || first == ASCII.minus {
            literal.append(first)
            rest = rest.dropFirst()
        }
        let isExponent: (UInt8) -> Bool = { $0 == 0x65 || $0 == 0x45 }
        let integerEnd = rest.firstIndex { $0 == ASCII.dot || isExponent($0) } ?? rest.endIndex
        guard let integerDigits = digitsWithoutUnderscores(rest[rest.startIndex..<integerEnd]) else { throw invalid }
        if integerDigits.count > 1, integerDigits[0] == ASCII.zero {
            throw failure(.invalidNumber, "leading zeros are not allowed in \(shown); remove them")
        }
        literal += integerDigits
        rest = rest[integerEnd...]
        var sawFractionOrExponent = false
        if rest.first == ASCII.dot {
            rest = rest.dropFirst()
            let fractionEnd = rest.firstIndex(where: isExponent) ?? rest.endIndex
            guard let fraction = digitsWithoutUnderscores(rest[rest.startIndex..<fractionEnd]) else { throw invalid }
            literal.append(ASCII.dot)
            literal += fraction
            rest = rest[fractionEnd...]
            sawFractionOrExponent = true
        }
        if let first = rest.first, isExponent(first) {
            rest = rest.dropFirst()
            literal.append(0x65)
            if let sign = rest.first, sign == ASCII.plus || sign == ASCII.minus {
                literal.append(sign)
                rest = rest.dropFirst()
            }
            guard let exponent = digitsWithoutUnderscores(rest) else { throw invalid }
            literal += exponent
            rest = rest[rest.endIndex...]
            sawFractionOrExponent = true
        }
        guard rest.isEmpty, sawFractionOrExponent, let value = Double(String(decoding: literal, as: UTF8.self)) else {
            throw invalid
        }
        guard value.isFinite else {
            throw failure(.numberOutOfRange, "the number \(shown) is too large to represent; use a smaller one")
        }
        return value
    }
}
