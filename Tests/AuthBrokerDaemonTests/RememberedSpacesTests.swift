import AuthBrokerCore
@testable import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import AuthBrokerTrust
import Foundation
import Logging
import NIOHTTP1
import Testing
import TestSupport

/// What the daemon remembers per origin stays bounded when an origin varies its realm on every
/// response (a hostile origin, or one that puts a request id in the realm).
@Suite("Remembered protection spaces")
struct RememberedSpacesTests {
    /// An authenticator over an empty session vault, in `directory`.
    static func authenticator(
        directory: String, maxAuthSpaces: Int = 16, trialWait: Duration = HTTPAuthenticator.defaultTrialWait
    ) throws -> (HTTPAuthenticator, PasswordVault) {
        let logger = Logger(label: "remembered-spaces-tests", factory: { _ in SwiftLogNoOpLogHandler() })
        let store = try TrustStore(path: directory + "/trust.json")
        let evaluator = TrustEvaluator(
            systemAnchorsPath: directory + "/no-bundle.pem", store: store, cacheSize: 8, cacheTTL: .seconds(60), logger: logger
        )
        let vault = PasswordVault()
        let challenges = AgentChallenges(vault: vault, store: store, evaluator: evaluator, logger: logger)
        return (HTTPAuthenticator(vault: vault, challenges: challenges, maxAuthSpaces: maxAuthSpaces, trialWait: trialWait, logger: logger), vault)
    }

