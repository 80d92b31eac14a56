import AuthBrokerHTTPAuth
import Testing

private func hex(_ bytes: [UInt8]) -> String {
    bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
}

@Suite("SHA-512/256 (FIPS 180-4 §5.3.6.2)")
struct SHA512_256Tests {
    @Test(
        "known answers",
        arguments: [
            // FIPS 180-4 examples (NIST CSRC "SHA512_256.pdf").
            ("abc", "53048e2681941ef99b2e29b76b4c7dabe4c2d0c634fc6d46e0e2f13107e7af23"),
            ("", "c672b8d1ef56ed28ab87c3622c5114069bdd3ad7b8f9737498d0c01ecef0967a"),
            (
                "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
                "3928e184fb8690f840da3988121d31be65cb9d3ef83ee6146feac861e19b563a"
            ),
            // Cross-checked with python3 hashlib.new("sha512_256") (OpenSSL) on this machine.
            ("Jäsøn Doe:api@example.org", "793263caabb707a56211940d90411ea4a575adeccb7e360aeb624ed06ece9b0b"),
        ]
    )
    func knownAnswers(input: String, expected: String) {
        #expect(hex(SHA512_256.hash(Array(input.utf8))) == expected)
    }

    @Test("incremental updates at every block boundary give the one-shot digest")
    func incremental() {
        let message = (0..<300).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        let oneShot = SHA512_256.hash(message)
        for split in [0, 1, 111, 112, 127, 128, 129, 255, 256, 299, 300] {
            var hasher = SHA512_256()
            hasher.update(message[..<split])
            hasher.update(message[split...])
            #expect(hasher.finalize() == oneShot, "split at \(split)")
        }
    }

    @Test("a million a's (FIPS long-message vector)")
    func millionA() {
        var hasher = SHA512_256()
        let chunk = [UInt8](repeating: UInt8(ascii: "a"), count: 10_000)
        for _ in 0..<100 { hasher.update(chunk) }
        // Cross-checked with python3 hashlib.new("sha512_256", b"a" * 1_000_000).
        #expect(hex(hasher.finalize()) == "9a59a052930187a97038cae692f30708aa6491923ef5194394dc68d56c74fb21")
    }
}

@Suite("Basic (RFC 7617)")
struct BasicTests {
    @Test(
        "RFC 7617 examples",
        arguments: [
            ("Aladdin", "open sesame", "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),  // §2
            ("test", "123£", "Basic dGVzdDoxMjPCow=="),  // §2.1, charset="UTF-8"
        ]
    )
    func examples(user: String, password: String, expected: String) throws {
        #expect(try BasicAuthorization.headerValue(for: PasswordCredential(user: user, password: password)) == expected)
    }

    @Test("the challenge's charset is honoured: NFC only when UTF-8 was announced")
    func charset() throws {
        let decomposed = PasswordCredential(user: "u", password: "e\u{301}")  // e + combining acute
        let utf8 = AuthChallenge(scheme: "Basic", ["realm": "r", "charset": "utf-8"])
        let plain = AuthChallenge(scheme: "Basic", ["realm": "r"])
        // "u:é" precomposed is 75 3A C3 A9; decomposed is 75 3A 65 CC 81.
        #expect(try BasicAuthorization.headerValue(for: decomposed, challenge: utf8) == "Basic dTrDqQ==")
        #expect(try BasicAuthorization.headerValue(for: decomposed, challenge: plain) == "Basic dTplzIE=")
    }

    @Test(
        "user names Basic cannot carry are refused",
        arguments: [
            (PasswordCredential(user: "a:b", password: "p"), "invalid_user_id"),
            (PasswordCredential(user: "a\nb", password: "p"), "invalid_user_id"),
            (PasswordCredential(user: "a", password: "p\u{0}"), "invalid_character"),
        ]
    )
    func refused(credential: PasswordCredential, code: String) {
        #expect(throws: HTTPAuthError.self) { try BasicAuthorization.headerValue(for: credential) }
        do {
            _ = try BasicAuthorization.headerValue(for: credential)
        } catch {
            #expect(error.code == code)
        }
    }

    @Test("a password may contain ':' (only the first colon splits)")
    func colonInPassword() throws {
        #expect(try BasicAuthorization.headerValue(for: PasswordCredential(user: "a", password: "b:c")) == "Basic YTpiOmM=")
    }

    @Test("the password never shows in descriptions")
    func redacted() {
        let credential = PasswordCredential(user: "alice", password: "hunter2")
        #expect(!"\(credential)".contains("hunter2"))
        #expect(!String(reflecting: credential).contains("hunter2"))
        #expect(!String(describing: Mirror(reflecting: credential).children.map(\.value)).contains("hunter2"))
    }
}

@Suite("Basic credentials read back")
struct BasicCredentialParsingTests {
    @Test(
        "hostile and foreign Authorization values give nil",
        arguments: [
            "", "Basic", "Basic ", "Bearer QWxhZGRpbjpvcGVuIHNlc2FtZQ==", "Basic !!!not-base64!!!", "Basic bm9jb2xvbg==",
            "Basic " + String(repeating: "QUFB", count: 3000), "Digest username=\"a\"", "Basic AA==", "Basic /w==",
        ]
    )
    func hostile(value: String) {
        #expect(BasicAuthorization.credential(fromHeaderValue: value) == nil)
    }

    @Test("RFC 7617 examples read back, case-insensitive scheme; a ':' in the password is kept")
    func examples() throws {
        let aladdin = try #require(BasicAuthorization.credential(fromHeaderValue: "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="))
        #expect(aladdin.user == "Aladdin" && aladdin.password == "open sesame")
        let utf8 = try #require(BasicAuthorization.credential(fromHeaderValue: "basic dGVzdDoxMjPCow=="))
        #expect(utf8.user == "test" && utf8.password == "123£")
        let value = try BasicAuthorization.headerValue(for: PasswordCredential(user: "u", password: "a:b:c"))
        #expect(BasicAuthorization.credential(fromHeaderValue: value)?.password == "a:b:c")
    }
}
