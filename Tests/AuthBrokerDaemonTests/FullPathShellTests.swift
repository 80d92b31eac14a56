import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing
import TestSupport

/// The full path (`Interceptor.proxy`) on testing channels: the test plays the client, through
/// the async channel the connection's task reads and writes, and the origin, on the upstream
/// connections the real pool makes; the password vault, authenticator and request state
/// machine are the daemon's own.
@Suite("Full path shell", .timeLimit(.minutes(1)))
struct FullPathShellTests {
    @Test("a 401 answered from the store: the origin gets the request again with the password, on the same connection; the client gets only the 200")
    func challengeAnswered() async throws {
        let harness = try await DataPlaneHarness()
        try await harness.vault.add(
            origin: CanonicalOrigin(parsing: DataPlaneHarness.origin), realm: "r",
            credential: PasswordCredential(user: "alice", password: "s3cret"), persistence: .session
        )
        let client = try await FullPathClient(harness, target: "/private")
        try await client.sendGet("/private")
        let upstream = try await harness.upstream(0)
        let first = try await harness.requestWritten(on: upstream)
        #expect(first.head.headers["Authorization"].isEmpty && first.ended)
        try await DataPlaneHarness.respond(on: upstream, status: .unauthorized, body: "who?", extra: ["WWW-Authenticate": "Basic realm=\"r\""])

        let second = try await harness.requestWritten(on: upstream)
        #expect(second.head.headers["Authorization"] == ["Basic " + Data("alice:s3cret".utf8).base64EncodedString()])
        #expect(second.head.uri == "/private" && second.ended)
        try await DataPlaneHarness.respond(on: upstream, status: .ok, body: "secret page")
        let response = try await client.response()
        #expect(response.head.status == .ok && response.body == "secret page" && response.ended)
        let outcome = try await client.outcome()
        #expect(outcome?.status == 200 && outcome?.disposition == .keepAlive)
        #expect(harness.upstreamCount == 1, "the 401's connection was read to its end and reused")
    }

