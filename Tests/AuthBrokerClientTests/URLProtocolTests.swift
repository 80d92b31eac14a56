import AuthBrokerClient
import Foundation
import NIOConcurrencyHelpers
import Testing
import TestSupport

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// URLSession with BrokerURLProtocol first: requests go through the daemon; 401s never become
/// URLAuthenticationChallenges (see the README on FoundationNetworking).
///
/// Serialized: `BrokerURLProtocol`'s settings are static.
@Suite("BrokerURLProtocol", .serialized)
struct URLProtocolTests {
    static let user = "alice"
    static let password = "Wonderland-Secret-42"

    /// Counts the challenges the session delegate is offered (none is expected).
    final class ChallengeCountingDelegate: NSObject, URLSessionTaskDelegate, Sendable {
        let challenges = NIOLockedValueBox(0)

        func urlSession(
            _ session: URLSession, task: URLSessionTask, didReceive challenge: URLAuthenticationChallenge,
            completionHandler: @escaping @Sendable (URLSession.AuthChallengeDisposition, URLCredential?) -> Void
        ) {
            challenges.withLockedValue { $0 += 1 }
            completionHandler(.useCredential, URLCredential(user: URLProtocolTests.user, password: URLProtocolTests.password, persistence: .none))
        }
    }

    static func session(socketPath: String, delegate: (any URLSessionDelegate)? = nil) -> URLSession {
        BrokerURLProtocol.socketPath = socketPath
        let configuration = URLSessionConfiguration.ephemeral
        configuration.protocolClasses = [BrokerURLProtocol.self] + (configuration.protocolClasses ?? [])
        return URLSession(configuration: configuration, delegate: delegate, delegateQueue: nil)
    }

    /// `session.data(for:)` as a continuation over the completion-handler API (present on Linux).
    static func fetch(_ session: URLSession, _ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        try await withCheckedThrowingContinuation { continuation in
            session.dataTask(with: request) { data, response, error in
                if let error {
                    continuation.resume(throwing: error)
                } else if let response = response as? HTTPURLResponse {
                    continuation.resume(returning: (data ?? Data(), response))
                } else {
                    continuation.resume(throwing: TestSupportError("no HTTP response"))
                }
            }.resume()
        }
    }

    @Test("GET and POST through the daemon: status, headers and body as the origin sent them, bytes streamed")
    func getAndPost() async throws {
        let origin = try await TestOrigin.start(name: "session")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { daemon, _ in
            BrokerURLProtocol.challengeHandler = nil
            let session = Self.session(socketPath: daemon.socketPath)
            let (data, response) = try await Self.fetch(session, URLRequest(url: try url("http://origin.internal.test:\(origin.port)/hello")))
            #expect(response.statusCode == 200)
            #expect(String(decoding: data, as: UTF8.self) == "hello from session")
            #expect((response.allHeaderFields["Via"] as? String)?.contains("authbrokerd") == true)
            #expect(response.allHeaderFields["Authbroker-Request-Id"] != nil)

            let size = 5 * 1024 * 1024
            let (big, bigResponse) = try await Self.fetch(session, URLRequest(url: try url("http://origin.internal.test:\(origin.port)/bytes/\(size)")))
            #expect(bigResponse.statusCode == 200)
            let intact = big.count == size && BytePattern.matches(Array(big)[...], offset: 0)
            #expect(intact, "collected delivery: \(big.count) of \(size) bytes")

            var post = URLRequest(url: try url("http://origin.internal.test:\(origin.port)/echo"))
            post.httpMethod = "POST"
            post.httpBody = Data("posted through URLSession".utf8)
            let (echoed, _) = try await Self.fetch(session, post)
            #expect(String(decoding: echoed, as: UTF8.self) == "posted through URLSession")
            session.invalidateAndCancel()
        }
    }

    /// Collects a data task's chunks through the delegate and reports the end.
    final class CollectingDelegate: NSObject, URLSessionDataDelegate, Sendable {
        let state = NIOLockedValueBox<(chunks: Int, data: Data, done: CheckedContinuation<Void, any Error>?)>((0, Data(), nil))

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
            state.withLockedValue {
                $0.chunks += 1
                $0.data.append(data)
            }
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
            let done = state.withLockedValue { state in
                defer { state.done = nil }
                return state.done
            }
            if let error { done?.resume(throwing: error) } else { done?.resume() }
        }

