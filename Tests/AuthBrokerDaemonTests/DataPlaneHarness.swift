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

/// Counts `read` events passing towards the socket.
final class ReadCounter: ChannelOutboundHandler, Sendable {
    typealias OutboundIn = Any
    private let reads = NIOLockedValueBox(0)

    var count: Int { self.reads.withLockedValue { $0 } }

    func read(context: ChannelHandlerContext) {
        self.reads.withLockedValue { $0 += 1 }
        context.read()
    }
}

/// The data plane on testing channels of one event loop: a client connection with its
/// `DirectRelayHandler` (the parts it passes to the full path stay in the channel's inbound
/// buffer), an `Interceptor` with the real pool, authenticator and vault, and upstream
/// connections the pool makes on testing channels, each with its `UpstreamExchangeHandler`.
/// The test plays the client and the origin.
final class DataPlaneHarness: Sendable {
    let loop = NIOAsyncTestingEventLoop()
    let client: NIOAsyncTestingChannel
    let interceptor: Interceptor
    let pool: UpstreamPool<UpstreamConnection>
    let handovers = RelayHandoverSlot()
    let registry = ClientConnectionRegistry()
    let registration: RegisteredClientConnection
    let relayHandler: NIOLoopBound<DirectRelayHandler>
    private let started = NIOLockedValueBox(false)
    /// The upstream connections the pool made, in order, each with a count of its reads.
    private let upstreams = NIOLockedValueBox<[(channel: NIOAsyncTestingChannel, reads: ReadCounter)]>([])
    let vault = PasswordVault()
    let logger = Logger(label: "data-plane-tests", factory: { _ in SwiftLogNoOpLogHandler() })
    private let upstreamTimeouts: (head: TimeAmount, idle: TimeAmount)
    private let directory: String

    var fullPathStarted: Bool { self.started.withLockedValue { $0 } }
    var lastUpstreamReads: ReadCounter? { self.upstreams.withLockedValue { $0.last?.reads } }
    var upstreamCount: Int { self.upstreams.withLockedValue { $0.count } }
    var upstreamChannels: [NIOAsyncTestingChannel] { self.upstreams.withLockedValue { $0.map(\.channel) } }

    static let origin = "http://origin.test"

    /// The `index`th upstream connection the pool made (from 0), once it is made.
    func upstream(_ index: Int) async throws -> NIOAsyncTestingChannel {
        guard await waitUntil(seconds: 10, { self.upstreamCount > index }) else {
            throw Unexpected("the pool made no upstream connection \(index)")
        }
        return self.upstreams.withLockedValue { $0[index].channel }
    }

