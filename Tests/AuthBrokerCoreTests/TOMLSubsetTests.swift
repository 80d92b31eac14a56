import Testing

@testable import AuthBrokerCore

@Suite("TOML subset parser")
struct TOMLSubsetTests {
    // MARK: Valid documents

    @Test func emptyInputHasAnEmptyRootTable() throws {
        let document = try TOMLSubset.parse("")
        #expect(document.tables == ["": [:]])
        #expect(document.tableLines.isEmpty)
    }

    @Test func tablesKeysAndLines() throws {
        let text = """
            # leading comment
            top = 1

            [daemon]   # trailing comment
            log_level = "debug"
              indented\t=\t'x'
            [ upstream ]
            flag = true
            """
        let document = try TOMLSubset.parse(text)
        #expect(
            document.tables == [
                "": ["top": .integer(1)],
                "daemon": ["log_level": .string("debug"), "indented": .string("x")],
                "upstream": ["flag": .boolean(true)],
            ]
        )
        #expect(document.line(of: "top", in: "") == 2)
        #expect(document.line(of: "log_level", in: "daemon") == 5)
        #expect(document.line(of: "indented", in: "daemon") == 6)
        #expect(document.line(of: "flag", in: "upstream") == 8)
        #expect(document.tableLines == ["daemon": 4, "upstream": 7])
    }

    @Test func crlfLineEndingsAndByteOrderMark() throws {
        let document = try TOMLSubset.parse("\u{FEFF}[a]\r\nx = 1 # c\r\ny = 2\r\n")
        #expect(document.tables["a"] == ["x": .integer(1), "y": .integer(2)])
        #expect(document.line(of: "y", in: "a") == 3)
    }

    @Test func emptyTableIsKept() throws {
        let document = try TOMLSubset.parse("[trust]\n")
        #expect(document.tables["trust"] == [:])
    }

    @Test(arguments: [
        ("0", 0), ("+0", 0), ("-0", 0), ("42", 42), ("+17", 17), ("-17", -17),
        ("1_000", 1000), ("1_2_3", 123), ("10_000", 10_000),
        ("9223372036854775807", Int.max), ("-9223372036854775808", Int.min),
    ])
    func integers(literal: String, expected: Int) throws {
        let document = try TOMLSubset.parse("x = \(literal)")
        #expect(document.tables[""]?["x"] == .integer(expected))
    }

    @Test(arguments: [
        ("1.5", 1.5), ("-0.25", -0.25), ("+3.0", 3.0), ("1e3", 1000), ("1E3", 1000), ("2.5e-3", 0.0025),
        ("6.626e-34", 6.626e-34), ("1_000.000_1", 1000.0001), ("0.0", 0), ("-inf", -Double.infinity), ("inf", .infinity),
        ("1e+2", 100), ("0e0", 0), ("1e0_1", 10),
    ])
    func floats(literal: String, expected: Double) throws {
        let document = try TOMLSubset.parse("x = \(literal)")
        #expect(document.tables[""]?["x"] == .float(expected))
    }

    @Test func nanIsAFloat() throws {
        let document = try TOMLSubset.parse("x = nan")
        guard case .float(let value) = document.tables[""]?["x"] else {
            Issue.record("nan did not parse as a float")
            return
        }
        #expect(value.isNaN)
    }

    @Test(arguments: [
        (#""plain""#, "plain"),
        (#""""#, ""),
        (#""q\"q""#, "q\"q"),
        (#""back\\slash""#, "back\\slash"),
        (#""a\nb\tc\rd""#, "a\nb\tc\rd"),
        (#""\b\f""#, "\u{08}\u{0C}"),
        (#""\u00e9\u20AC""#, "é€"),
        (#""\U0001F600""#, "😀"),
        ("\"tab\\tand\traw tab\"", "tab\tand\traw tab"),
        (#""ünïcödé""#, "ünïcödé"),
        (##""# not a comment""##, "# not a comment"),
        (#"'C:\no\escapes'"#, #"C:\no\escapes"#),
        (#"'say "hi"'"#, #"say "hi""#),
        ("''", ""),
    ])
    func strings(literal: String, expected: String) throws {
        let document = try TOMLSubset.parse("x = \(literal)")
        #expect(document.tables[""]?["x"] == .string(expected))
    }

    @Test func booleans() throws {
        let document = try TOMLSubset.parse("a = true\nb = false")
        #expect(document.tables[""] == ["a": .boolean(true), "b": .boolean(false)])
    }

    @Test func arraysSpanLinesWithCommentsAndTrailingComma() throws {
        let text = """
            [t]
            empty = []
            one = [1]
            mixed = [ "a", 'b', 3, 4.5, false ]
            long = [
              "x:1:127.0.0.1",  # first
              # a comment line
              "y:2:[::1]",
            ]
            after = 7
            """
        let document = try TOMLSubset.parse(text)
        let table = try #require(document.tables["t"])
        #expect(table["empty"] == .array([]))
        #expect(table["one"] == .array([.integer(1)]))
        #expect(table["mixed"] == .array([.string("a"), .string("b"), .integer(3), .float(4.5), .boolean(false)]))
        #expect(table["long"] == .array([.string("x:1:127.0.0.1"), .string("y:2:[::1]")]))
        #expect(document.line(of: "long", in: "t") == 5)
        #expect(document.line(of: "after", in: "t") == 10)
    }

    // MARK: Hostile and invalid input

    /// Each input must fail with this code on this line; none may trap.
    @Test(arguments: [
        // Strings
        ("x = \"unterminated", TOMLError.Code.unterminatedString, 1),
        ("x = 'unterminated", .unterminatedString, 1),
        ("x = \"line\nbreak\"", .unterminatedString, 1),
        ("a = 1\nx = 'line\nbreak'", .unterminatedString, 2),
        ("x = \"nul\u{0}\"", .invalidCharacter, 1),
        ("x = 'nul\u{0}'", .invalidCharacter, 1),
        ("x = \"bell\u{7}\"", .invalidCharacter, 1),
        ("x = \"del\u{7F}\"", .invalidCharacter, 1),
        ("x = \"\\q\"", .invalidEscape, 1),
        ("x = \"\\u12\"", .invalidEscape, 1),
        ("x = \"\\u12G4\"", .invalidEscape, 1),
        ("x = \"\\uD800\"", .invalidEscape, 1),
        ("x = \"\\U00110000\"", .invalidEscape, 1),
        ("x = \"\\", .unterminatedString, 1),
        ("x = \"\"\"multi\"\"\"", .unsupported, 1),
        ("x = '''multi'''", .unsupported, 1),
        // Numbers
        ("x = 9223372036854775808", .numberOutOfRange, 1),
        ("x = -9223372036854775809", .numberOutOfRange, 1),
        ("x = 99999999999999999999999999999999999999", .numberOutOfRange, 1),
        ("x = 1e400", .numberOutOfRange, 1),
        ("x = 007", .invalidNumber, 1),
        ("x = -01", .invalidNumber, 1),
        ("x = 01.5", .invalidNumber, 1),
        ("x = 1__0", .invalidNumber, 1),
        ("x = _1", .invalidValue, 1),
        ("x = 1_", .invalidNumber, 1),
        ("x = 1.", .invalidNumber, 1),
        ("x = .5", .invalidNumber, 1),
        ("x = 1.e5", .invalidNumber, 1),
        ("x = 1e", .invalidNumber, 1),
        ("x = 1.5.5", .invalidNumber, 1),
        ("x = 12abc", .invalidNumber, 1),
        ("x = ++1", .invalidValue, 1),
        ("x = 0x1F", .unsupported, 1),
        ("x = 0o17", .unsupported, 1),
        ("x = 0b101", .unsupported, 1),
        ("x = 1979-05-27", .unsupported, 1),
        ("x = 07:32:00", .unsupported, 1),
        // Bare words, missing pieces
        ("x = info", .invalidValue, 1),
        ("x = True", .invalidValue, 1),
        ("x = /tmp/file", .invalidValue, 1),
        ("x = ", .missingValue, 1),
        ("x =", .missingValue, 1),
        ("x = # comment", .missingValue, 1),
        ("x = \n1", .missingValue, 1),
        ("=", .missingKey, 1),
        ("= 1", .missingKey, 1),
        ("x", .missingEquals, 1),
        ("x 1", .missingEquals, 1),
        ("x : 1", .missingEquals, 1),
        ("x = 1 2", .unexpectedText, 1),
        ("x = \"a\" \"b\"", .unexpectedText, 1),
        ("x = 1 ; comment", .unexpectedText, 1),
        ("\"quoted\" = 1", .unsupported, 1),
        ("a.b = 1", .unsupported, 1),
        ("x = { a = 1 }", .unsupported, 1),
        ("é = 1", .missingKey, 1),
        ("\u{0}", .missingKey, 1),
        ("x = 1\u{0}", .unexpectedText, 1),
        ("# comment with nul \u{0}", .invalidCharacter, 1),
        ("x = 1\rz = 2", .invalidCharacter, 1),
        // Tables
        ("[", .invalidTableHeader, 1),
        ("[]", .invalidTableHeader, 1),
        ("[daemon", .invalidTableHeader, 1),
        ("[daemon\n]", .invalidTableHeader, 1),
        ("[a.b]", .unsupported, 1),
        ("[[a]", .invalidTableHeader, 1),
        ("[[a] ]", .invalidTableHeader, 1),
        ("[[]]", .invalidTableHeader, 1),
        ("[[a.b]]", .unsupported, 1),
        ("[a]\n[[a]]", .duplicateTable, 2),
        ("[[a]]\n[a]", .duplicateTable, 2),
        ("[[a]]\nx = 1\nx = 2", .duplicateKey, 3),
        ("[\"a\"]", .unsupported, 1),
        ("[a] x = 1", .unexpectedText, 1),
        ("[a]\n[b]\n[a]", .duplicateTable, 3),
        ("[ok]\n]", .missingKey, 2),
        // Keys
        ("x = 1\nx = 2", .duplicateKey, 2),
        ("[t]\nx = 1\n\n# c\nx = \"again\"", .duplicateKey, 5),
        // Arrays
        ("x = [", .unterminatedArray, 1),
        ("x = [1, 2", .unterminatedArray, 1),
        ("x = [1,\n2,\n", .unterminatedArray, 3),
        ("x = [1\n[daemon]", .unexpectedText, 2),
        ("x = [\n[daemon]", .unsupported, 2),
        ("x = [[1]]", .unsupported, 1),
        ("x = [,]", .invalidValue, 1),
        ("x = [1,,2]", .invalidValue, 1),
        ("x = [1 2]", .unexpectedText, 1),
        ("x = [1] 2", .unexpectedText, 1),
        ("x = [1, bare]", .invalidValue, 1),
        ("x = [\"a\nb\"]", .unterminatedString, 1),
        // Deep garbage: rejected at the second bracket, no recursion.
        (String(repeating: "[", count: 100_000), .invalidTableHeader, 1),
        ("x = " + String(repeating: "[", count: 100_000), .unsupported, 1),
        ("x = " + String(repeating: "9", count: 500_000), .numberOutOfRange, 1),
        (String(repeating: "\n", count: 9) + "garbage!", .missingEquals, 10),
    ])
    func rejects(input: String, code: TOMLError.Code, line: Int) {
        let error = #expect(throws: TOMLError.self) { try TOMLSubset.parse(input) }
        #expect(error?.code == code)
        #expect(error?.line == line)
        #expect(error?.message.isEmpty == false)
    }

    @Test func errorMessagesSayWhatToDo() throws {
        let cases: [(String, String)] = [
            ("x = info", #"a string must be quoted ("info")"#),
            ("x = True", "a boolean is true or false, in lower case"),
            ("x = 1\nx = 2", "already set on line 1; remove one"),
            ("[a]\n[a]", "already defined on line 1; merge"),
            ("x = 0x10", "write the number in decimal"),
            ("x = [1, 2", "the array opened on line 1 is not closed; add ']'"),
            ("x = \"\u{0}\"", "the control character U+0000 is not allowed in a string; write it as an escape such as \\u0000"),
            ("x = 1 2", "unexpected '2' after the value"),
            ("ü", "found 'ü' (U+00FC)"),
        ]
        for (input, fragment) in cases {
            do {
                _ = try TOMLSubset.parse(input)
                Issue.record("\(input.debugDescription) parsed")
            } catch {
                #expect(error.message.contains(fragment), "\(input.debugDescription): \(error.message)")
            }
        }
    }

    // MARK: Limits

    @Test func inputSizeIsCheckedFirst() {
        // A valid document one byte over the limit is refused, before any parsing.
        let text = "# " + String(repeating: "a", count: TOMLSubset.maxInputBytes - 1)
        #expect(text.utf8.count == TOMLSubset.maxInputBytes + 1)
        #expect(throws: TOMLError(.inputTooLarge, line: 1, message: "the file is \(TOMLSubset.maxInputBytes + 1) bytes, more than the \(TOMLSubset.maxInputBytes) allowed; check that this is the right file")) {
            try TOMLSubset.parse(text)
        }
        // Exactly at the limit is fine.
        #expect(throws: Never.self) { try TOMLSubset.parse(String(text.dropLast())) }
        // Garbage that would fail later still fails on size first.
        let error = #expect(throws: TOMLError.self) { try TOMLSubset.parse("[[[\u{0}", maxInputBytes: 3) }
        #expect(error?.code == .inputTooLarge)
    }

    @Test func arraysOfTables() throws {
        let document = try TOMLSubset.parse(
            "top = 1\n[[route]]\nhost = \"a\"\n\n[[ route ]]\nhost = \"b\"\nunix = \"/s\"\n[daemon]\nx = 2\n[[route]]\n"
        )
        let routes = try #require(document.arrayTables["route"])
        #expect(routes.map(\.headerLine) == [2, 5, 10])
        #expect(routes[0].values == ["host": .string("a")])
        #expect(routes[1].values == ["host": .string("b"), "unix": .string("/s")])
        #expect(routes[1].keyLines == ["host": 6, "unix": 7])
        #expect(routes[2].values.isEmpty)
        // A [table] after an entry takes the keys that follow.
        #expect(document.tables["daemon"] == ["x": .integer(2)])
        #expect(document.tables[""] == ["top": .integer(1)])
    }

    @Test func arrayLengthIsLimited() throws {
        let within = "x = [" + Array(repeating: "1", count: 8).joined(separator: ",") + "]"
        #expect(try TOMLSubset.parse(within, maxArrayElements: 8).tables[""]?["x"] == .array(Array(repeating: .integer(1), count: 8)))
        let over = "x = [" + Array(repeating: "1", count: 9).joined(separator: ",") + "]"
        let overError = #expect(throws: TOMLError.self) { try TOMLSubset.parse(over, maxArrayElements: 8) }
        #expect(overError?.code == .arrayTooLong)
        let huge = "x = [" + String(repeating: "0,", count: TOMLSubset.maxArrayElements + 1) + "]"
        let hugeError = #expect(throws: TOMLError.self) { try TOMLSubset.parse(huge) }
        #expect(hugeError?.code == .arrayTooLong)
    }

    // MARK: Totality

    /// Every prefix of a realistic document, and a stream of pseudo-random mutations of it,
    /// yields a document or a TOMLError: nothing traps or hangs.
    @Test func prefixesAndMutationsNeverTrap() {
        let sample = """
            [daemon]
            log_level = "de\\u0062ug" # c
            shutdown_grace_seconds = 2.5e0
            [upstream]
            resolve = [ 'a:1:127.0.0.1', "b:2:[::1]", ]
            max_connections_per_origin = -1_000
            """
        let bytes = Array(sample.utf8)
        var outcomes = 0
        for end in 0...bytes.count {
            outcomes += parseOutcome(String(decoding: bytes[..<end], as: UTF8.self))
        }
        var generator = SplitMix64(seed: 0x5EED)
        let alphabet = Array("[]=\"'#\\,.\n\r\t _-+0123456789eEinfatrux:{}\u{0}é".utf8)
        for _ in 0..<2000 {
            var mutated = bytes
            for _ in 0..<Int(generator.next() % 4) + 1 {
                let position = Int(generator.next() % UInt64(mutated.count))
                let replacement = alphabet[Int(generator.next() % UInt64(alphabet.count))]
                switch generator.next() % 3 {
                case 0: mutated[position] = replacement
                case 1: mutated.insert(replacement, at: position)
                default: mutated.remove(at: position)
                }
            }
            outcomes += parseOutcome(String(decoding: mutated, as: UTF8.self))
        }
        #expect(outcomes == bytes.count + 1 + 2000)
    }

    private func parseOutcome(_ text: String) -> Int {
        do {
            _ = try TOMLSubset.parse(text)
            return 1
        } catch {
            return error.line >= 1 && !error.message.isEmpty ? 1 : 0
        }
    }
}

/// A small deterministic generator, so a failing mutation reproduces.
struct SplitMix64 {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