    @Test("a POST's body is sent again after the 401, byte for byte")
    func bodyReplayed() async throws {
        let harness = try await DataPlaneHarness()
        try await harness.vault.add(
            origin: CanonicalOrigin(parsing: DataPlaneHarness.origin), realm: "r",
            credential: PasswordCredential(user: "alice", password: "s3cret"), persistence: .session
        )
        let client = try await FullPathClient(harness, target: "/upload")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "7")
        try await client.send(.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: DataPlaneHarness.origin + "/upload", headers: headers)))
        try await client.send(.body(ByteBuffer(string: "payload")))
        try await client.send(.end(nil))
        let upstream = try await harness.upstream(0)
        let first = try await harness.requestWritten(on: upstream)
        #expect(first.body == "payload" && first.ended)
        try await DataPlaneHarness.respond(on: upstream, status: .unauthorized, body: "", extra: ["WWW-Authenticate": "Basic realm=\"r\""])

        let second = try await harness.requestWritten(on: upstream)
        #expect(second.head.method == .POST && second.head.headers["Content-Length"] == ["7"])
        #expect(second.head.headers["Authorization"].count == 1)
        #expect(second.body == "payload" && second.ended)
        try await DataPlaneHarness.respond(on: upstream, status: .created, body: "stored")
        let response = try await client.response()
        #expect(response.head.status == .created && response.body == "stored")
        #expect(try await client.outcome()?.status == 201)
    }

    @Test("an origin that answers before the request body ended: its connection is never reused; the client's stays open once its body ends")
    func earlyResponseNotReused() async throws {
        let harness = try await DataPlaneHarness()
        let (client, upstream) = try await Self.earlyResponse(harness)
        // The rest of the body comes, within the linger.
        try await client.send(.body(ByteBuffer(string: "67890")))
        try await client.send(.end(nil))
        #expect(try await client.outcome()?.disposition == .keepAlive)
        #expect(!upstream.isActive, "closed, never pooled: the origin may read the body's rest as a request")
        #expect(harness.pool.openConnectionCount == 0)
        #expect(harness.upstreamCount == 1, "and the body's rest is not sent anywhere")
        #expect(try await upstream.readOutbound(as: HTTPClientRequestPart.self) == nil)
    }

    @Test("an origin that answers before the request body ended, whose rest never comes: the client's connection is ended after the linger")
    func earlyResponseBodyNeverEnds() async throws {
        let harness = try await DataPlaneHarness()
        let (client, upstream) = try await Self.earlyResponse(harness)
        #expect(try await client.outcome()?.disposition == .close)
        #expect(!upstream.isActive)
    }

    @Test("a pooled connection the origin closed before the head: a bodiless request goes again on a fresh connection")
    func staleConnectionRetried() async throws {
        let harness = try await DataPlaneHarness()
        let stale = try await harness.seedIdleConnection()
        let client = try await FullPathClient(harness, target: "/a")
        try await client.sendGet("/a")
        let first = try await harness.requestWritten(on: stale)
        #expect(first.head.uri == "/a" && first.ended)
        try await stale.close()
        let fresh = try await harness.upstream(1)
        let second = try await harness.requestWritten(on: fresh)
        #expect(second.head.uri == "/a" && second.ended)
        try await DataPlaneHarness.respond(on: fresh, status: .ok, body: "fine")
        let response = try await client.response()
        #expect(response.head.status == .ok && response.body == "fine")
        #expect(try await client.outcome()?.status == 200)
    }

    @Test("closed before the head twice: one retry of a bodiless request, then the broker's own 502, marked as the broker's")
    func closedTwice() async throws {
        let harness = try await DataPlaneHarness()
        let stale = try await harness.seedIdleConnection()
        let client = try await FullPathClient(harness, target: "/a")
        try await client.sendGet("/a")
        _ = try await harness.requestWritten(on: stale)
        try await stale.close()
        let fresh = try await harness.upstream(1)
        _ = try await harness.requestWritten(on: fresh)
        try await fresh.close()
        let response = try await client.response()
        #expect(response.head.status == .badGateway)
        #expect(response.head.headers["Authbroker-Error"].isEmpty == false)
        #expect(response.head.headers["Proxy-Status"].first?.contains("authbrokerd") == true)
        let outcome = try await client.outcome()
        #expect(outcome?.status == 502 && outcome?.brokerError != nil)
        #expect(harness.upstreamCount == 2, "not sent a third time")
    }

    @Test("a connection made for the request that closes before answering is the origin's answer: the broker's 502, no retry")
    func freshConnectionClosed() async throws {
        let harness = try await DataPlaneHarness()
        let client = try await FullPathClient(harness, target: "/a")
        try await client.sendGet("/a")
        let upstream = try await harness.upstream(0)
        _ = try await harness.requestWritten(on: upstream)
        try await upstream.close()
        #expect(try await client.response().head.status == .badGateway)
        #expect(try await client.outcome()?.status == 502)
        #expect(harness.upstreamCount == 1, "not sent again")
    }

    @Test("pooled connections the origin dropped (a restart, a network change): the retry goes on a new one, and the others are closed unused")
    func allPooledConnectionsDropped() async throws {
        let harness = try await DataPlaneHarness()
        let leases = [try await harness.pool.lease(harness.route), try await harness.pool.lease(harness.route), try await harness.pool.lease(harness.route)]
        for lease in leases { harness.pool.release(lease, reusable: true) }
        let idle = try leases.map { try #require($0.connection.channel as? NIOAsyncTestingChannel) }
        let client = try await FullPathClient(harness, target: "/a")
        try await client.sendGet("/a")
        // The most recently idle connection is leased first.
        _ = try await harness.requestWritten(on: idle[2])
        try await idle[2].close()
        let fresh = try await harness.upstream(3)
        let retried = try await harness.requestWritten(on: fresh)
        #expect(retried.head.uri == "/a" && retried.ended)
        try await DataPlaneHarness.respond(on: fresh, status: .ok, body: "fine")
        #expect(try await client.response().body == "fine")
        #expect(try await client.outcome()?.status == 200)
        for channel in idle.prefix(2) {
            #expect(try await channel.readOutbound(as: HTTPClientRequestPart.self) == nil, "nothing sent on the other dropped ones")
            #expect(!channel.isActive, "closed")
        }
    }

    /// A 103 carrying what no forwarded head may: fields its `Connection` names, the broker's own
    /// marks, a `Proxy-Status` member claiming to be the broker's.
    static let hostileHints: HTTPHeaders = [
        "Link": "</style.css>; rel=preload", "Connection": "X-Secret", "X-Secret": "s", "Authbroker-Error": "untrusted_server",
        "Authbroker-Request-Id": "forged", "Proxy-Status": "authbrokerd; error=tls_certificate_error", "Upgrade": "h2c",
    ]

    @Test("an interim 103 reaches an HTTP/1.1 client under the rules of every forwarded head, and an HTTP/1.0 client never", arguments: [true, false])
    func interimResponses(http11: Bool) async throws {
        let harness = try await DataPlaneHarness()
        let client = try await FullPathClient(harness, target: "/hints")
        try await client.sendGet("/hints", version: http11 ? .http1_1 : .http1_0)
        let upstream = try await harness.upstream(0)
        _ = try await harness.requestWritten(on: upstream)
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: 103), headers: Self.hostileHints)))
        try await DataPlaneHarness.respond(on: upstream, status: .ok, body: "page")
        guard case .head(let first) = try await client.channel.waitForOutboundWrite(as: HTTPServerResponsePart.self) else {
            Issue.record("no head")
            return
        }
        if http11 {
            #expect(first.status.code == 103)
            #expect(first.headers["Link"] == ["</style.css>; rel=preload"])
            for name in ["Connection", "X-Secret", "Authbroker-Error", "Authbroker-Request-Id", "Proxy-Status", "Upgrade"] {
                #expect(!first.headers.contains(name: name), "\(name) reached the client: \(first.headers)")
            }
        } else {
            #expect(first.status == .ok, "an HTTP/1.0 client got a \(first.status.code) first")
        }
    }

    @Test("Expect: 100-continue: the origin's 100 reaches the client once, then the body goes up")
    func continueRelayed() async throws {
        let harness = try await DataPlaneHarness()
        let client = try await FullPathClient(harness, target: "/put")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "4")
        headers.add(name: "Expect", value: "100-continue")
        try await client.send(.head(HTTPRequestHead(version: .http1_1, method: .PUT, uri: DataPlaneHarness.origin + "/put", headers: headers)))
        let upstream = try await harness.upstream(0)
        guard case .head(let sent) = try await upstream.waitForOutboundWrite(as: HTTPClientRequestPart.self) else {
            Issue.record("no head upstream")
            return
        }
        #expect(sent.headers["Expect"] == ["100-continue"])
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .continue)))
        guard case .head(let interim) = try await client.channel.waitForOutboundWrite(as: HTTPServerResponsePart.self) else {
            Issue.record("no 100 to the client")
            return
        }
        #expect(interim.status == .continue)
        try await client.send(.body(ByteBuffer(string: "data")))
        try await client.send(.end(nil))
        guard case .body(.byteBuffer(let body)) = try await upstream.waitForOutboundWrite(as: HTTPClientRequestPart.self) else {
            Issue.record("no body upstream")
            return
        }
        #expect(String(buffer: body) == "data")
        guard case .end = try await upstream.waitForOutboundWrite(as: HTTPClientRequestPart.self) else {
            Issue.record("no end upstream")
            return
        }
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .continue)))
        try await DataPlaneHarness.respond(on: upstream, status: .noContent, body: "")
        let response = try await client.response()
        #expect(response.head.status == .noContent, "a second 100 from the origin is not relayed: \(response.head.status)")
        #expect(try await client.outcome()?.status == 204)
    }

    /// A POST of 10 bytes whose first 5 reached the origin, which answered 200 to them; the
    /// client has the whole response.
    static func earlyResponse(_ harness: DataPlaneHarness) async throws -> (FullPathClient, NIOAsyncTestingChannel) {
        let client = try await FullPathClient(harness, target: "/early")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "10")
        try await client.send(.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: DataPlaneHarness.origin + "/early", headers: headers)))
        try await client.send(.body(ByteBuffer(string: "12345")))
        let upstream = try await harness.upstream(0)
        let sent = try await harness.requestWritten(on: upstream, upTo: 5)
        #expect(sent.body == "12345" && !sent.ended)
        try await DataPlaneHarness.respond(on: upstream, status: .ok, body: "early")
        let response = try await client.response()
        #expect(response.head.status == .ok && response.body == "early" && response.ended)
        return (client, upstream)
    }
}

