import AuthBrokerCore
import Crypto
import Testing

@testable import AuthBrokerHTTPAuth

private func digestChallenge(_ header: String) throws -> DigestChallenge {
    let parsed = AuthChallenge.parse(fieldValue: header)
    try #require(parsed.count == 1)
    return try DigestChallenge(parsed[0])
}

private let mufasa = PasswordCredential(user: "Mufasa", password: "Circle of Life")

@Suite("Digest (RFC 7616)")
struct DigestTests {
    /// RFC 7616 §3.9.1: the same request answered with SHA-256 and with MD5.
    @Test(
        "RFC 7616 §3.9.1 example",
        arguments: [
            ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
            ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ]
    )
    func rfc7616Example(algorithm: String, response: String) throws {
        let challenge = try digestChallenge(
            """
            Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=\(algorithm), \
            nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"
            """
        )
        #expect(challenge.qopOptions == [.auth, .authInt])
        let result = try challenge.authorization(
            credential: mufasa, method: "GET", uri: "/dir/index.html", nonceCount: 1,
            clientNonce: "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ"
        )
        #expect(result.response == response)
        #expect(
            result.headerValue == """
                Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", \
                algorithm=\(algorithm), nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, \
                cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, response="\(response)", \
                opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"
                """
        )
    }

    static let section392Challenge = """
        Digest realm="api@example.org", qop="auth", algorithm=SHA-512-256, \
        nonce="5TsQWLVdgBdmrQ0XsxbDODV+57QdFR34I9HAbC/RVvkK", \
        opaque="HRPCssKJSGjCrkzDg8OhwpzCiGPChXYjwrI2QmXDnsOS", charset=UTF-8, userhash=true
        """
    static let jason = PasswordCredential(user: "J\u{E4}s\u{F8}n Doe", password: "Secret, or not?")

    /// RFC 7616 §3.9.2 with real SHA-512/256.
    ///
    /// The RFC prints username 488869477bf2…a254ec and response ae66e67d6b42…7a79dd, but those
    /// were computed with SHA-512 truncated to 256 bits, not SHA-512/256 (the next test
    /// reproduces them that way; RFC errata report 4897 is about this example). The values here
    /// were cross-checked with python3 `hashlib.new("sha512_256")` (OpenSSL) on this machine.
    @Test("RFC 7616 §3.9.2 example (userhash, charset, SHA-512-256), correct hash")
    func rfc7616UserhashExample() throws {
        let challenge = try digestChallenge(Self.section392Challenge)
        #expect(challenge.algorithm == .sha512_256)
        #expect(challenge.userhash)
        #expect(challenge.charsetUTF8)
        let result = try challenge.authorization(
            credential: Self.jason, method: "GET", uri: "/doe.json", nonceCount: 1,
            clientNonce: "NTg6RKcb9boFIAS3KrFK9BGeh+iDa/sm6jUMp2wds69v"
        )
        #expect(result.response == "3798d4131c277846293534c3edc11bd8a5e4cdcbff78b05db9d95eeb1cec68a5")
        #expect(
            result.headerValue == """
                Digest username="793263caabb707a56211940d90411ea4a575adeccb7e360aeb624ed06ece9b0b", \
                realm="api@example.org", uri="/doe.json", algorithm=SHA-512-256, \
                nonce="5TsQWLVdgBdmrQ0XsxbDODV+57QdFR34I9HAbC/RVvkK", nc=00000001, \
                cnonce="NTg6RKcb9boFIAS3KrFK9BGeh+iDa/sm6jUMp2wds69v", qop=auth, \
                response="3798d4131c277846293534c3edc11bd8a5e4cdcbff78b05db9d95eeb1cec68a5", \
                opaque="HRPCssKJSGjCrkzDg8OhwpzCiGPChXYjwrI2QmXDnsOS", userhash=true
                """
        )
    }

    /// The RFC's printed numbers, reproduced by swapping in truncated SHA-512: proof that the
    /// construction (A1 with the plain user name, userhash = H(user:realm), KD) matches the RFC,
    /// and that its numbers differ only by the hash function.
    @Test("RFC 7616 §3.9.2 printed values come from truncated SHA-512")
    func rfc7616PrintedValues() throws {
        let truncatedSHA512 = DigestMath { bytes in DigestBodyHasher.hex(SHA512.hash(data: bytes).prefix(32)) }
        let challenge = try digestChallenge(Self.section392Challenge)
        let result = try challenge.authorization(
            credential: Self.jason, method: "GET", uri: "/doe.json", body: .unavailable, nonceCount: 1,
            clientNonce: "NTg6RKcb9boFIAS3KrFK9BGeh+iDa/sm6jUMp2wds69v", sessionClientNonce: nil, preferAuthInt: false,
            math: truncatedSHA512
        )
        #expect(result.response == "ae66e67d6b427bd3f120414a82e4acff38e8ecd9101d6c861229025f607a79dd")
        #expect(result.headerValue.contains(#"username="488869477bf257147b804c45308cd62ac4e25eb717b12b298c79e62dcea254ec""#))
    }

    @Test("a non-ASCII user name without userhash goes in username* (RFC 7616 §3.4.4, RFC 8187)")
    func extendedUsername() throws {
        var challenge = try digestChallenge(Self.section392Challenge)
        challenge.userhash = false
        let result = try challenge.authorization(
            credential: Self.jason, method: "GET", uri: "/doe.json", clientNonce: "c"
        )
        #expect(result.headerValue.hasPrefix(#"Digest username*=UTF-8''J%C3%A4s%C3%B8n%20Doe, realm="api@example.org""#))
        #expect(!result.headerValue.contains("userhash"))
    }

    /// RFC 2069's example (no qop): response 1949323746fe6a43ef61f9606e7febea, as printed there.
    @Test("legacy RFC 2069 response when the server offers no qop")
    func legacy() throws {
        let challenge = try digestChallenge(
            #"Digest realm="testrealm@host.com", nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", opaque="5ccc069c403ebaf9f0171e9517f40e41""#
        )
        #expect(challenge.qopOptions.isEmpty)
        let result = try challenge.authorization(
            credential: PasswordCredential(user: "Mufasa", password: "CircleOfLife"), method: "GET", uri: "/dir/index.html",
            clientNonce: "unused"
        )
        #expect(result.response == "1949323746fe6a43ef61f9606e7febea")
        #expect(
            result.headerValue == """
                Digest username="Mufasa", realm="testrealm@host.com", uri="/dir/index.html", \
                nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093", response="1949323746fe6a43ef61f9606e7febea", \
                opaque="5ccc069c403ebaf9f0171e9517f40e41"
                """
        )
        #expect(result.nonceCount == nil)
        #expect(result.clientNonce == nil)
    }

    // Expected values below were computed with python3 hashlib (md5, sha256, sha512_256) on this
    // machine, independently of this code.
    static let alice = PasswordCredential(user: "alice", password: "pw")

    @Test(
        "auth-int covers the body (bytes or precomputed hash)",
        arguments: [
            (DigestAlgorithm.md5, "f12fb496d60151d5088f39038b4d84c1"),
            (.sha256, "3beb6e71c6c32cc2dff0e095725755b4b6b20e37a4d1287b247666b0bd0f44dc"),
            (.sha512_256, "f156f27ca30cd2c1dc8447eb2303d0670886c1a46fc01beb67754150f49923c6"),
        ]
    )
    func authInt(algorithm: DigestAlgorithm, expected: String) throws {
        let challenge = DigestChallenge(realm: "r", nonce: "n1", algorithm: algorithm, qopOptions: [.authInt])
        let fromBytes = try challenge.authorization(
            credential: Self.alice, method: "POST", uri: "/upload", body: .bytes(Array("hello".utf8)), nonceCount: 10,
            clientNonce: "c1"
        )
        #expect(fromBytes.response == expected)
        #expect(fromBytes.qop == .authInt)
        #expect(fromBytes.headerValue.contains("nc=0000000a, cnonce=\"c1\", qop=auth-int"))
        var hasher = DigestBodyHasher(algorithm.hashFunction)
        hasher.update(Array("hel".utf8))
        hasher.update(Array("lo".utf8))
        let fromHash = try challenge.authorization(
            credential: Self.alice, method: "POST", uri: "/upload", body: .hash(hasher.finalizeHex()), nonceCount: 10,
            clientNonce: "c1"
        )
        #expect(fromHash.response == expected)
    }

    @Test(
        "-sess keeps the first client nonce in A1",
        arguments: [
            (DigestAlgorithm.md5Session, "709147376613b4d4b98a70f31e268800"),
            (.sha256Session, "1cb5feb1d3bc91ba8c20f79459d036203ee3580cbeaa820d2799ca991aa40d72"),
            (.sha512_256Session, "b3d6ae4f9b84f2960cf9b68c0794272e1d374cbc90204a2b99dbd8f523ba9a53"),
        ]
    )
    func session(algorithm: DigestAlgorithm, expected: String) throws {
        let challenge = DigestChallenge(realm: "r", nonce: "n1", algorithm: algorithm, algorithmParameter: algorithm.rawValue)
        let result = try challenge.authorization(
            credential: Self.alice, method: "GET", uri: "/a", nonceCount: 2, clientNonce: "c1", sessionClientNonce: "c0"
        )
        #expect(result.response == expected)
        #expect(result.headerValue.contains("algorithm=\(algorithm.rawValue),"))
    }

    @Test("qop choice: auth when offered, auth-int when asked for or the only choice")
    func qopChoice() throws {
        let both = DigestChallenge(realm: "r", nonce: "n", qopOptions: [.authInt, .auth])
        #expect(try both.chooseQOP(body: .bytes([])) == .auth)
        #expect(try both.chooseQOP(body: .bytes([]), preferAuthInt: true) == .authInt)
        #expect(try both.chooseQOP(body: .unavailable, preferAuthInt: true) == .auth)
        let intOnly = DigestChallenge(realm: "r", nonce: "n", qopOptions: [.authInt])
        #expect(try intOnly.chooseQOP(body: .bytes([])) == .authInt)
        #expect(throws: HTTPAuthError.bodyRequired()) { try intOnly.chooseQOP(body: .unavailable) }
        #expect(try DigestChallenge(realm: "r", nonce: "n", qopOptions: []).chooseQOP(body: .unavailable) == nil)
    }

    @Test(
        "challenge reading",
        arguments: [
            (#"Digest realm="r", nonce="n""#, "ok:MD5:[]"),
            (#"Digest realm="r", nonce="n", algorithm=md5-SESS, qop="auth""#, "ok:MD5-sess:[auth]"),
            (#"Digest realm="r", nonce="n", algorithm="SHA-256", qop="auth-int, auth, token""#, "ok:SHA-256:[auth-int,auth]"),
            (#"Digest realm="r", nonce="n", algorithm=SHA-512-256-sess, qop=auth"#, "ok:SHA-512-256-sess:[auth]"),
            (#"Digest realm="r", nonce="n", algorithm=SHA-1"#, "unsupported_algorithm"),
            (#"Digest realm="r", nonce="n", qop="auth-conf""#, "unsupported_qop"),
            (#"Digest realm="r", nonce="n", algorithm=MD5-sess"#, "session_without_qop"),
            (#"Digest realm="r""#, "missing_parameter"),
            (#"Basic realm="r""#, "not_digest"),
        ]
    )
    func reading(header: String, expected: String) {
        let parsed = AuthChallenge.parse(fieldValue: header)
        guard let first = parsed.first else {
            Issue.record("no challenge parsed")
            return
        }
        do {
            let digest = try DigestChallenge(first)
            #expect("ok:\(digest.algorithm.rawValue):[\(digest.qopOptions.map(\.rawValue).joined(separator: ","))]" == expected)
        } catch {
            #expect(error.code == expected)
        }
    }

    @Test("stale, domain, opaque and userhash are read")
    func otherParameters() throws {
        let challenge = try digestChallenge(
            #"Digest realm="r", domain="/a http://h/b", nonce="n", opaque="o", stale=TRUE, userhash=false, charset=utf-8"#
        )
        #expect(challenge.domain == ["/a", "http://h/b"])
        #expect(challenge.opaque == "o")
        #expect(challenge.stale)
        #expect(!challenge.userhash)
        #expect(challenge.charsetUTF8)
    }

    @Test(
        "the paths a Digest password goes to up front follow domain (RFC 7616 §3.3)",
        arguments: [
            // No domain: the whole origin.
            (#"Digest realm="r", nonce="n""#, "/a/x", ["/"]),
            (#"Digest realm="r", domain="", nonce="n""#, "/a/x", ["/"]),
            // Paths; the accepted request's path is covered, so not added.
            (#"Digest realm="r", domain="/a/ /b/", nonce="n""#, "/a/x/y", ["/a/", "/b/"]),
            // Not covered: its path is added (it was challenged in this space), not its directory.
            (#"Digest realm="r", domain="/b/", nonce="n""#, "/a/x", ["/b/", "/a/x"]),
            (#"Digest realm="r", domain="/app/", nonce="n""#, "/login", ["/app/", "/login"]),
            // Absolute URIs on this origin count by their path; other origins (scheme, host, port) not.
            (
                #"Digest realm="r", domain="https://example.com/c/?q http://example.com/d/ https://other.example/e/ https://example.com:8443/f/", nonce="n""#,
                "/c/x", ["/c/"]
            ),
            // Relative references resolve against the request's directory; fragments go.
            (#"Digest realm="r", domain="docs/ /g#top", nonce="n""#, "/a/x", ["/a/docs/", "/g", "/a/x"]),
            // Only the first eight entries.
            (#"Digest realm="r", domain="/1 /2 /3 /4 /5 /6 /7 /8 /9 /10", nonce="n""#, "/x", ["/1", "/2", "/3", "/4", "/5", "/6", "/7", "/8", "/x"]),
            // Nothing on this origin: the request's path alone.
            (#"Digest realm="r", domain="https://other.example/", nonce="n""#, "/a/x", ["/a/x"]),
        ]
    )
    func preemptionPaths(header: String, requestPath: String, expected: [String]) throws {
        let origin = try CanonicalOrigin(scheme: .https, host: "example.com", port: nil)
        #expect(try digestChallenge(header).preemptionPaths(origin: origin, requestPath: requestPath) == expected)
    }

    @Test("what cannot go into the header is refused")
    func refused() {
        let challenge = DigestChallenge(realm: "r", nonce: "n")
        #expect(throws: HTTPAuthError.invalidCharacter("")) {
            try challenge.authorization(credential: Self.alice, method: "G T", uri: "/", clientNonce: "c")
        }
        #expect(throws: HTTPAuthError.invalidCharacter("")) {
            try challenge.authorization(credential: Self.alice, method: "GET", uri: "/\r\n", clientNonce: "c")
        }
        #expect(throws: HTTPAuthError.invalidCharacter("")) {
            try challenge.authorization(credential: Self.alice, method: "GET", uri: "/", clientNonce: "")
        }
    }

    @Test("nc is 8 lower-case hex digits")
    func nonceCountFormat() {
        #expect(DigestChallenge.formatNonceCount(1) == "00000001")
        #expect(DigestChallenge.formatNonceCount(0xAB) == "000000ab")
        #expect(DigestChallenge.formatNonceCount(.max) == "ffffffff")
    }

    @Test("client nonces are 32 hex digits and differ")
    func clientNonces() {
        let a = DigestChallenge.makeClientNonce()
        let b = DigestChallenge.makeClientNonce()
        #expect(a.count == 32)
        #expect(a != b)
        #expect(a.allSatisfy { $0.isHexDigit })
    }
}
