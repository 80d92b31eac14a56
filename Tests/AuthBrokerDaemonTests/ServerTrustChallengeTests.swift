import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import AuthBrokerTrust
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Testing
import TestSupport

/// Server-trust challenges: the pure queue with both kinds of space, then `AgentChallenges`
/// (broker, store look-up by re-evaluation, agents' answers applied to a real trust store on
/// disk), without sockets.
@MainActor
@Suite("Server-trust challenges")
struct ServerTrustChallengeTests {
    typealias Queue = ChallengeQueue<ChallengeSpace, ChallengeAnswer, ContinuousClock.Instant>

    /// A client that stays connected (until the wait ends and cancels this).
    static let stays: @Sendable () async -> Void = { try? await Task.sleep(for: .seconds(3600)) }

    static func trustSpace(host: String = "nas.test", port: Int = 443, leaf: String = "AA", reasons: [String] = []) -> ChallengeSpace {
        .serverTrust(
            ServerTrustSpace(host: host, port: port, leafSHA256: leaf, failureCodes: ["self_signed"], reasons: reasons, chain: [], chainDER: [])
        )
    }

    @Test("the queue coalesces trust challenges per (host, port, leaf), whatever else differs")
    func queueCoalescing() {
        var queue = Queue()
        let now = ContinuousClock.now
        let deadline = now.advanced(by: .seconds(60))
        let first = queue.challengeRaised(request: 1, space: Self.trustSpace(reasons: ["a"]), interactive: true, deadline: deadline, now: now)
        #expect(first.resolve.count == 1)
        let same = queue.challengeRaised(request: 2, space: Self.trustSpace(reasons: ["b"]), interactive: true, deadline: deadline, now: now)
        #expect(same.isEmpty)
        let otherLeaf = queue.challengeRaised(request: 3, space: Self.trustSpace(leaf: "BB"), interactive: true, deadline: deadline, now: now)
        let otherPort = queue.challengeRaised(request: 4, space: Self.trustSpace(port: 8443), interactive: true, deadline: deadline, now: now)
        let otherHost = queue.challengeRaised(request: 5, space: Self.trustSpace(host: "b.test"), interactive: true, deadline: deadline, now: now)
        #expect(otherLeaf.resolve.count == 1 && otherPort.resolve.count == 1 && otherHost.resolve.count == 1)
        #expect(queue.pending.count == 4)
        #expect(queue.pending.first?.waiters == [1, 2])
    }

    @Test("a trust and a password challenge wait side by side; an answer to one resumes only its requests")
    func queueBothKinds() throws {
        var queue = Queue()
        let now = ContinuousClock.now
        let deadline = now.advanced(by: .seconds(60))
        let origin = try CanonicalOrigin(parsing: "https://nas.test")
        let http = ChallengeSpace.http(ProtectionSpace(origin: origin, realm: "r", authScheme: "basic"))
        let trustRaised = queue.challengeRaised(request: 1, space: Self.trustSpace(), interactive: true, deadline: deadline, now: now)
        let httpRaised = queue.challengeRaised(request: 2, space: http, interactive: true, deadline: deadline, now: now)
        let trustID = try #require(trustRaised.resolve.first?.challenge)
        let httpID = try #require(httpRaised.resolve.first?.challenge)
        _ = queue.storeAnswered(trustID, answer: nil)
        _ = queue.storeAnswered(httpID, answer: nil)
        let attached = queue.agentAttached(7)
        #expect(attached.offer.map(\.challenge) == [trustID, httpID])
        let answered = queue.agentAnswered(7, challenge: trustID, .answer(.serverTrusted))
        #expect(answered.resume == [.init(request: 1, resolution: .answered(.serverTrusted))])
        #expect(queue.pending.map(\.id) == [httpID])
    }

    // MARK: - AgentChallenges

    struct Fixture {
        let directory: String
        let store: TrustStore
        let evaluator: TrustEvaluator
        let challenges: AgentChallenges

        init() throws {
            self.directory = try DaemonProcess.makeTemporaryDirectory()
            self.store = try TrustStore(path: self.directory + "/trust.json")
            let logger = Logger(label: "trust-challenge-tests", factory: { _ in SwiftLogNoOpLogHandler() })
            self.evaluator = TrustEvaluator(
                systemAnchorsPath: self.directory + "/no-bundle.pem", store: self.store, cacheSize: 64, cacheTTL: .seconds(300),
                logger: logger
            )
            self.challenges = AgentChallenges(vault: PasswordVault(), store: self.store, evaluator: self.evaluator, logger: logger)
        }