    /// - Parameter wire: upstream connections carry bytes, through the HTTP handlers the daemon
    ///   gives them (`UpstreamExchangeHandler.addHTTPHandlers`); otherwise HTTP parts go straight
    ///   to and from their `UpstreamExchangeHandler`.
    init(responseHeadTimeout: TimeAmount = .seconds(30), wire: Bool = false) async throws {
        self.directory = try DaemonProcess.makeTemporaryDirectory()
        let logger = self.logger
        let settings = BrokerSettings()
        let store = try TrustStore(path: self.directory + "/trust.json")
        let evaluator = TrustEvaluator(
            systemAnchorsPath: self.directory + "/no-bundle.pem", store: store, cacheSize: 8, cacheTTL: .seconds(60), logger: logger
        )
        let vault = self.vault
        let challenges = AgentChallenges(vault: vault, store: store, evaluator: evaluator, logger: logger)
        let authenticator = HTTPAuthenticator(vault: vault, challenges: challenges, logger: logger)
        let timeouts = (head: responseHeadTimeout, idle: TimeAmount.seconds(60))
        self.upstreamTimeouts = timeouts
        let loop = self.loop
        let poolBox = NIOLockedValueBox<UpstreamPool<UpstreamConnection>?>(nil)
        let upstreams = self.upstreams
        let pool = UpstreamPool<UpstreamConnection>(
            limits: .init(maxConnections: 4, maxIdleConnections: 4, maxPendingRequests: 4), idleTimeout: .seconds(60),
            eventLoop: loop,
            connect: { route, id, _ in
                let reads = ReadCounter()
                let connection = try await Self.upstreamConnection(
                    route: route, id: id, loop: loop, timeouts: timeouts, wire: wire, readCounter: reads
                ) {
                    poolBox.withLockedValue { $0 }?.connectionClosed(route: route, id: id)
                }
                // Only testing channels are made here.
                let channel = connection.channel as! NIOAsyncTestingChannel
                upstreams.withLockedValue { $0.append((channel, reads)) }
                return connection
            },
            close: { $0.close() },
            eventLoopOf: { $0.channel.eventLoop }
        )
        poolBox.withLockedValue { $0 = pool }
        self.pool = pool
        self.interceptor = Interceptor(
            pool: pool, settings: settings, rules: LiveRules(settings), counters: BrokerCounters(), store: store,
            trustGeneration: { 0 }, authenticator: authenticator, audit: nil
        )
        let registry = self.registry
        let client = NIOAsyncTestingChannel(loop: loop)
        self.client = client
        try await client.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 40000))
        let registration = try #require(registry.register(client))
        self.registration = registration
        let direct = DirectRelay(interceptor: self.interceptor, registry: registry, logger: logger)
        let (handovers, started) = (self.handovers, self.started)
        self.relayHandler = try await loop.submit {
            let handler = DirectRelayHandler(relay: direct, registration: registration, handovers: handovers, peer: nil)
            handler.startFullPathWhenNeeded { started.withLockedValue { $0 = true } }
            try client.pipeline.syncOperations.addHandler(handler)
            return NIOLoopBound(handler, eventLoop: loop)
        }.get()
    }

    /// What the connection's task does after each request it finished: the relay may take the
    /// next one again.
    func fullPathRequestDone() async throws {
        let handler = self.relayHandler
        try await self.loop.submit { handler.value.fullPathRequestDone() }.get()
    }

    deinit {
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    private static func upstreamConnection(
        route: UpstreamRoute, id: Int, loop: NIOAsyncTestingEventLoop, timeouts: (head: TimeAmount, idle: TimeAmount), wire: Bool,
        readCounter: ReadCounter, onClose: @escaping @Sendable () -> Void
    ) async throws -> UpstreamConnection {
        let channel = NIOAsyncTestingChannel(loop: loop)
        try await channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80))
        return try await loop.submit {
            try channel.pipeline.syncOperations.addHandler(readCounter)
            let handler =
                if wire {
                    try UpstreamExchangeHandler.addHTTPHandlers(
                        to: channel.pipeline.syncOperations, responseHeadTimeout: timeouts.head, idleTimeout: timeouts.idle,
                        maxResponseHeadBytes: 16384, onClose: onClose
                    )
                } else {
                    UpstreamExchangeHandler(
                        responseHeadTimeout: timeouts.head, idleTimeout: timeouts.idle, maxResponseHeadBytes: 16384, onClose: onClose
                    )
                }
            if !wire { try channel.pipeline.syncOperations.addHandler(handler) }
            return UpstreamConnection(
                id: id, route: route, channel: channel, trustGeneration: 0, handler: NIOLoopBound(handler, eventLoop: loop),
                tlsError: NIOLockedValueBox(nil)
            )
        }.get()
    }

    /// A harness whose relay has sent a GET of `path` on its one pooled connection, whose
    /// channel comes with it.
    static func relaying(_ path: String) async throws -> (DataPlaneHarness, NIOAsyncTestingChannel) {
        let harness = try await DataPlaneHarness()
        let upstream = try await harness.seedIdleConnection()
        try await harness.sendGet(path)
        let sent = try await harness.requestSent(on: upstream)
        #expect(sent.head.uri == path && sent.ended)
        return (harness, upstream)
    }

    /// An idle pooled connection to the origin, as one a finished request left; its channel.
    func seedIdleConnection() async throws -> NIOAsyncTestingChannel {
        let lease = try await self.pool.lease(UpstreamRoute(try CanonicalOrigin(parsing: DataPlaneHarness.origin)))
        self.pool.release(lease, reusable: true)
        return try #require(lease.connection.channel as? NIOAsyncTestingChannel)
    }

    func sendGet(_ path: String) async throws {
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: DataPlaneHarness.origin + path)
        try await self.client.writeInbound(HTTPServerRequestPart.head(head))
        try await self.client.writeInbound(HTTPServerRequestPart.end(nil))
    }

    /// The next request written on `upstream`: its head, and whether its end followed.
    func requestSent(on upstream: NIOAsyncTestingChannel) async throws -> (head: HTTPRequestHead, ended: Bool) {
        guard case .head(let head)? = try await upstream.readOutbound(as: HTTPClientRequestPart.self) else {
            throw Unexpected("no request head on the upstream connection")
        }
        let ended = if case .end? = try await upstream.readOutbound(as: HTTPClientRequestPart.self) { true } else { false }
        return (head, ended)
    }

    /// The next whole request written on `upstream`, waiting for it (the full path writes from
    /// its task): head, body, and whether it ended (false when `upTo` body bytes came first).
    func requestWritten(on upstream: NIOAsyncTestingChannel, upTo bodyBytes: Int = .max) async throws -> (head: HTTPRequestHead, body: String, ended: Bool) {
        guard case .head(let head) = try await upstream.waitForOutboundWrite(as: HTTPClientRequestPart.self) else {
            throw Unexpected("the upstream connection's first write is not a head")
        }
        var body = ""
        while body.utf8.count < bodyBytes {
            switch try await upstream.waitForOutboundWrite(as: HTTPClientRequestPart.self) {
            case .head: throw Unexpected("a second head before the end")
            case .body(.byteBuffer(let buffer)): body += String(buffer: buffer)
            case .body(let other): throw Unexpected("a file body: \(other)")
            case .end: return (head, body, true)
            }
        }
        return (head, body, false)
    }

    func respond(on upstream: NIOAsyncTestingChannel, status: HTTPResponseStatus, body: String, close: Bool = false) async throws {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "\(body.utf8.count)")
        if close { headers.add(name: "Connection", value: "close") }
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers)))
        try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: body)))
        try await upstream.writeInbound(HTTPClientResponsePart.end(nil))
    }

    /// The next response written to the client, up to its end or as far as it went.
    func clientResponse() async throws -> (head: HTTPResponseHead?, body: String, ended: Bool) {
        var head: HTTPResponseHead?
        var body = ""
        while let part = try await self.client.readOutbound(as: HTTPServerResponsePart.self) {
            switch part {
            case .head(let responseHead): head = responseHead
            case .body(.byteBuffer(let buffer)): body += String(buffer: buffer)
            case .body(let other): body += "<\(other.readableBytes) bytes of a file>"
            case .end: return (head, body, true)
            }
        }
        return (head, body, false)
    }

    /// The id of the idle connection the relay would lease now, if any (leased and given back).
    func idleConnectionID() async throws -> Int? {
        let (pool, loop) = (self.pool, self.loop)
        let route = UpstreamRoute(try CanonicalOrigin(parsing: DataPlaneHarness.origin))
        return try await loop.submit { () -> Int? in
            guard let lease = pool.leaseIdle(route, on: loop) else { return nil }
            pool.release(lease, reusable: true)
            return lease.id
        }.get()
    }

    struct Unexpected: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}