        func run(_ session: URLSession, _ request: URLRequest) async throws -> (chunks: Int, data: Data) {
            try await withCheckedThrowingContinuation { continuation in
                state.withLockedValue { $0.done = continuation }
                session.dataTask(with: request).resume()
            }
            return state.withLockedValue { ($0.chunks, $0.data) }
        }
    }

    @Test("Linux: .streaming reaches a data delegate chunk by chunk; a completion handler then gets only the last chunk (FoundationNetworking)")
    func streamingDelivery() async throws {
        let origin = try await TestOrigin.start(name: "stream")
        defer { Task { await origin.stop() } }
        let size = 5 * 1024 * 1024
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { daemon, _ in
            BrokerURLProtocol.challengeHandler = nil
            BrokerURLProtocol.bodyDelivery = .streaming
            let defaultDelivery: BrokerURLProtocol.BodyDelivery = .collected(maxBytes: 256 * 1024 * 1024)
            defer { BrokerURLProtocol.bodyDelivery = defaultDelivery }
            let target = try url("http://origin.internal.test:\(origin.port)/bytes/\(size)")

            let delegate = CollectingDelegate()
            let session = Self.session(socketPath: daemon.socketPath, delegate: delegate)
            let (chunks, data) = try await delegate.run(session, URLRequest(url: target))
            let intact = data.count == size && BytePattern.matches(Array(data)[...], offset: 0)
            #expect(intact, "delegate: \(data.count) of \(size) bytes")
            #expect(chunks > 1)
            print("BrokerURLProtocol .streaming: the data delegate got \(size) bytes in \(chunks) chunks")
            session.invalidateAndCancel()

            #if canImport(FoundationNetworking)
            // FoundationNetworking's completion path keeps only the last didLoad chunk.
            let plain = Self.session(socketPath: daemon.socketPath)
            let (last, response) = try await Self.fetch(plain, URLRequest(url: target))
            #expect(response.statusCode == 200)
            #expect(last.count < size)
            print("BrokerURLProtocol .streaming with a completion handler on Linux: \(last.count) of \(size) bytes arrive")
            plain.invalidateAndCancel()
            #endif
        }
    }

    @Test("a daemon error fails the task with the BrokerError")
    func brokerErrorFailsTask() async throws {
        let leaf = try TestPKI.makeLeaf(dnsNames: ["self-signed.internal.test"], issuer: nil)
        let origin = try await TestOrigin.start(name: "self-signed", identity: leaf)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("self-signed.internal.test", origin.port)])) { daemon, _ in
            BrokerURLProtocol.challengeHandler = nil
            let session = Self.session(socketPath: daemon.socketPath)
            do {
                _ = try await Self.fetch(session, URLRequest(url: try url("https://self-signed.internal.test:\(origin.port)/hello")))
                Issue.record("an untrusted server must fail the task")
            } catch {
                print("URLSession error for an untrusted server through BrokerURLProtocol: \(type(of: error)): \(error)")
                #expect((error as? BrokerError)?.fingerprints == [leaf.sha256Fingerprint])
            }
            session.invalidateAndCancel()
        }
    }

    @Test("Linux: a 401 is the response, and the session delegate is never offered a challenge; the static handler's credential is used")
    func challenges() async throws {
        let origin = try await TestAuthOrigin.start(name: "auth", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("auth.internal.test", origin.port)])) { daemon, _ in
            let target = try url("http://auth.internal.test:\(origin.port)/digest/SHA-256/auth/x")
            let delegate = ChallengeCountingDelegate()

            // No handler: the delegate would answer with the right password, but it is never asked.
            BrokerURLProtocol.challengeHandler = nil
            let session = Self.session(socketPath: daemon.socketPath, delegate: delegate)
            let (_, unauthorized) = try await Self.fetch(session, URLRequest(url: target))
            #expect(unauthorized.statusCode == 401)
            #expect((unauthorized.allHeaderFields["Www-Authenticate"] ?? unauthorized.allHeaderFields["WWW-Authenticate"]) != nil)
            #expect(delegate.challenges.withLockedValue { $0 } == 0)
            #expect(origin.stats.successes == 0)

            // The static handler answers; the origin sees the credential through the daemon.
            BrokerURLProtocol.challengeHandler = { _ in .useCredential(user: Self.user, password: Self.password, persistence: .none) }
            defer { BrokerURLProtocol.challengeHandler = nil }
            let (data, authorized) = try await Self.fetch(session, URLRequest(url: target))
            #expect(authorized.statusCode == 200)
            #expect(String(decoding: data, as: UTF8.self) == "hello \(Self.user)")
            #expect(delegate.challenges.withLockedValue { $0 } == 0)
            #expect(origin.stats.successes == 1)
            session.invalidateAndCancel()
        }
    }
}