        func untrusted(_ leaf: TestIdentity, chain: [TestIdentity] = [], host: String, port: Int) async throws -> UntrustedServer {
            let der = [leaf.der] + chain.map(\.der)
            let decision = await self.evaluator.evaluate(chainDER: der, host: host, port: port)
            #expect(!decision.isTrusted)
            let origin = try CanonicalOrigin(parsing: "https://\(host):\(port)")
            return BrokerError.untrustedServer(origin: origin, decision: decision, chainDER: der).serverTrustFailure!  // untrustedServer(...) always sets it
        }

        func cleanUp() { try? FileManager.default.removeItem(atPath: self.directory) }
    }

    /// Waits for the next offer on `events` and returns its challenge id and space.
    static func nextOffer(
        _ events: inout AsyncStream<AgentChallenges.AgentEvent>.Iterator
    ) async -> (id: UInt64, space: ChallengeSpace)? {
        while let event = await events.next(isolation: #isolation) {
            if case .offered(let id, let space, _) = event { return (id, space) }
        }
        return nil
    }

    @Test("20 concurrent requests to one untrusted server make one offer; 'once' lets all of them through")
    func twentyRequestsOneOffer() async throws {
        let fixture = try Fixture()
        defer { fixture.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["nas.test"], issuer: nil)
        let untrusted = try await fixture.untrusted(leaf, host: "nas.test", port: 5001)
        let agent = await fixture.challenges.attachAgent()
        let challenges = fixture.challenges
        let requests = Task {
            await withTaskGroup(of: Bool.self) { group in
                for _ in 0..<20 {
                    group.addTask {
                        await challenges.serverTrusted(untrusted, wait: .seconds(60), requester: nil, clientGone: Self.stays)
                    }
                }
                var results: [Bool] = []
                for await result in group { results.append(result) }
                return results
            }
        }
        var events = agent.events.makeAsyncIterator()
        let offer = try #require(await Self.nextOffer(&events))
        guard case .serverTrust(let space) = offer.space else {
            Issue.record("expected a server-trust offer, got \(offer.space)")
            return
        }
        #expect(space.host == "nas.test" && space.port == 5001 && space.leafSHA256 == leaf.sha256Fingerprint)
        #expect(space.failureCodes == ["self_signed"])
        #expect(space.chain.first?.sha256 == leaf.sha256Fingerprint)
        while fixture.challenges.broker.pending.first?.challenge.waiters.count != 20 {
            try await Task.sleep(for: .milliseconds(5))
        }
        try await fixture.challenges.agentReplied(agent: agent.id, challenge: offer.id, .serverTrust(.once))
        let results = await requests.value
        #expect(results == Array(repeating: true, count: 20))
        #expect(fixture.store.exceptions().session.map(\.sha256) == [leaf.sha256Fingerprint])
        #expect(fixture.store.exceptions().saved.isEmpty)
        #expect(fixture.challenges.broker.pending.isEmpty)

        // A request that failed before the answer but asks after it: the store (re-evaluation) answers, no offer.
        #expect(await fixture.challenges.serverTrusted(untrusted, wait: .seconds(60), requester: nil, clientGone: Self.stays))
        #expect(fixture.challenges.broker.pending.isEmpty)
        await fixture.challenges.detachAgent(agent.id)
    }

