import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing
import TestSupport

/// `DirectRelayHandler`, the shell that relays plain requests, on testing channels: a client
/// connection and pooled upstream connections on one event loop, with the real pool,
/// `UpstreamExchangeHandler`, authenticator and registry beside it. The daemon tests
/// (`DirectRelayTests`) show the same end to end; these pin what each event does to the client,
/// the origin, the pool and the full path.
@Suite("Direct relay shell", .timeLimit(.minutes(1)))
struct DirectRelayShellTests {
    @Test("a plain GET is relayed on the idle pooled connection, which goes back to the pool; the full path never starts")
    func relaysAndPools() async throws {
        let relay = try await DataPlaneHarness()
        let upstream = try await relay.seedIdleConnection()
        try await relay.sendGet("/a")
        let sent = try await relay.requestWritten(on: upstream)
        #expect(sent.head.uri == "/a")
        #expect(sent.head.headers["Host"] == ["origin.test"])
        #expect(sent.head.headers["Via"].first?.contains("authbrokerd") == true)
        #expect(sent.ended)

        try await relay.respond(on: upstream, status: .ok, body: "hello")
        let response = try await relay.clientResponse()
        #expect(response.head?.status == .ok)
        #expect(response.head?.headers["Authbroker-Request-Id"].count == 1)
        #expect(!(response.head?.headers[canonicalForm: "Connection"].contains("close") ?? true))
        #expect(response.body == "hello" && response.ended)

        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self) == nil, "nothing went to the full path")
        #expect(!relay.fullPathStarted)
        #expect(relay.interceptor.counters.requestsRelayedDirectly.current == 1)
        #expect(try await relay.idleConnectionID() == 0, "the connection is back in the pool, idle")
        #expect(relay.client.isActive)
    }

    @Test("with no idle pooled connection the request goes to the full path, head and end, as a hand-over")
    func noIdleConnection() async throws {
        let relay = try await DataPlaneHarness()
        try await relay.sendGet("/a")
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isHead(uri: "http://origin.test/a")) == true)
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isEnd) == true)
        #expect(relay.fullPathStarted)
        let handover = relay.handovers.takeAny()
        #expect(handover?.uri == "http://origin.test/a" && handover?.adopted == nil)
        #expect(relay.interceptor.counters.requestsRelayedDirectly.current == 0)
        #expect(relay.pool.openConnectionCount == 0, "the relay never connects")
    }

    @Test("a 401 is not answered here: the full path adopts the exchange, 401 head first, and the client hears nothing yet")
    func challengeIsAdopted() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/private")
        var challenge = HTTPHeaders()
        challenge.add(name: "WWW-Authenticate", value: "Basic realm=\"r\"")
        challenge.add(name: "Content-Length", value: "6")
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: challenge)))

        #expect(try await relay.client.readOutbound(as: HTTPServerResponsePart.self) == nil, "the client hears nothing of the 401")
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isHead(uri: "http://origin.test/private")) == true)
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isEnd) == true)
        let handover = try #require(relay.handovers.takeAny())
        let adopted = try #require(handover.adopted, "the exchange is handed over, not sent again")
        #expect(adopted.lease.connection.channel === upstream)

        // The rest of the 401 reaches the full path through the adopted exchange, after its head.
        try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: "denied")))
        try await upstream.writeInbound(HTTPClientResponsePart.end(nil))
        var parts: [HTTPClientResponsePart] = []
        for try await batch in adopted.exchange.responseParts {
            parts += batch
        }
        try #require(parts.count == 3, "\(parts)")
        if case .head(let head)? = parts.first { #expect(head.status == .unauthorized) } else { Issue.record("first part: \(String(describing: parts.first))") }
        if case .body(let body) = parts[1] { #expect(String(buffer: body) == "denied") } else { Issue.record("second part: \(parts[1])") }
        #expect(relay.pool.openConnectionCount == 1, "still leased, now by the full path")
        #expect(relay.interceptor.counters.requestsRelayedDirectly.current == 0)
    }

    @Test("a pooled connection the origin closed before the head: the full path sends the request again, and the pool drops it")
    func closedPooledConnection() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/a")
        try await upstream.close()
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isHead(uri: "http://origin.test/a")) == true)
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isEnd) == true)
        let handover = relay.handovers.takeAny()
        #expect(handover != nil && handover?.adopted == nil, "sent again on a fresh connection, not adopted")
        #expect(handover?.closedConnectionRetried == true, "and that was its one retry")
        #expect(try await relay.client.readOutbound(as: HTTPServerResponsePart.self) == nil)
        #expect(relay.pool.openConnectionCount == 0)
        #expect(relay.client.isActive)
    }

    @Test("a request pipelined behind a relayed one is held until that response ended, then relayed on the same connection")
    func pipelinedRequestWaits() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/first")
        try await relay.sendGet("/second")
        #expect(try await upstream.readOutbound(as: HTTPClientRequestPart.self) == nil, "nothing of the second before the first's response")
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self) == nil, "nor to the full path")

        try await relay.respond(on: upstream, status: .ok, body: "one")
        let second = try await relay.requestWritten(on: upstream)
        #expect(second.head.uri == "/second" && second.ended)
        try await relay.respond(on: upstream, status: .ok, body: "two")
        let first = try await relay.clientResponse()
        let then = try await relay.clientResponse()
        #expect(first.body == "one" && first.ended)
        #expect(then.body == "two" && then.ended)
        #expect(relay.interceptor.counters.requestsRelayedDirectly.current == 2)
        #expect(!relay.fullPathStarted)
    }

    @Test("an origin's Connection: close closes the upstream connection, not the client's")
    func originCloses() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/a")
        try await relay.respond(on: upstream, status: .ok, body: "bye", close: true)
        let response = try await relay.clientResponse()
        #expect(response.ended)
        #expect(!(response.head?.headers[canonicalForm: "Connection"].contains("close") ?? true), "the client's connection stays open")
        #expect(relay.client.isActive)
        #expect(!upstream.isActive, "the origin said close: the upstream connection is closed")
        #expect(relay.pool.openConnectionCount == 0)
    }

    @Test("a client that is not writable pauses the origin's reads until it is again")
    func backPressure() async throws {
        let relay = try await DataPlaneHarness()
        let upstream = try await relay.seedIdleConnection()
        let reads = try #require(relay.lastUpstreamReads)
        try await relay.sendGet("/big")
        _ = try await relay.requestWritten(on: upstream)
        relay.client.isWritable = false
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "1000")
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)))
        let before = reads.count
        upstream.read()
        try await relay.loop.submit {}.get()
        #expect(reads.count == before, "no read from the origin while the client is not writable")

        relay.client.isWritable = true
        try await relay.loop.submit { relay.client.pipeline.fireChannelWritabilityChanged() }.get()
        #expect(reads.count == before + 1, "the withheld read goes on once the client is writable")
        try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(repeating: 0x61, count: 1000)))
        try await upstream.writeInbound(HTTPClientResponsePart.end(nil))
        let response = try await relay.clientResponse()
        #expect(response.body.count == 1000 && response.ended)
    }

    @Test("the origin failing after the head: what came goes out, then the client's connection is cut")
    func failureAfterHead() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/a")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "10")
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)))
        try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: "abc")))
        try await upstream.close()
        let response = try await relay.clientResponse()
        #expect(response.head?.status == .ok && response.body == "abc")
        #expect(!response.ended, "no end: the client must see the response was cut")
        #expect(!relay.client.isActive)
        #expect(relay.pool.openConnectionCount == 0)
    }

    @Test("no response head in time: the broker's own error, marked as the broker's, and the connection is not reused")
    func headTimeout() async throws {
        let relay = try await DataPlaneHarness(responseHeadTimeout: .seconds(2))
        let upstream = try await relay.seedIdleConnection()
        try await relay.sendGet("/slow")
        _ = try await relay.requestWritten(on: upstream)
        await relay.loop.advanceTime(by: .seconds(2))
        let response = try await relay.clientResponse()
        #expect(response.head?.status == .gatewayTimeout)
        #expect(response.head?.headers["Authbroker-Error"].isEmpty == false)
        #expect(response.ended)
        #expect(!upstream.isActive)
        #expect(relay.pool.openConnectionCount == 0)
        #expect(relay.interceptor.counters.brokerErrors.current == 1)
    }

    @Test("the client leaving mid-response closes the upstream connection (it is out of step)")
    func clientLeaves() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/a")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "10")
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)))
        try await relay.client.close()
        try await relay.loop.submit {}.get()
        #expect(!upstream.isActive)
        #expect(relay.pool.openConnectionCount == 0)
        #expect(relay.fullPathStarted, "a connection that ends starts its task, which finishes the async channel")
    }

    @Test("beyond 64 held parts the client's reads stop, and go on once the relayed response ended")
    func heldPartsBoundReads() async throws {
        let relay = try await DataPlaneHarness()
        let reads = ReadCounter()
        try await relay.loop.submit { try relay.client.pipeline.syncOperations.addHandler(reads, position: .first) }.get()
        let upstream = try await relay.seedIdleConnection()
        try await relay.sendGet("/first")
        _ = try await relay.requestWritten(on: upstream)
        for index in 0..<(DirectRelayHandler.maxHeldParts / 2) { try await relay.sendGet("/held-\(index)") }
        let before = reads.count
        relay.client.read()
        try await relay.loop.submit {}.get()
        #expect(reads.count == before, "64 parts held: no more reads from the client")

        try await relay.respond(on: upstream, status: .ok, body: "one")
        #expect(reads.count == before + 1, "the withheld read goes on when the held parts start moving")
        let next = try await relay.requestWritten(on: upstream)
        #expect(next.head.uri == "/held-0")
    }

    @Test("interim responses: a 100 the client never asked for is dropped, a 103 goes on before the final head")
    func interimResponses() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/hints")
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .continue)))
        let hints = FullPathShellTests.hostileHints
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: 103), headers: hints)))
        try await relay.respond(on: upstream, status: .ok, body: "page")
        guard case .head(let first)? = try await relay.client.readOutbound(as: HTTPServerResponsePart.self) else {
            Issue.record("no head")
            return
        }
        #expect(first.status.code == 103 && first.headers["Link"] == ["</style.css>; rel=preload"])
        for name in ["Connection", "X-Secret", "Authbroker-Error", "Authbroker-Request-Id", "Proxy-Status", "Upgrade"] {
            #expect(!first.headers.contains(name: name), "\(name) reached the client: \(first.headers)")
        }
        let final = try await relay.clientResponse()
        #expect(final.head?.status == .ok && final.body == "page" && final.ended)
        #expect(try await relay.idleConnectionID() == 0)
    }

    @Test("draining: the response under way goes out with Connection: close, then the client's connection closes; the next request is not relayed")
    func drainingMidResponse() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/a")
        relay.registry.beginDraining()
        try await relay.loop.submit {}.get()
        #expect(relay.client.isActive, "a connection with a request in flight stays open")
        try await relay.respond(on: upstream, status: .ok, body: "last")
        let response = try await relay.clientResponse()
        #expect(response.head?.headers[canonicalForm: "Connection"].contains("close") == true)
        #expect(response.body == "last" && response.ended)
        try await relay.loop.submit {}.get()
        #expect(!relay.client.isActive, "closed after its response")
        #expect(try await relay.idleConnectionID() == 0, "the upstream connection is fine: back in the pool")
    }

    @Test("a request that arrives while draining goes to the full path, which answers it")
    func requestWhileDraining() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/warm")
        try await relay.respond(on: upstream, status: .ok, body: "1")
        _ = try await relay.clientResponse()
        // Draining closes an idle connection at once; this one is kept open by a request the
        // full path has in hand (as a control request would).
        relay.registry.requestStarted(relay.registration)
        relay.registry.beginDraining()
        try await relay.sendGet("/b")
        #expect(try await upstream.readOutbound(as: HTTPClientRequestPart.self) == nil, "not relayed while draining")
        #expect(try await relay.client.readInbound(as: HTTPServerRequestPart.self).map(Self.isHead(uri: "http://origin.test/b")) == true)
    }

    @Test("a request pipelined behind one whose 401 the full path adopts follows it there, in order")
    func pipelinedBehindAdoption() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/private")
        try await relay.sendGet("/next")
        var challenge = HTTPHeaders()
        challenge.add(name: "WWW-Authenticate", value: "Basic realm=\"r\"")
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: challenge)))
        var passedOn: [String] = []
        while let part = try await relay.client.readInbound(as: HTTPServerRequestPart.self) {
            switch part {
            case .head(let head): passedOn.append(head.uri)
            case .body: passedOn.append("body")
            case .end: passedOn.append("end")
            }
        }
        #expect(passedOn == ["http://origin.test/private", "end", "http://origin.test/next", "end"])
        #expect(try await upstream.readOutbound(as: HTTPClientRequestPart.self) == nil, "the relay sends nothing more on the adopted connection")
    }

    @Test("an error from the client's decoder while a response is relayed waits until that response ended")
    func errorWaitsForResponse() async throws {
        let (relay, upstream) = try await DataPlaneHarness.relaying("/a")
        struct GarbageAfterRequest: Error {}
        try await relay.loop.submit { relay.client.pipeline.fireErrorCaught(GarbageAfterRequest()) }.get()
        await #expect(throws: Never.self) { try await relay.client.throwIfErrorCaught() }
        try await relay.respond(on: upstream, status: .ok, body: "first")
        let response = try await relay.clientResponse()
        #expect(response.body == "first" && response.ended, "the response in flight is whole")
        await #expect(throws: GarbageAfterRequest.self) { try await relay.client.throwIfErrorCaught() }
        #expect(relay.fullPathStarted, "the error goes to the full path, which answers it")
    }

    @Test("a response nobody asked for, in the same read as the real one's end, is never the answer to the request pipelined behind it")
    func forgedResponseInSameRead() async throws {
        let relay = try await DataPlaneHarness(wire: true)
        let upstream = try await relay.seedIdleConnection()
        try await relay.sendGet("/first")
        let first = try #require(try await upstream.readOutbound(as: ByteBuffer.self))
        #expect(String(buffer: first).hasPrefix("GET /first HTTP/1.1\r\n"))
        try await relay.sendGet("/second")
        // The relay sends /second on this connection inside the first response's end, while the
        // decoder reads on in the same bytes; SwiftNIO's decoder learns of /second only after
        // that read (it queues what it observes while decoding), so the forged head is one
        // nobody asked for.
        try await upstream.writeInbound(
            ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged")
        )
        let response = try await relay.clientResponse()
        #expect(response.body == "ok" && response.ended)
        let second = try #require(try await upstream.readOutbound(as: ByteBuffer.self))
        #expect(String(buffer: second).hasPrefix("GET /second HTTP/1.1\r\n"))
        let then = try await relay.clientResponse()
        #expect(then.head?.status == .badGateway && then.head?.headers["Authbroker-Error"] == ["http_protocol_error"], "\(then)")
        #expect(!then.body.contains("forged"))
        #expect(!upstream.isActive, "the connection is closed")
    }

    // MARK: Helpers

    static func isHead(uri: String) -> (HTTPServerRequestPart) -> Bool {
        { part in if case .head(let head) = part { head.uri == uri } else { false } }
    }

    static func isEnd(_ part: HTTPServerRequestPart) -> Bool {
        if case .end = part { true } else { false }
    }
}
