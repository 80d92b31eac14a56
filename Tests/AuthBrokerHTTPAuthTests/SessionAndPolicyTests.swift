import AuthBrokerCore
import AuthBrokerHTTPAuth
import Foundation
import Testing

private let alice = PasswordCredential(user: "alice", password: "pw")

private func space(realm: String = "r") throws -> ProtectionSpace {
    ProtectionSpace(origin: try CanonicalOrigin(scheme: .https, host: "Example.COM", port: nil), realm: realm, authScheme: "Digest")
}

@Suite("Authentication-Info (RFC 7615, RFC 7616 §3.5)")
struct AuthenticationInfoTests {
    @Test("the Digest parameters are read")
    func parameters() {
        let info = AuthenticationInfo(
            parsing: #"nextnonce="n2", qop=auth, rspauth="6ed4d2f9f3a15af9d15fb1cc30c1d84c", cnonce="c1", nc=00000001"#
        )
        #expect(info.nextNonce == "n2")
        #expect(info.qop == "auth")
        #expect(info.responseAuth == "6ed4d2f9f3a15af9d15fb1cc30c1d84c")
        #expect(info.clientNonce == "c1")
        #expect(info.nonceCount == 1)
    }

    @Test(
        "the parser is total: broken elements and repeated names are dropped",
        arguments: [
            (#"nextnonce="n2", rspauth="x"#, ["nextnonce"]),
            (#"nextnonce="a", NEXTNONCE="b", qop=auth"#, ["qop"]),
            (#", , qop=auth,, Digest x=y, =, nc"#, ["qop"]),
            ("", []),
            ("\u{0}", []),
            (#"nc=zz, cnonce="c""#, ["nc", "cnonce"]),
        ]
    )
    func total(field: String, names: [String]) {
        #expect(AuthenticationInfo(parsing: field).parameters.map(\.name) == names)
    }

    @Test("nc must be 8 hex digits")
    func nonceCount() {
        #expect(AuthenticationInfo(parsing: "nc=0000000A").nonceCount == 10)
        #expect(AuthenticationInfo(parsing: "nc=1").nonceCount == nil)
        #expect(AuthenticationInfo(parsing: "nc=+0000001").nonceCount == nil)
    }
}

@Suite("rspauth verification (RFC 7616 §3.5)")
struct ResponseAuthTests {
    // rspauth values computed with python3 hashlib on this machine: KD(H(A1), nonce:nc:cnonce:qop:H(":" uri)).
    @Test(
        "a correct rspauth verifies, anything else does not",
        arguments: [
            (DigestAlgorithm.md5, "6ed4d2f9f3a15af9d15fb1cc30c1d84c"),
            (.sha256, "5ea1206a0a840b02f93d690b0b1b2d7313f2aa182941fdd822bd5b6dd5a5d3c9"),
            (.sha512_256, "1ba3b2f51fddb1513e37919d5fe59e725d7acf8b4eae8af6f45174b7a1a3ebb1"),
        ]
    )
    func verify(algorithm: DigestAlgorithm, rspauth: String) throws {
        let challenge = DigestChallenge(realm: "r", nonce: "n1", algorithm: algorithm)
        let authorization = try challenge.authorization(credential: alice, method: "GET", uri: "/a", nonceCount: 1, clientNonce: "c1")
        func verdict(_ field: String) -> ResponseAuthVerdict {
            challenge.verifyResponseAuth(AuthenticationInfo(parsing: field), credential: alice, authorization: authorization)
        }
        #expect(verdict(#"rspauth="\#(rspauth)", cnonce="c1", nc=00000001, qop=auth"#) == .verified)
        #expect(verdict(#"rspauth="\#(rspauth.uppercased())""#) == .verified)
        #expect(verdict(#"rspauth="\#(rspauth.dropLast())0""#) == .mismatch)
        #expect(verdict(#"rspauth="\#(rspauth)", cnonce="other""#) == .mismatch)
        #expect(verdict(#"rspauth="\#(rspauth)", nc=00000002"#) == .mismatch)
        #expect(verdict(#"rspauth="\#(rspauth)", nc=junk"#) == .mismatch)
        #expect(verdict(#"rspauth="\#(rspauth)", qop=auth-int"#) == .mismatch)
        #expect(verdict(#"nextnonce="x""#) == .notProvided)
        let wrongPassword = PasswordCredential(user: "alice", password: "nope")
        #expect(
            challenge.verifyResponseAuth(
                AuthenticationInfo(parsing: #"rspauth="\#(rspauth)""#), credential: wrongPassword, authorization: authorization
            ) == .mismatch
        )
    }

    @Test("auth-int rspauth needs the response body")
    func authIntNeedsBody() throws {
        let challenge = DigestChallenge(realm: "r", nonce: "n1", qopOptions: [.authInt])
        let authorization = try challenge.authorization(
            credential: alice, method: "GET", uri: "/a", body: .bytes([]), clientNonce: "c1"
        )
        let info = AuthenticationInfo(parsing: #"rspauth="00""#)
        #expect(challenge.verifyResponseAuth(info, credential: alice, authorization: authorization) == .cannotVerify)
        #expect(
            challenge.verifyResponseAuth(info, credential: alice, authorization: authorization, responseBody: .bytes([]))
                == .mismatch
        )
    }
}

@Suite("Digest session: nonce reuse")
struct DigestSessionTests {
    @Test("nc counts 1, 2, 3 on one nonce; the server's nextnonce resets it")
    func counting() throws {
        var session = DigestSession(protectionSpace: try space(), challenge: DigestChallenge(realm: "r", nonce: "n1"))
        for expected in 1...3 {
            let result = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c")
            #expect(result.nonceCount == UInt32(expected))
            #expect(result.headerValue.contains("nc=0000000\(expected)"))
            #expect(result.nonce == "n1")
        }
        #expect(session.nextNonceCount == 4)
        session.accept(authenticationInfo: AuthenticationInfo(parsing: #"nextnonce="n2""#))
        #expect(session.nextNonceCount == 1)
        let next = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c")
        #expect(next.nonce == "n2")
        #expect(next.nonceCount == 1)
        // An Authentication-Info without nextnonce changes nothing.
        session.accept(authenticationInfo: AuthenticationInfo(parsing: #"rspauth="x""#))
        #expect(session.nextNonceCount == 2)
    }

    @Test("the counted response matches a hand-computed one")
    func countedValue() throws {
        var session = DigestSession(protectionSpace: try space(), challenge: DigestChallenge(realm: "r", nonce: "n1"))
        let first = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c1")
        // python3: md5 KD(H(alice:r:pw), n1:00000001:c1:auth:H(GET:/a)).
        #expect(first.response == "18c0f752e785c22a3ebedae456fa8148")
    }

    @Test("stale=true: new nonce, count from 1, retry without asking")
    func stale() throws {
        var session = DigestSession(protectionSpace: try space(), challenge: DigestChallenge(realm: "r", nonce: "n1"))
        _ = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c")
        _ = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c")
        let outcome = session.challenge(DigestChallenge(realm: "r", nonce: "n2", stale: true))
        #expect(outcome == .staleNonce)
        let retry = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c")
        #expect(retry.nonce == "n2")
        #expect(retry.nonceCount == 1)
    }

    @Test("a non-stale challenge, or a stale one for another realm, means the credentials were refused")
    func rejected() throws {
        var session = DigestSession(protectionSpace: try space(), challenge: DigestChallenge(realm: "r", nonce: "n1"))
        #expect(session.challenge(DigestChallenge(realm: "r", nonce: "n2")) == .credentialsRejected)
        #expect(session.challenge(DigestChallenge(realm: "other", nonce: "n3", stale: true)) == .credentialsRejected)
    }

    @Test("-sess keeps the first cnonce of a nonce in A1 until the nonce changes")
    func sessionKey() throws {
        let challenge = DigestChallenge(realm: "r", nonce: "n1", algorithm: .md5Session)
        var session = DigestSession(protectionSpace: try space(), challenge: challenge)
        let first = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c0")
        let second = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c1")
        #expect(first.sessionClientNonce == "c0")
        #expect(second.sessionClientNonce == "c0")
        // python3: md5-sess with A1 cnonce c0, request cnonce c1, nc 2.
        #expect(second.response == "709147376613b4d4b98a70f31e268800")
        session.accept(authenticationInfo: AuthenticationInfo(parsing: "nextnonce=n2"))
        let third = try session.authorization(credential: alice, method: "GET", uri: "/a", clientNonce: "c2")
        #expect(third.sessionClientNonce == "c2")
    }
}

@Suite("Challenge selection")
struct ChallengeSelectionTests {
    static let mixed = AuthChallenge.parse(fieldValues: [
        "Negotiate, NTLM",
        #"Bearer realm="x", error="invalid_token""#,
        #"Basic realm="b""#,
        #"Digest realm="d", nonce="1", algorithm=MD5, qop="auth""#,
        #"Digest realm="d", nonce="2", algorithm=SHA-1, qop="auth""#,
        #"Digest realm="d", nonce="3", algorithm=SHA-256, qop="auth""#,
        #"Digest realm="d", algorithm=SHA-256, qop="auth""#,
        "Basic abc==",
    ])

    @Test("clients see only Basic and answerable Digest challenges, in order")
    func clientVisible() {
        let visible = ChallengeSelection.clientVisible(Self.mixed)
        #expect(visible.map { $0.lowercasedScheme + ($0[parameter: "nonce"] ?? "") } == ["basic", "digest1", "digest3"])
    }

    @Test(
        "the broker prefers Digest, then the strongest hash, then qop, then the server's order",
        arguments: [
            ([#"Basic realm="b""#, #"Digest realm="d", nonce="1""#], "1"),
            ([#"Digest realm="d", nonce="1", algorithm=MD5, qop=auth"#, #"Digest realm="d", nonce="2", algorithm=SHA-256, qop=auth"#], "2"),
            ([#"Digest realm="d", nonce="1", algorithm=SHA-256, qop=auth"#, #"Digest realm="d", nonce="2", algorithm=SHA-512-256-sess, qop=auth"#], "2"),
            ([#"Digest realm="d", nonce="1", algorithm=SHA-256-sess, qop=auth"#, #"Digest realm="d", nonce="2", algorithm=SHA-256, qop=auth"#], "1"),
            ([#"Digest realm="d", nonce="1""#, #"Digest realm="d", nonce="2", qop=auth"#], "2"),
            ([#"Digest realm="d", nonce="1", algorithm=SHA-1"#, #"Basic realm="b""#], "basic"),
            (["Negotiate", "NTLM", #"Bearer realm="x""#], "none"),
            ([], "none"),
        ]
    )
    func preferred(lines: [String], expected: String) {
        let choice = ChallengeSelection.preferred(AuthChallenge.parse(fieldValues: lines))
        switch choice {
        case .digest(let digest, _): #expect(digest.nonce == expected)
        case .basic: #expect(expected == "basic")
        case nil: #expect(expected == "none")
        }
    }
}

@Suite("Protection space")
struct ProtectionSpaceTests {
    @Test("keyed on the canonical origin; realm exact; scheme lower-cased")
    func equality() throws {
        let a = ProtectionSpace(
            origin: try CanonicalOrigin(scheme: .https, host: "Example.COM", port: 443), realm: "R", authScheme: "DIGEST"
        )
        let b = try space(realm: "R")
        #expect(a == b)
        #expect(a.authScheme == "digest")
        #expect(a.host == "example.com")
        #expect(a.port == 443)
        #expect(try space(realm: "r") != b)
        let proxy = ProtectionSpace(origin: a.origin, realm: "R", authScheme: "digest", isProxy: true)
        #expect(proxy != a)
        let fromChallenge = ProtectionSpace(origin: a.origin, challenge: AuthChallenge(scheme: "Digest", ["realm": "R"]))
        #expect(fromChallenge == a)
        #expect(a.authorizationFieldName == "Authorization")
        #expect(proxy.challengeFieldName == "Proxy-Authenticate")
        #expect(proxy.authorizationFieldName == "Proxy-Authorization")
        #expect(proxy.authenticationInfoFieldName == "Proxy-Authentication-Info")
    }

    @Test("Codable round trip; decoding re-validates the host")
    func codable() throws {
        let original = ProtectionSpace(origin: try CanonicalOrigin(scheme: .http, host: "[::1]", port: 8080), realm: "r", authScheme: "basic")
        let data = try JSONEncoder().encode(original)
        #expect(try JSONDecoder().decode(ProtectionSpace.self, from: data) == original)
        let tampered = Data(#"{"scheme":"https","host":"exa mple.com","port":443,"realm":"r","authScheme":"basic","isProxy":false}"#.utf8)
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(ProtectionSpace.self, from: tampered) }
        let badScheme = Data(#"{"scheme":"ftp","host":"example.com","port":21,"realm":"r","authScheme":"basic"}"#.utf8)
        #expect(throws: DecodingError.self) { try JSONDecoder().decode(ProtectionSpace.self, from: badScheme) }
    }
}

@Suite("Attempt policy (lockout safety)")
struct AuthAttemptPolicyTests {
    typealias P = AuthAttemptPolicy

    @Test(
        "decisions",
        arguments: [
            // First 401, nothing sent yet.
            (0, P.LastAttempt.noCredentials, P.StoredCredential.usable, false, 0, P.Decision.answerFromStore),
            (0, .noCredentials, .none, false, 0, .passToClient),
            (0, .noCredentials, .markedFailed, false, 0, .passToClient),
            // The stored credential was refused.
            (1, .storedCredential, .usable, false, 0, .markStoredFailedAndPassToClient),
            (0, .storedCredential, .usable, false, 0, .markStoredFailedAndPassToClient),
            // Stale: one retry, then the client decides; the credential is not marked failed.
            (1, .storedCredential, .usable, true, 0, .answerFromStore),
            (2, .storedCredential, .usable, true, 1, .passToClient),
            // A preemptive Digest answer refused without stale=true: the password was refused,
            // and is not sent again to the fresh challenge (one failed login, not two).
            (0, .preemptiveDigest, .usable, false, 0, .markStoredFailedAndPassToClient),
            (1, .preemptiveDigest, .usable, false, 0, .markStoredFailedAndPassToClient),
            // With stale=true the nonce had expired: one answer to the fresh challenge.
            (0, .preemptiveDigest, .usable, true, 0, .answerFromStore),
            // The client's own credential is never replaced.
            (1, .clientCredential, .usable, false, 0, .passToClient),
            (0, .clientCredential, .usable, true, 0, .passToClient),
            // A request that already failed without the store does not start using it.
            (1, .noCredentials, .usable, false, 0, .passToClient),
        ]
    )
    func decisions(
        previousFailures: Int, lastAttempt: P.LastAttempt, stored: P.StoredCredential, stale: Bool, staleRetries: Int,
        expected: P.Decision
    ) {
        #expect(
            P.decide(
                previousFailures: previousFailures, lastAttempt: lastAttempt, stored: stored, challengeIsStale: stale,
                staleRetries: staleRetries
            ) == expected
        )
    }

    /// A refusal the server contradicted (it accepted the same credential from another request
    /// after this one was sent: out-of-order Digest counts) is never a mark, and gets at most
    /// `maxRetriesAfterAcceptance` fresh answers; without that evidence the mark comes at once.
    @Test("a refusal contradicted by an acceptance meanwhile is retried a bounded number of times, never marked")
    func refusalContradictedByAcceptance() {
        for last in [P.LastAttempt.storedCredential, .preemptiveDigest] {
            var retries = 0
            var failures = 0
            var decisions: [P.Decision] = []
            for _ in 0..<10 {
                let decision = P.decide(
                    previousFailures: failures, lastAttempt: last, stored: .usable, challengeIsStale: false,
                    staleRetries: 0, acceptedSinceSent: true, retriesAfterAcceptance: retries
                )
                decisions.append(decision)
                failures += 1
                guard decision == .answerFromStore else { break }
                retries += 1
            }
            #expect(decisions == Array(repeating: .answerFromStore, count: P.maxRetriesAfterAcceptance) + [.passToClient])
            // The same refusal without an acceptance meanwhile marks the password at once.
            #expect(
                P.decide(previousFailures: 1, lastAttempt: last, stored: .usable, challengeIsStale: false, staleRetries: 0)
                    == .markStoredFailedAndPassToClient
            )
            // A credential already marked failed is not sent again, acceptance or not.
            #expect(
                P.decide(
                    previousFailures: 1, lastAttempt: last, stored: .markedFailed, challengeIsStale: false, staleRetries: 0,
                    acceptedSinceSent: true
                ) == .passToClient
            )
        }
    }

    /// Drives one request against a server that refuses everything (optionally always saying
    /// stale): the broker must stop after a few attempts and never loop.
    @Test("a request never loops, whatever the server answers", arguments: [false, true])
    func neverLoops(alwaysStale: Bool) {
        for preemptive in [false, true] {
            var stored = P.StoredCredential.usable
            var last: P.LastAttempt = preemptive ? .preemptiveDigest : .noCredentials
            var failures = 0
            var staleRetries = 0
            var storedSends = preemptive ? 1 : 0
            var ended = false
            for _ in 0..<20 {
                let decision = P.decide(
                    previousFailures: failures, lastAttempt: last, stored: stored, challengeIsStale: alwaysStale,
                    staleRetries: staleRetries
                )
                failures += 1
                switch decision {
                case .answerFromStore:
                    if alwaysStale, last != .noCredentials { staleRetries += 1 }
                    last = .storedCredential
                    storedSends += 1
                    continue
                case .markStoredFailedAndPassToClient:
                    stored = .markedFailed
                case .passToClient:
                    break
                }
                ended = true
                break
            }
            #expect(ended)
            #expect(storedSends <= 3)
            // A wrong password is sent once per request, up front or as an answer, never twice.
            if !alwaysStale { #expect(storedSends == 1) }
            #expect(stored == (alwaysStale ? .usable : .markedFailed))
            #expect(!P.mayPreempt(stored: stored) || alwaysStale)
        }
    }
}