    @Test("stale=true to a fresh Digest answer (its nonce outlived by a slow agent) is answered with the new nonce, the password not marked")
    func staleNonceOnAFreshAnswer() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory)
        let origin = try CanonicalOrigin(parsing: "http://stale.test")
        try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        func challenge(nonce: String, stale: Bool) -> HTTPResponseHead {
            let value = "Digest realm=\"r\", nonce=\"\(nonce)\", qop=\"auth\", algorithm=SHA-256" + (stale ? ", stale=true" : "")
            return HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: HTTPHeaders([("WWW-Authenticate", value)]))
        }
        var state = RequestAuthState(headers: HTTPHeaders())
        let first = await authenticator.answerChallenge(
            challenge(nonce: "n1", stale: false), origin: origin, method: .GET, uri: "/x", resendableBody: .bytes([]), state: &state
        )
        #expect(first)
        #expect(state.authorization?.contains("nonce=\"n1\"") == true)
        let second = await authenticator.answerChallenge(
            challenge(nonce: "n2", stale: true), origin: origin, method: .GET, uri: "/x", resendableBody: .bytes([]), state: &state
        )
        #expect(second, "a stale nonce on the request's own fresh answer was taken as a refusal")
        #expect(state.authorization?.contains("nonce=\"n2\"") == true)
        #expect(state.authorization?.contains("nc=00000001") == true)
        #expect(vault.cachedCredential(for: ProtectionSpace(origin: origin, realm: "r", authScheme: "Digest"))?.state == .usable)
        // Accepted: the session with the new nonce is the space's from now on.
        authenticator.responseAccepted(HTTPResponseHead(version: .http1_1, status: .ok), origin: origin, uri: "/x", state: state)
        var next = RequestAuthState(headers: HTTPHeaders())
        authenticator.authorizePreemptively(origin: origin, method: .GET, uri: "/x", state: &next)
        #expect(next.authorization?.contains("nonce=\"n2\"") == true && next.authorization?.contains("nc=00000002") == true, "\(next.authorization ?? "none")")
    }

    @Test("a Basic password goes up front as the challenge had it answered: NFC only under charset=\"UTF-8\"", arguments: [false, true])
    func preemptiveBasicMatchesTheAnswer(charsetUTF8: Bool) async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory)
        let origin = try CanonicalOrigin(parsing: "http://nfc.test")
        // "é" as e + combining acute (a password manager's export): NFC would change its bytes.
        try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "caf\u{65}\u{301}"), persistence: .session)
        let value = "Basic realm=\"r\"" + (charsetUTF8 ? ", charset=\"UTF-8\"" : "")
        var state = RequestAuthState(headers: HTTPHeaders())
        let answered = await authenticator.answerChallenge(
            HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: HTTPHeaders([("WWW-Authenticate", value)])),
            origin: origin, method: .GET, uri: "/d/x", resendableBody: .bytes([]), state: &state
        )
        #expect(answered)
        let sent = try #require(state.authorization)
        authenticator.responseAccepted(HTTPResponseHead(version: .http1_1, status: .ok), origin: origin, uri: "/d/x", state: state)
        var next = RequestAuthState(headers: HTTPHeaders())
        authenticator.authorizePreemptively(origin: origin, method: .GET, uri: "/d/y", state: &next)
        #expect(next.authorization == sent, "the password went up front in other bytes than the accepted answer")
    }

    @Test("a Proxy-Authentication-Info from beyond the proxy (a plain-http origin's) never sets the proxy's next nonce")
    func proxyNextNonceOnlyFromTheProxy() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory)
        let proxy = try CanonicalOrigin(parsing: "http://proxy.test:3128")
        try await vault.add(origin: proxy, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        let uri = "http://site.test/a"
        var state = RequestAuthState(headers: HTTPHeaders())
        let challenge = HTTPHeaders([("Proxy-Authenticate", "Digest realm=\"proxy\", nonce=\"n1\", qop=\"auth\", algorithm=SHA-256")])
        let answered = await authenticator.answerChallenge(
            HTTPResponseHead(version: .http1_1, status: .proxyAuthenticationRequired, headers: challenge),
            origin: proxy, method: .GET, uri: uri, resendableBody: .bytes([]), isProxy: true, state: &state
        )
        #expect(answered)
        // The origin's 200 carries a Proxy-Authentication-Info of its own making.
        let forged = HTTPResponseHead(version: .http1_1, status: .ok, headers: HTTPHeaders([("Proxy-Authentication-Info", "nextnonce=\"evil\"")]))
        authenticator.responseAccepted(forged, origin: proxy, uri: uri, fromBeyondProxy: true, state: state)
        var next = RequestAuthState(headers: HTTPHeaders())
        authenticator.authorizePreemptively(origin: proxy, method: .GET, uri: "http://site.test/b", isProxy: true, state: &next)
        let sent = try #require(next.authorization)
        #expect(sent.contains("nonce=\"n1\"") && !sent.contains("evil"), "\(sent)")
        // A wrong rspauth from beyond the proxy is not held against the proxy either: its space
        // stays known, so the next request still answers it up front.
        let wrong = HTTPResponseHead(
            version: .http1_1, status: .ok, headers: HTTPHeaders([("Proxy-Authentication-Info", "rspauth=\"00\", nextnonce=\"evil2\"")])
        )
        authenticator.responseAccepted(wrong, origin: proxy, uri: "http://site.test/b", fromBeyondProxy: true, state: next)
        var after = RequestAuthState(headers: HTTPHeaders())
        authenticator.authorizePreemptively(origin: proxy, method: .GET, uri: "http://site.test/c", isProxy: true, state: &after)
        #expect(after.authorization?.contains("nonce=\"n1\"") == true, "\(after.authorization ?? "none: the proxy's space was forgotten")")
    }

    static func basic401(realm: String = "r") -> HTTPResponseHead {
        HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: HTTPHeaders([("WWW-Authenticate", "Basic realm=\"\(realm)\"")]))
    }

    /// Answers a Basic 401 at `origin` for a request whose state is `state`; false if the
    /// answer did not come within `within` (the request would have hung).
    static func answer(
        _ authenticator: HTTPAuthenticator, origin: CanonicalOrigin, realm: String = "r", state: RequestAuthState, within: Duration
    ) async -> (answered: Bool, state: RequestAuthState)? {
        await withTaskGroup(of: (Bool, RequestAuthState)?.self) { group in
            group.addTask {
                var state = state
                let answered = await authenticator.answerChallenge(
                    Self.basic401(realm: realm), origin: origin, method: .GET, uri: "/x", resendableBody: .bytes([]), state: &state
                )
                return (answered, state)
            }
            group.addTask {
                try? await Task.sleep(for: within)
                return nil
            }
            let first = await group.next() ?? nil
            group.cancelAll()
            return first
        }
    }

    @Test("a request waiting for another's try of a password resumes when that request ends without a verdict, at once")
    func releasedTrialLetsTheWaiterTry() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory, trialWait: .seconds(60))
        let origin = try CanonicalOrigin(parsing: "http://trial.test")
        try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        guard let trial = await Self.answer(authenticator, origin: origin, state: RequestAuthState(headers: HTTPHeaders()), within: .seconds(5)) else {
            Issue.record("the first request did not become the trial")
            return
        }
        #expect(trial.answered)
        async let waiter = Self.answer(authenticator, origin: origin, state: RequestAuthState(headers: HTTPHeaders()), within: .seconds(10))
        try await Task.sleep(for: .milliseconds(200))
        #expect(authenticator.rememberedCounts.trialWaiters == 1)
        // The trial's client leaves before its answer comes back.
        authenticator.requestEnded(trial.state)
        let waited = await waiter
        #expect(waited?.answered == true, "the waiter sat out the whole wait for a trial nobody held")
        #expect(authenticator.rememberedCounts.trialWaiters == 0)
    }

    @Test("a waiting request whose trial entry is pushed out of the bounded table still resumes (no hang)")
    func evictedTrialDoesNotStrandItsWaiter() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory, maxAuthSpaces: 2, trialWait: .milliseconds(300))
        let origins = try (0..<4).map { try CanonicalOrigin(parsing: "http://evict\($0).test") }
        for origin in origins {
            try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        }
        _ = await Self.answer(authenticator, origin: origins[0], state: RequestAuthState(headers: HTTPHeaders()), within: .seconds(5))
        async let waiter = Self.answer(authenticator, origin: origins[0], state: RequestAuthState(headers: HTTPHeaders()), within: .seconds(5))
        try await Task.sleep(for: .milliseconds(100))
        // Trials at other origins push the first one's entry out.
        for origin in origins.dropFirst() {
            _ = await Self.answer(authenticator, origin: origin, state: RequestAuthState(headers: HTTPHeaders()), within: .seconds(5))
        }
        let waited = await waiter
        #expect(waited != nil, "the waiter never resumed")
        #expect(waited?.answered == true)
    }

    @Test("a Basic 401 a Digest-only password cannot answer leaves no trial behind; a refusal ends the password's proven standing")
    func trialsEndWhenNothingIsSent() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory)
        let origin = try CanonicalOrigin(parsing: "http://digest-only.test")
        try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        var state = RequestAuthState(headers: HTTPHeaders())
        let digest = HTTPHeaders([("WWW-Authenticate", "Digest realm=\"d\", nonce=\"n\", qop=\"auth\", algorithm=SHA-256")])
        #expect(
            await authenticator.answerChallenge(
                HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: digest), origin: origin, method: .GET, uri: "/d/x",
                resendableBody: .bytes([]), state: &state
            )
        )
        authenticator.responseAccepted(HTTPResponseHead(version: .http1_1, status: .ok), origin: origin, uri: "/d/x", state: state)
        #expect(authenticator.rememberedCounts.trials == 1)
        for _ in 0..<2 {
            let basic = await Self.answer(authenticator, origin: origin, realm: "b", state: RequestAuthState(headers: HTTPHeaders()), within: .seconds(5))
            #expect(basic?.answered == false, "sent as Basic after Digest, or waited for a trial nobody holds")
        }
        #expect(authenticator.rememberedCounts.trials == 1, "a request that sent nothing left a trial behind")

        // The proven Digest password is refused later (changed at the server): not proven any more.
        var refused = RequestAuthState(headers: HTTPHeaders())
        authenticator.authorizePreemptively(origin: origin, method: .GET, uri: "/d/y", state: &refused)
        #expect(refused.authorization != nil)
        _ = await authenticator.answerChallenge(
            HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: digest), origin: origin, method: .GET, uri: "/d/y",
            resendableBody: .bytes([]), state: &refused
        )
        #expect(authenticator.rememberedCounts.trials == 0, "a refused password kept its proven standing")
    }

    @Test("an origin that changes its Digest realm each time: the tables stay within max_auth_spaces, the newest is kept")
    func varyingRealmIsBounded() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (authenticator, vault) = try Self.authenticator(directory: directory)
        let origins = try (0..<3).map { try CanonicalOrigin(parsing: "http://realms\($0).test") }
        for origin in origins {
            try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        }

        for round in 0..<200 {
            let origin = origins[round % origins.count]
            var challenge = HTTPHeaders()
            challenge.add(name: "WWW-Authenticate", value: "Digest realm=\"request-\(round)\", nonce=\"n\(round)\", qop=\"auth\", algorithm=SHA-256")
            var state = RequestAuthState(headers: HTTPHeaders())
            let answered = await authenticator.answerChallenge(
                HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: challenge),
                origin: origin, method: .GET, uri: "/r\(round)", resendableBody: .bytes([]), state: &state
            )
            #expect(answered, "round \(round)")
            authenticator.responseAccepted(HTTPResponseHead(version: .http1_1, status: .ok), origin: origin, uri: "/r\(round)", state: state)
        }
        let counts = authenticator.rememberedCounts
        #expect(counts.digestSessions <= 16)
        #expect(counts.acceptances <= 16)
        #expect(counts.authorities <= 16)
        #expect(counts.digestSessions == 16, "the table is used up to its bound, not emptied")

        // The most recently used origin is still known.
        #expect(authenticator.knowsSpaces(at: origins[199 % origins.count]))
    }
}
