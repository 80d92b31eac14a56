import AuthBrokerClient
import Foundation
import NIOConcurrencyHelpers
import NIOPosix
import Testing
import TestSupport

/// The app's challenge handler answers the Basic/Digest 401s the daemon passes through, against
/// an origin that verifies every answer itself.
@Suite("BrokerClient challenges")
struct ChallengeTests {
    static let user = "alice"
    static let password = "Wonderland-Secret-42"

    static func base(_ origin: TestAuthOrigin) -> String { "http://auth.internal.test:\(origin.port)" }

    /// Records each challenge the handler saw and answers from a script.
    final class ScriptedHandler: Sendable {
        private let state = NIOLockedValueBox<(seen: [BrokerAuthenticationChallenge], answers: [BrokerChallengeDisposition], onEventLoop: Bool)>(([], [], false))

        init(_ answers: [BrokerChallengeDisposition]) {
            state.withLockedValue { $0.answers = answers }
        }

        var seen: [BrokerAuthenticationChallenge] { state.withLockedValue { $0.seen } }
        /// Whether any call came on a NIO event loop thread (it must not).
        var calledOnEventLoop: Bool { state.withLockedValue { $0.onEventLoop } }

        var handler: BrokerChallengeHandler {
            { challenge in
                let onEventLoop = MultiThreadedEventLoopGroup.currentEventLoop != nil
                return self.state.withLockedValue { state in
                    state.onEventLoop = state.onEventLoop || onEventLoop
                    state.seen.append(challenge)
                    return state.answers.isEmpty ? .performDefaultHandling : state.answers.removeFirst()
                }
            }
        }
    }

