import AuthBrokerHTTPAuth
import Testing

/// One row of the parser table: field lines in, exact challenges out.
struct ParseCase: Sendable, CustomTestStringConvertible {
    let name: String
    let lines: [String]
    let expected: [AuthChallenge]

    init(_ name: String, _ lines: [String], _ expected: [AuthChallenge]) {
        self.name = name
        self.lines = lines
        self.expected = expected
    }

    init(_ line: String, _ expected: [AuthChallenge]) {
        self.init(String(line.prefix(60)), [line], expected)
    }

    var testDescription: String { name }
}

private func challenge(_ scheme: String, _ parameters: KeyValuePairs<String, String> = [:]) -> AuthChallenge {
    AuthChallenge(scheme: scheme, parameters)
}

private func token68(_ scheme: String, _ token: String) -> AuthChallenge {
    AuthChallenge(scheme: scheme, token68: token)
}

private let longRealm = String(repeating: "r", count: AuthChallenge.maxFieldLineBytes - #"Basic realm="""#.utf8.count)

private let parseCases: [ParseCase] = [
    // Real-world shapes.
    ParseCase(#"Basic realm="WallyWorld""#, [challenge("Basic", ["realm": "WallyWorld"])]),
    ParseCase(#"Basic realm="a, b""#, [challenge("Basic", ["realm": "a, b"])]),
    ParseCase("basic realm=x", [challenge("basic", ["realm": "x"])]),
    ParseCase("Basic realm=simple, charset=UTF-8", [challenge("Basic", ["realm": "simple", "charset": "UTF-8"])]),
    ParseCase("Negotiate", [challenge("Negotiate")]),
    ParseCase("NTLM", [challenge("NTLM")]),
    ParseCase("Negotiate, NTLM", [challenge("Negotiate"), challenge("NTLM")]),
    ParseCase("Negotiate YIIBhgYGKwYBBQUCoIIBejCCAXag+/==", [token68("Negotiate", "YIIBhgYGKwYBBQUCoIIBejCCAXag+/==")]),
    ParseCase("NTLM TlRMTVNTUAACAAAADAAMADgAAAAFgomi", [token68("NTLM", "TlRMTVNTUAACAAAADAAMADgAAAAFgomi")]),
    ParseCase("Foo YWJj==", [token68("Foo", "YWJj==")]),
    ParseCase(
        #"Bearer realm="x", error="invalid_token""#,
        [challenge("Bearer", ["realm": "x", "error": "invalid_token"])]
    ),
    ParseCase(
        #"Bearer realm="example", error="invalid_token", error_description="The access token expired""#,
        [challenge("Bearer", ["realm": "example", "error": "invalid_token", "error_description": "The access token expired"])]
    ),
    ParseCase(
        #"Digest realm="x",nonce="y",qop="auth,auth-int""#,
        [challenge("Digest", ["realm": "x", "nonce": "y", "qop": "auth,auth-int"])]
    ),
    ParseCase(
        #"digest realm="r", nonce="n", algorithm=sha-256, qop=auth"#,
        [challenge("digest", ["realm": "r", "nonce": "n", "algorithm": "sha-256", "qop": "auth"])]
    ),
    ParseCase(
        #"Basic realm="x" , Digest realm="y", nonce="z""#,
        [challenge("Basic", ["realm": "x"]), challenge("Digest", ["realm": "y", "nonce": "z"])]
    ),
    // RFC 9110 §11.6.1's own example.
    ParseCase(
        #"Newauth realm="apps", type=1, title="Login to \"apps\"", Basic realm="simple""#,
        [
            challenge("Newauth", ["realm": "apps", "type": "1", "title": #"Login to "apps""#]),
            challenge("Basic", ["realm": "simple"]),
        ]
    ),
    ParseCase(
        "two field lines", [#"Basic realm="a""#, #"Digest realm="b", nonce="n""#],
        [challenge("Basic", ["realm": "a"]), challenge("Digest", ["realm": "b", "nonce": "n"])]
    ),
    ParseCase(
        "a parameter continues a challenge from the previous line (RFC 9110 §5.3)", [#"Digest realm="b""#, #"nonce="n""#],
        [challenge("Digest", ["realm": "b", "nonce": "n"])]
    ),
    ParseCase(
        "an unterminated quote does not swallow the next line", [#"Basic realm="open"#, #"Digest realm="b", nonce="n""#],
        [challenge("Digest", ["realm": "b", "nonce": "n"])]
    ),
    // An unquoted qop list splits at its comma: `auth-int` reads as a scheme of its own.
    ParseCase(
        #"Digest realm="x", nonce="y", qop=auth,auth-int"#,
        [challenge("Digest", ["realm": "x", "nonce": "y", "qop": "auth"]), challenge("auth-int")]
    ),
    ParseCase(#"Digest realm = "x" , nonce = y"#, [challenge("Digest", ["realm": "x", "nonce": "y"])]),
    ParseCase("Basic\trealm=\"x\"", [challenge("Basic", ["realm": "x"])]),
    ParseCase("Basic,realm=x", [challenge("Basic", ["realm": "x"])]),
    ParseCase(#"realm="x", Basic realm="y""#, [challenge("Basic", ["realm": "y"])]),
    ParseCase(#"Basic realm="""#, [challenge("Basic", ["realm": ""])]),
    ParseCase(#"Basic realm="🔐 vault""#, [challenge("Basic", ["realm": "🔐 vault"])]),
    ParseCase(#"Basic realm="Zürich""#, [challenge("Basic", ["realm": "Zürich"])]),
    // Escapes: \" \\ \" inside quotes, an escaped comma, an escaped quote before a comma.
    ParseCase(#"Basic realm="\"\\\"""#, [challenge("Basic", ["realm": #""\""#])]),
    ParseCase(#"Basic realm="a\,b""#, [challenge("Basic", ["realm": "a,b"])]),
    ParseCase(#"Basic realm="x\", Digest", nonce=y"#, [challenge("Basic", ["realm": #"x", Digest"#, "nonce": "y"])]),
    // Empty list elements are skipped (RFC 9110 §5.6.1.2).
    ParseCase(#", Basic realm="x" ,, "#, [challenge("Basic", ["realm": "x"])]),
    ParseCase(#"Basic realm="x", , nonce="y""#, [challenge("Basic", ["realm": "x", "nonce": "y"])]),
    ParseCase("exactly the line limit", [#"Basic realm=""# + longRealm + #"""#], [challenge("Basic", ["realm": longRealm])]),

    // Hostile and broken input: exact results, no traps.
    ParseCase("", []),
    ParseCase(",", []),
    ParseCase(", , ,", []),
    ParseCase("   ", []),
    ParseCase("no lines", [], []),
    ParseCase(#"Basic realm="abc"#, []),
    ParseCase(#"Basic realm="abc, Digest realm="y", nonce="z""#, []),
    ParseCase("Basic =", []),
    ParseCase("=", []),
    ParseCase("=x", []),
    // `realm=` is a token68 (letters, then `=` padding), so this is Basic with a token68, which
    // the grammar allows and `ChallengeSelection` then refuses.
    ParseCase("Basic realm=", [token68("Basic", "realm=")]),
    ParseCase(#"Basic realm="x"y"#, []),
    ParseCase(#"Basic realm="x" "y""#, []),
    ParseCase("Foo a=b=", []),
    ParseCase("100 KiB of a", [String(repeating: "a", count: 100 * 1024)], []),
    ParseCase("one byte over the line limit", [#"Basic realm=""# + longRealm + #"x""#], []),
    ParseCase(
        "an oversized line is ignored, its neighbours kept",
        ["Basic realm=a", String(repeating: "b", count: 20_000), "Digest realm=c, nonce=d"],
        [challenge("Basic", ["realm": "a"]), challenge("Digest", ["realm": "c", "nonce": "d"])]
    ),
    ParseCase("Basic realm=\"a\u{0}b\"", []),
    ParseCase("Bas\u{0}ic realm=x", []),
    ParseCase("Basic realm=x, \u{0}", []),
    ParseCase("\u{0}\u{0}\u{0}", []),
    ParseCase("Basic realm=\"x\"\r\nSet-Cookie: a=b", []),
    ParseCase("Basic realm=\"x\u{7F}\"", []),
    ParseCase("🔐 realm=x", []),
    ParseCase("Bäsic realm=x", []),
    ParseCase("Basic realm=ü", []),
    ParseCase(#"Basic realm="a", realm="b""#, []),
    ParseCase(
        #"Basic realm="a", REALM="b", Digest realm="c", nonce="d""#,
        [challenge("Digest", ["realm": "c", "nonce": "d"])]
    ),
    ParseCase(#"Negotiate abc==, realm="x""#, []),
    ParseCase(#"Basic realm="x", Negotiate abc==, Digest realm="y", nonce="n""#, [
        challenge("Basic", ["realm": "x"]), token68("Negotiate", "abc=="), challenge("Digest", ["realm": "y", "nonce": "n"]),
    ]),
    ParseCase(#"Basic realm="x", a/b, Digest realm="y", nonce="n""#, [challenge("Digest", ["realm": "y", "nonce": "n"])]),
    ParseCase(#"Basic realm="x\"#, []),
    ParseCase(#"""""#, []),
    ParseCase(#"Basic "realm"="x""#, []),
]

@Suite("Challenge parsing (RFC 9110 §11.6.1)")
struct ChallengeParserTests {
    @Test("exact challenges for real-world and hostile field values", arguments: parseCases)
    func table(_ testCase: ParseCase) {
        #expect(AuthChallenge.parse(fieldValues: testCase.lines) == testCase.expected)
    }

    @Test("the table is large enough")
    func tableSize() {
        #expect(parseCases.count >= 40)
    }

    @Test("a challenge with more parameters than the limit is dropped; at the limit it is kept")
    func parameterLimit() {
        func line(_ count: Int) -> String {
            "Digest " + (0..<count).map { "p\($0)=v" }.joined(separator: ", ") + ", Basic realm=x"
        }
        let atLimit = AuthChallenge.parse(fieldValue: line(AuthChallenge.maxParametersPerChallenge))
        #expect(atLimit.count == 2)
        #expect(atLimit.first?.parameters.count == AuthChallenge.maxParametersPerChallenge)
        let over = AuthChallenge.parse(fieldValue: line(AuthChallenge.maxParametersPerChallenge + 1))
        #expect(over == [challenge("Basic", ["realm": "x"])])
    }

    @Test("at most maxChallenges challenges come back, the first ones")
    func challengeLimit() {
        let lines = (0..<40).map { "Basic realm=r\($0)" }
        let parsed = AuthChallenge.parse(fieldValues: lines)
        #expect(parsed.count == AuthChallenge.maxChallenges)
        #expect(parsed.first?.realm == "r0")
        #expect(parsed.last?.realm == "r\(AuthChallenge.maxChallenges - 1)")
    }

    @Test("lines past the total byte budget are ignored")
    func totalBudget() {
        let filler = "X " + String(repeating: "a", count: AuthChallenge.maxFieldLineBytes - 10)
        var lines = Array(repeating: filler, count: AuthChallenge.maxTotalBytes / filler.utf8.count + 1)
        lines.append("Basic realm=late")
        let parsed = AuthChallenge.parse(fieldValues: lines)
        #expect(!parsed.contains { $0.realm == "late" })
    }

    @Test("lookups are case-insensitive; spelling is kept")
    func caseInsensitive() {
        let parsed = AuthChallenge.parse(fieldValue: #"DiGeSt ReAlM="R", NONCE=n"#)
        #expect(parsed.count == 1)
        #expect(parsed[0].lowercasedScheme == "digest")
        #expect(parsed[0].scheme == "DiGeSt")
        #expect(parsed[0][parameter: "realm"] == "R")
        #expect(parsed[0][parameter: "Nonce"] == "n")
        #expect(parsed[0].realm == "R")
    }

    @Test(
        "serialising quotes what must be quoted",
        arguments: [
            (challenge("Basic", ["realm": "x"]), #"Basic realm="x""#),
            (challenge("Basic", ["realm": #"a "b" \c"#]), #"Basic realm="a \"b\" \\c""#),
            (
                challenge("Digest", ["realm": "r", "nonce": "n", "algorithm": "SHA-256", "stale": "true", "qop": "auth"]),
                #"Digest realm="r", nonce="n", algorithm=SHA-256, stale=true, qop="auth""#
            ),
            (challenge("Newauth", ["type": "1", "title": "a b"]), #"Newauth type=1, title="a b""#),
            (challenge("Negotiate"), "Negotiate"),
            (token68("NTLM", "abc=="), "NTLM abc=="),
            (challenge("Basic", ["realm": "🔐"]), #"Basic realm="🔐""#),
        ]
    )
    func serialise(_ input: AuthChallenge, _ expected: String) {
        #expect(input.serialized() == expected)
        #expect(AuthChallenge.parse(fieldValue: expected) == [input])
    }

    @Test(
        "what no header can carry is not serialised",
        arguments: [
            challenge("Basic", ["realm": "a\nb"]),
            challenge("Basic", ["realm": "a\u{0}"]),
            challenge("Ba sic", ["realm": "x"]),
            challenge("Basic", ["re alm": "x"]),
            token68("NTLM", "a=b"),
        ]
    )
    func unserialisable(_ input: AuthChallenge) {
        #expect(input.serialized() == nil)
    }
}

/// SplitMix64: a tiny seeded generator, so the randomised test is the same on every run.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite("Challenge parsing under random mutation")
struct ChallengeFuzzTests {
    static let seeds: [String] = [
        #"Basic realm="WallyWorld", charset="UTF-8""#,
        #"Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=SHA-256, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS""#,
        #"Newauth realm="apps", type=1, title="Login to \"apps\"", Basic realm="simple""#,
        "Negotiate YIIBhgYGKwYBBQUCoIIBejCCAXag==, NTLM",
        #"Bearer realm="x", error="invalid_token""#,
    ]

    static let alphabet: [Unicode.Scalar] = [
        "\"", "\\", ",", "=", " ", "\t", "a", "Z", "/", "+", "\u{0}", "\r", "\n", "\u{7F}", "é", "🔐", "\u{FFFD}",
    ]

    static func mutate(_ text: String, using generator: inout SeededGenerator) -> String {
        var scalars = Array(text.unicodeScalars)
        for _ in 0..<Int.random(in: 1...6, using: &generator) {
            switch Int.random(in: 0..<5, using: &generator) {
            case 0 where !scalars.isEmpty:
                scalars.remove(at: Int.random(in: 0..<scalars.count, using: &generator))
            case 1:
                let scalar = alphabet.randomElement(using: &generator) ?? "a"
                scalars.insert(scalar, at: Int.random(in: 0...scalars.count, using: &generator))
            case 2 where !scalars.isEmpty:
                scalars = Array(scalars.prefix(Int.random(in: 0..<scalars.count, using: &generator)))
            case 3 where !scalars.isEmpty && scalars.count < 4_000:
                let start = Int.random(in: 0..<scalars.count, using: &generator)
                let end = Int.random(in: start...scalars.count, using: &generator)
                scalars.insert(contentsOf: scalars[start..<end], at: end)
            default:
                if !scalars.isEmpty {
                    let index = Int.random(in: 0..<scalars.count, using: &generator)
                    scalars[index] = alphabet.randomElement(using: &generator) ?? "a"
                }
            }
        }
        var out = ""
        out.unicodeScalars.append(contentsOf: scalars)
        return out
    }

    @Test("3000 mutated headers: no trap, limits hold, every result round-trips", arguments: [1, 2, 3])
    func mutations(seed: UInt64) {
        var generator = SeededGenerator(state: seed)
        for _ in 0..<1_000 {
            let lineCount = Int.random(in: 1...3, using: &generator)
            let lines = (0..<lineCount).map { _ in
                Self.mutate(Self.seeds.randomElement(using: &generator) ?? "", using: &generator)
            }
            let parsed = AuthChallenge.parse(fieldValues: lines)
            #expect(parsed.count <= AuthChallenge.maxChallenges)
            for challenge in parsed {
                #expect(challenge.parameters.count <= AuthChallenge.maxParametersPerChallenge)
                #expect(!(challenge.token68 != nil && !challenge.parameters.isEmpty))
                let names = challenge.parameters.map(\.lowercasedName)
                #expect(Set(names).count == names.count)
                // The serialiser writes what the parser reads back unchanged.
                guard let text = challenge.serialized() else {
                    Issue.record("a parsed challenge did not serialise: \(challenge.scheme) in \(lines)")
                    continue
                }
                #expect(AuthChallenge.parse(fieldValue: text) == [challenge], "\(lines)")
            }
            _ = AuthenticationInfo(parsing: lines)
        }
    }
}