    @Test("'always' with scope exception saves the exception; with scope anchor adds the chain's top for the host")
    func alwaysAnswers() async throws {
        let fixture = try Fixture()
        defer { fixture.cleanUp() }
        let agent = await fixture.challenges.attachAgent()
        var events = agent.events.makeAsyncIterator()

        let selfSigned = try TestPKI.makeLeaf(dnsNames: ["a.test"], issuer: nil)
        let first = try await fixture.untrusted(selfSigned, host: "a.test", port: 443)
        let exceptionAsk = Task { await fixture.challenges.serverTrusted(first, wait: .seconds(60), requester: nil, clientGone: Self.stays) }
        let offer1 = try #require(await Self.nextOffer(&events))
        try await fixture.challenges.agentReplied(agent: agent.id, challenge: offer1.id, .serverTrust(.alwaysException))
        #expect(await exceptionAsk.value)
        #expect(try TrustStore(path: fixture.directory + "/trust.json").exceptions().saved.map(\.sha256) == [selfSigned.sha256Fingerprint])

        let ca = try TestPKI.makeCA(commonName: "Home CA")
        let issued = try TestPKI.makeLeaf(dnsNames: ["b.test"], issuer: ca)
        let second = try await fixture.untrusted(issued, chain: [ca], host: "b.test", port: 443)
        let anchorAsk = Task { await fixture.challenges.serverTrusted(second, wait: .seconds(60), requester: nil, clientGone: Self.stays) }
        let offer2 = try #require(await Self.nextOffer(&events))
        try await fixture.challenges.agentReplied(agent: agent.id, challenge: offer2.id, .serverTrust(.alwaysAnchor))
        #expect(await anchorAsk.value)
        let anchors = fixture.store.anchors()
        #expect(anchors.map(\.certificate.sha256) == [ca.sha256Fingerprint])
        #expect(anchors.first?.hosts.map(\.description) == ["b.test"])
        // Scoped to the host: the CA vouches for nothing else.
        let elsewhere = try TestPKI.makeLeaf(dnsNames: ["c.test"], issuer: ca)
        #expect(!(await fixture.evaluator.evaluate(chainDER: [elsewhere.der, ca.der], host: "c.test", port: 443).isTrusted))

        // A server that ends its chain with an anchor the user holds for other hosts (here the
        // same CA, for b.test): "always (anchor)" adds its host, and b.test keeps the anchor.
        let hostile = try TestPKI.makeLeaf(dnsNames: ["d.test"], issuer: nil)
        let third = try await fixture.untrusted(hostile, chain: [ca], host: "d.test", port: 443)
        let hostileAsk = Task { await fixture.challenges.serverTrusted(third, wait: .seconds(60), requester: nil, clientGone: Self.stays) }
        let offer3 = try #require(await Self.nextOffer(&events))
        try await fixture.challenges.agentReplied(agent: agent.id, challenge: offer3.id, .serverTrust(.alwaysAnchor))
        _ = await hostileAsk.value
        #expect(fixture.store.anchors().first?.hosts.map(\.description) == ["b.test", "d.test"])
        #expect(await fixture.evaluator.evaluate(chainDER: [issued.der, ca.der], host: "b.test", port: 443).isTrusted)
        await fixture.challenges.detachAgent(agent.id)
    }

    @Test("reject, a deadline, a disconnecting agent and a client that goes away all end in 'not trusted', and nothing stays pending")
    func notTrusted() async throws {
        let fixture = try Fixture()
        defer { fixture.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["r.test"], issuer: nil)
        let untrusted = try await fixture.untrusted(leaf, host: "r.test", port: 443)
        
        // Reject.
        let agent = await fixture.challenges.attachAgent()
        var events = agent.events.makeAsyncIterator()
        let rejected = Task { await fixture.challenges.serverTrusted(untrusted, wait: .seconds(60), requester: nil, clientGone: Self.stays) }
        let offer = try #require(await Self.nextOffer(&events))
        try await fixture.challenges.agentReplied(agent: agent.id, challenge: offer.id, .decline)
        #expect(await rejected.value == false)

        // Deadline.
        #expect(await fixture.challenges.serverTrusted(untrusted, wait: .milliseconds(100), requester: nil, clientGone: Self.stays) == false)

        // The agent disconnects mid-challenge.
        let orphaned = Task { await fixture.challenges.serverTrusted(untrusted, wait: .seconds(60), requester: nil, clientGone: Self.stays) }
        _ = try #require(await Self.nextOffer(&events))
        await fixture.challenges.detachAgent(agent.id)
        #expect(await orphaned.value == false)

        // The client goes away.
        let gone = await fixture.challenges.serverTrusted(
            untrusted, wait: .seconds(60), requester: nil, clientGone: { try? await Task.sleep(for: .milliseconds(50)) }
        )
        #expect(gone == false)
        #expect(fixture.challenges.broker.pending.isEmpty)
        #expect(fixture.store.exceptions().saved.isEmpty && fixture.store.exceptions().session.isEmpty)
        #expect(fixture.store.anchors().isEmpty)
    }