    @Test(
        "useCredential: the library answers Basic and every Digest algorithm; the origin verifies it",
        arguments: ["/basic/docs/page", "/digest/MD5/auth/file", "/digest/SHA-256/auth-int/file", "/digest/SHA-512-256-sess/auth/file", "/digest/SHA-256/none/file"]
    )
    func useCredential(path: String) async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let script = ScriptedHandler([.useCredential(user: Self.user, password: Self.password, persistence: .none)])
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)]), challengeHandler: script.handler) { _, client in
            let (data, head) = try await client.data(
                for: BrokerRequest(url: try url(Self.base(origin) + path + "?q=1"), method: "POST", body: .data(Data("a replayable body".utf8)))
            )
            #expect(head.status == 200, "\(String(decoding: data, as: UTF8.self))")
            #expect(String(decoding: data, as: UTF8.self) == "hello \(Self.user)")
            #expect(script.seen.count == 1)
            let space = try #require(script.seen.first).protectionSpace
            #expect(space.host == "auth.internal.test")
            #expect(space.port == origin.port)
            #expect(space.urlScheme == "http")
            #expect(space.authenticationScheme == (path.hasPrefix("/basic") ? .basic : .digest))
            #expect(space.realm == (path.hasPrefix("/basic") ? TestAuthOrigin.basicRealm : TestAuthOrigin.digestRealm))
            #expect(script.seen.first?.previousFailureCount == 0)
            #expect(!script.calledOnEventLoop)
            #expect(origin.stats.successes == 1)
            #expect(origin.stats.failures == 0)
        }
    }

    @Test("a wrong password comes back with previousFailureCount 1; the right one then succeeds")
    func failureCount() async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let script = ScriptedHandler([
            .useCredential(user: Self.user, password: "wrong", persistence: .none),
            .useCredential(user: Self.user, password: Self.password, persistence: .none),
        ])
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)]), challengeHandler: script.handler) { _, client in
            let (_, head) = try await client.data(for: BrokerRequest(url: try url(Self.base(origin) + "/digest/SHA-256/auth/x")))
            #expect(head.status == 200)
            #expect(script.seen.map(\.previousFailureCount) == [0, 1])
            #expect(origin.stats.failures == 1)
            #expect(origin.stats.successes == 1)
        }
    }

    @Test("performDefaultHandling returns the 401; no handler returns it too")
    func performDefaultHandling() async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let script = ScriptedHandler([.performDefaultHandling])
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)]), challengeHandler: script.handler) { daemon, client in
            let (_, head) = try await client.data(for: BrokerRequest(url: try url(Self.base(origin) + "/basic/x")))
            #expect(head.status == 401)
            #expect(head.headers["WWW-Authenticate"]?.hasPrefix("Basic") == true)
            #expect(script.seen.count == 1)

            let plain = BrokerClient(socketPath: daemon.socketPath)
            let (_, again) = try await plain.data(for: BrokerRequest(url: try url(Self.base(origin) + "/basic/x")))
            #expect(again.status == 401)
            #expect(origin.stats.successes == 0)
        }
    }

    @Test("cancel throws challengeCancelled")
    func cancel() async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let script = ScriptedHandler([.cancel])
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)]), challengeHandler: script.handler) { _, client in
            await #expect(throws: BrokerClientError.challengeCancelled) {
                _ = try await client.send(BrokerRequest(url: try url(Self.base(origin) + "/digest/MD5/auth/x")))
            }
            #expect(script.seen.count == 1)
        }
    }

    @Test("rejectProtectionSpace moves to the next challenge; the handler sees only Digest and Basic, strongest first")
    func rejectAndFiltering() async throws {
        let origin = try await TestOrigin.start(name: "mixed")
        defer { Task { await origin.stop() } }
        let script = ScriptedHandler([.rejectProtectionSpace, .rejectProtectionSpace])
        try await withDaemon(config: configText(resolving: [("mixed.internal.test", origin.port)]), challengeHandler: script.handler) { _, client in
            let (_, head) = try await client.data(for: BrokerRequest(url: try url("http://mixed.internal.test:\(origin.port)/offer-challenges")))
            #expect(head.status == 401)
            #expect(script.seen.map(\.protectionSpace.authenticationScheme) == [.digest, .basic])
            #expect(script.seen.allSatisfy { $0.protectionSpace.realm == "mixed@test" })
            #expect(script.seen.allSatisfy { $0.previousFailureCount == 0 })

            // Only Bearer offered: the daemon strips it, the handler is never called.
            let bearer = ScriptedHandler([.cancel])
            var client2 = client
            client2.challengeHandler = bearer.handler
            let (_, bearerHead) = try await client2.data(for: BrokerRequest(url: try url("http://mixed.internal.test:\(origin.port)/offer-challenges/bearer")))
            #expect(bearerHead.status == 401)
            #expect(bearer.seen.isEmpty)
        }
    }

    @Test("a streamed body cannot be replayed: the 401 is the response and the handler is not asked")
    func streamedBodyGets401() async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let script = ScriptedHandler([.useCredential(user: Self.user, password: Self.password, persistence: .none)])
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)]), challengeHandler: script.handler) { _, client in
            let request = BrokerRequest(
                url: try url(Self.base(origin) + "/basic/upload"), method: "PUT", body: .stream(PatternChunks(total: 1000, chunkSize: 100))
            )
            let (_, head) = try await client.data(for: request)
            #expect(head.status == 401)
            #expect(script.seen.isEmpty)
        }
    }

    @Test("persistence reaches the daemon as Authbroker-Persist (session, permanent) and never the origin", arguments: [CredentialPersistence.forSession, .permanent])
    func persistenceHeader(persistence: CredentialPersistence) async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        let echo = try await TestOrigin.start(name: "echo")
        defer { Task { await origin.stop(); await echo.stop() } }
        let config = configText(resolving: [("auth.internal.test", origin.port), ("echo.internal.test", echo.port)])
        let script = ScriptedHandler([.useCredential(user: Self.user, password: Self.password, persistence: persistence)])
        try await withDaemon(config: config) { daemon, _ in
            let relay = try await RecordingRelay.start(at: daemon.directory + "/relay.sock", forwardingTo: daemon.socketPath)
            defer { Task { await relay.stop() } }
            let client = BrokerClient(socketPath: relay.socketPath, challengeHandler: script.handler)
            let (_, head) = try await client.data(for: BrokerRequest(url: try url(Self.base(origin) + "/basic/x")))
            #expect(head.status == 200)
            let expected = persistence == .permanent ? "permanent" : "session"
            let sent = relay.text.lowercased()
            #expect(sent.contains("authbroker-persist: \(expected)\r\n"), "the resend asks the daemon to keep the credential")
            #expect(sent.components(separatedBy: "authbroker-persist").count == 2, "only on the request that carries the credential")

            // The daemon never forwards Authbroker-* upstream.
            var headers = BrokerHeaders()
            headers.add("Authbroker-Persist", expected)
            let (data, _) = try await client.data(for: BrokerRequest(url: try url("http://echo.internal.test:\(echo.port)/headers"), headers: headers))
            let text = String(decoding: data, as: UTF8.self).lowercased()
            #expect(text.contains("\"host\""))
            #expect(!text.contains("authbroker-"), "\(text)")
        }
    }

    @Test("a permanent Basic credential the app gave is kept by the daemon: a new client without a handler is let in, across a daemon restart")
    func permanentCredentialReused() async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let config = configText(resolving: [("auth.internal.test", origin.port)])
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let script = ScriptedHandler([.useCredential(user: Self.user, password: Self.password, persistence: .permanent)])
        let first = try await DaemonProcess.start(config: config, directory: directory)
        let answered = try await BrokerClient(socketPath: first.socketPath, challengeHandler: script.handler)
            .data(for: BrokerRequest(url: try url(Self.base(origin) + "/basic/x")))
        #expect(answered.1.status == 200)
        // The daemon keeps it off the response path: wait until it is listed.
        var kept = false
        for _ in 0..<100 where !kept {
            kept = (try? await BrokerClient(socketPath: first.socketPath).passwords().contains { $0.persistence == "permanent" }) == true
            if !kept { try await Task.sleep(for: .milliseconds(20)) }
        }
        #expect(kept)
        await first.stop()

        let second = try await DaemonProcess.start(config: config, directory: directory)
        defer { Task { await second.stop(); second.cleanUp() } }
        let plain = BrokerClient(socketPath: second.socketPath)
        let (data, head) = try await plain.data(for: BrokerRequest(url: try url(Self.base(origin) + "/basic/y")))
        #expect(head.status == 200, "\(String(decoding: data, as: UTF8.self))")
        #expect(script.seen.count == 1)
    }

    @Test("stale=true (right credentials, expired nonce) is answered again with the new nonce without asking the handler")
    func staleNonce() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "auth", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(nonceLifetime: .milliseconds(300))
        )
        defer { Task { await origin.stop() } }
        let slow: BrokerChallengeHandler = { _ in
            // Slower than the nonce lives: the answer arrives with an expired nonce.
            try? await Task.sleep(for: .milliseconds(600))
            return .useCredential(user: Self.user, password: Self.password, persistence: .none)
        }
        let calls = NIOLockedValueBox(0)
        let counting: BrokerChallengeHandler = { challenge in
            calls.withLockedValue { $0 += 1 }
            return await slow(challenge)
        }
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)]), challengeHandler: counting) { _, client in
            let (_, head) = try await client.data(for: BrokerRequest(url: try url(Self.base(origin) + "/digest/SHA-256/auth/x")))
            #expect(head.status == 200)
            #expect(origin.stats.stale == 1)
            #expect(origin.stats.successes == 1)
            #expect(calls.withLockedValue { $0 } == 1)
        }
    }
}