/// A client connection whose task runs `Interceptor.proxy` for its first request, as the
/// connection's task does after reading a head.
final class FullPathClient: Sendable {
    let channel: NIOAsyncTestingChannel
    private let task: Task<RequestOutcome?, any Error>

    init(_ harness: DataPlaneHarness, target pathAndQuery: String) async throws {
        let channel = NIOAsyncTestingChannel(loop: harness.loop)
        self.channel = channel
        try await channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 40001))
        let connection = try await harness.loop.submit {
            try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(wrappingChannelSynchronously: channel)
        }.get()
        let (interceptor, logger) = (harness.interceptor, harness.logger)
        let origin = try CanonicalOrigin(parsing: DataPlaneHarness.origin)
        self.task = Task {
            try await connection.executeThenClose { inbound, outbound in
                var requests = inbound.makeAsyncIterator()
                guard case .head(let head)? = try await requests.next() else { return nil }
                let client = ClientSide(
                    requestID: "shell-test", peer: nil, logger: logger, writer: outbound, close: { channel.close(promise: nil) },
                    abort: { channel.close(promise: nil) },
                    draining: { false }, gone: { await ClientConnectionServer.untilClosed(channel.closeFuture) }
                )
                return await interceptor.proxy(head: head, origin: origin, pathAndQuery: pathAndQuery, client: client, requests: &requests)
            }
        }
    }

    func send(_ part: HTTPServerRequestPart) async throws {
        try await self.channel.writeInbound(part)
    }

    func sendGet(_ path: String, version: HTTPVersion = .http1_1) async throws {
        try await self.send(.head(HTTPRequestHead(version: version, method: .GET, uri: DataPlaneHarness.origin + path)))
        try await self.send(.end(nil))
    }

    /// The response written to the client, waiting for each part, up to its end.
    func response() async throws -> (head: HTTPResponseHead, body: String, ended: Bool) {
        let response = try await DataPlaneHarness.response(from: self.channel, waiting: true)
        guard let head = response.head else { throw DataPlaneHarness.Unexpected("the client's first part is not a head") }
        return (head, response.body, response.ended)
    }

    func outcome() async throws -> RequestOutcome? {
        try await self.task.value
    }
}