    @Test("an answer of the wrong kind is refused with wrong_answer_kind, and the challenge still waits")
    func wrongKind() async throws {
        let fixture = try Fixture()
        defer { fixture.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["w.test"], issuer: nil)
        let untrusted = try await fixture.untrusted(leaf, host: "w.test", port: 443)
        let agent = await fixture.challenges.attachAgent()
        var events = agent.events.makeAsyncIterator()
        let ask = Task { await fixture.challenges.serverTrusted(untrusted, wait: .seconds(60), requester: nil, clientGone: Self.stays) }
        let offer = try #require(await Self.nextOffer(&events))
        let wrong = await #expect(throws: BrokerError.self) {
            try await fixture.challenges.agentReplied(
                agent: agent.id, challenge: offer.id, .credential(PasswordCredential(user: "a", password: "b"), persistence: .none)
            )
        }
        #expect(wrong?.code == .wrongAnswerKind)
        #expect(fixture.challenges.broker.pending.count == 1)
        let gone = await #expect(throws: BrokerError.self) {
            try await fixture.challenges.agentReplied(agent: agent.id, challenge: 999, .serverTrust(.once))
        }
        #expect(gone?.code == .challengeNotFound)
        try await fixture.challenges.agentReplied(agent: agent.id, challenge: offer.id, .serverTrust(.once))
        #expect(await ask.value)
        await fixture.challenges.detachAgent(agent.id)
    }

    @Test("the exceptions control API: add, list (saved and once), remove, and typed errors")
    func exceptionsAPI() async throws {
        let fixture = try Fixture()
        defer { fixture.cleanUp() }
        let api = ControlAPI(
            store: fixture.store, vault: PasswordVault(), challenges: fixture.challenges,
            status: { StatusReport(version: "0", pid: 1, startedAt: Date(), uptimeSeconds: 0, socket: "", configFile: "", configLoaded: false, stateDirectory: "", systemAnchors: .init(path: "", count: 0), userAnchors: 0, pins: 0, counters: [:]) },
            inspect: { origin in throw BrokerError.connectionRefused(origin: origin) }
        )
        func call(_ method: HTTPMethod, _ path: String, query: String? = nil, json: String? = nil) async -> (Int, [String: Any]) {
            let response = await api.handle(
                method: method, path: path, query: query, body: ByteBuffer(string: json ?? ""), requestID: "t"
            )
            let object = (try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any] ?? [:]
            return (Int(response.status.code), object)
        }
        let sha = String(repeating: "ab", count: 32)
        let (created, added) = await call(.POST, "/v1/exceptions", json: #"{"host": "NAS.test:5001", "sha256": "\#(sha)"}"#)
        #expect(created == 201)
        let exception = added["exception"] as? [String: Any]
        #expect(exception?["host"] as? String == "nas.test")
        #expect(exception?["port"] as? Int == 5001)
        #expect(exception?["persistent"] as? Bool == true)
        #expect((exception?["sha256"] as? String)?.hasPrefix("AB:AB:") == true)

        try fixture.store.addException(host: HostPattern(parsing: "once.test"), port: 443, sha256: sha, persistent: false)
        let (listed, list) = await call(.GET, "/v1/exceptions")
        #expect(listed == 200)
        let entries = list["exceptions"] as? [[String: Any]] ?? []
        #expect(entries.map { $0["persistent"] as? Bool } == [true, false])

        #expect(await call(.POST, "/v1/exceptions", json: #"{"host": "nas.test:99999", "sha256": "\#(sha)"}"#).1["code"] as? String == "invalid_host")
        #expect(await call(.POST, "/v1/exceptions", json: #"{"host": "nas.test", "sha256": "12"}"#).1["code"] as? String == "invalid_fingerprint")
        #expect(await call(.DELETE, "/v1/exceptions", query: "host=nas.test").1["code"] as? String == "missing_parameter")

        let (removedStatus, removed) = await call(.DELETE, "/v1/exceptions", query: "host=nas.test%3A5001&sha256=\(sha)")
        #expect(removedStatus == 200)
        #expect((removed["removed"] as? [String: Any])?["port"] as? Int == 5001)
        let (missing, problem) = await call(.DELETE, "/v1/exceptions", query: "host=nas.test%3A5001&sha256=\(sha)")
        #expect(missing == 404)
        #expect(problem["code"] as? String == "not_found")
        #expect(await call(.PUT, "/v1/exceptions").0 == 405)
    }

    @Test("agent answers over the control API: trust, scope and decline are parsed; bad values are 400")
    func answerParsing() async throws {
        let fixture = try Fixture()
        defer { fixture.cleanUp() }
        let api = ControlAPI(
            store: fixture.store, vault: PasswordVault(), challenges: fixture.challenges,
            status: { StatusReport(version: "0", pid: 1, startedAt: Date(), uptimeSeconds: 0, socket: "", configFile: "", configLoaded: false, stateDirectory: "", systemAnchors: .init(path: "", count: 0), userAnchors: 0, pins: 0, counters: [:]) },
            inspect: { origin in throw BrokerError.connectionRefused(origin: origin) }
        )
        func code(_ json: String) async -> String? {
            let response = await api.handle(method: .POST, path: "/v1/agent/1/answer", query: nil, body: ByteBuffer(string: json), requestID: "t")
            let object = (try? JSONSerialization.jsonObject(with: Data(response.body.readableBytesView))) as? [String: Any]
            return object?["code"] as? String
        }
        #expect(await code(#"{"challenge": "5", "trust": "sometimes"}"#) == "invalid_trust")
        #expect(await code(#"{"challenge": "5", "trust": "always", "scope": "forest"}"#) == "invalid_scope")
        #expect(await code(#"{"challenge": "5", "trust": "once"}"#) == "challenge_not_found")
        #expect(await code(#"{"challenge": "5"}"#) == "missing_answer")
    }
}
