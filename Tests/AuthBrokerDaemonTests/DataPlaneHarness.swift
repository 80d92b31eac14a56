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
    private let directory: String
    /// The one origin's route, as the relay and the full path choose it.
    let route: UpstreamRoute

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
        self.route = UpstreamRoute(try CanonicalOrigin(parsing: Self.origin))
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
            generation: { ConnectionGeneration(trust: 0, rules: 0) }, authenticator: authenticator, audit: nil
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
                id: id, route: route, channel: channel, generation: ConnectionGeneration(trust: 0, rules: 0), handler: NIOLoopBound(handler, eventLoop: loop),
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
        let sent = try await harness.requestWritten(on: upstream)
        #expect(sent.head.uri == path && sent.ended)
        return (harness, upstream)
    }

    /// An idle pooled connection to the origin, as one a finished request left; its channel.
    func seedIdleConnection() async throws -> NIOAsyncTestingChannel {
        let lease = try await self.pool.lease(self.route)
        self.pool.release(lease, reusable: true)
        return try #require(lease.connection.channel as? NIOAsyncTestingChannel)
    }

    func sendGet(_ path: String) async throws {
        let head = HTTPRequestHead(version: .http1_1, method: .GET, uri: DataPlaneHarness.origin + path)
        try await self.client.writeInbound(HTTPServerRequestPart.head(head))
        try await self.client.writeInbound(HTTPServerRequestPart.end(nil))
    }

    /// The next whole request written on `upstream`, waiting for it (the full path writes from
    /// its task; the relay has written it already): head, body, and whether it ended (false
    /// when `upTo` body bytes came first).
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

    /// The origin's answer on `upstream`: head, body (when there is one) and end, each a read.
    static func respond(
        on upstream: NIOAsyncTestingChannel, status: HTTPResponseStatus, body: String, close: Bool = false, extra: [String: String] = [:]
    ) async throws {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "\(body.utf8.count)")
        if close { headers.add(name: "Connection", value: "close") }
        for (name, value) in extra { headers.add(name: name, value: value) }
        try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers)))
        if !body.isEmpty { try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: body))) }
        try await upstream.writeInbound(HTTPClientResponsePart.end(nil))
    }

    func respond(on upstream: NIOAsyncTestingChannel, status: HTTPResponseStatus, body: String, close: Bool = false) async throws {
        try await Self.respond(on: upstream, status: status, body: body, close: close)
    }

    /// The next response written to the client, up to its end or as far as it went.
    func clientResponse() async throws -> (head: HTTPResponseHead?, body: String, ended: Bool) {
        try await Self.response(from: self.client, waiting: false)
    }

    /// The next response written to `channel` (its interim heads aside only when none came
    /// before), up to its end; without `waiting`, as far as it went.
    static func response(from channel: NIOAsyncTestingChannel, waiting: Bool) async throws -> (head: HTTPResponseHead?, body: String, ended: Bool) {
        var head: HTTPResponseHead?
        var body = ""
        while true {
            let next = waiting ? try await channel.waitForOutboundWrite(as: HTTPServerResponsePart.self) : try await channel.readOutbound(as: HTTPServerResponsePart.self)
            guard let part = next else { return (head, body, false) }
            switch part {
            case .head(let responseHead):
                if head != nil { throw Unexpected("a second head before the end") }
                head = responseHead
            case .body(.byteBuffer(let buffer)): body += String(buffer: buffer)
            case .body(let other): throw Unexpected("a file body: \(other)")
            case .end: return (head, body, true)
            }
        }
    }

    /// The id of the idle connection the relay would lease now, if any (leased and given back).
    func idleConnectionID() async throws -> Int? {
        try await self.idleConnectionIDs().first
    }

    /// Every idle connection the relay could lease now (leased and given back), in lease order.
    func idleConnectionIDs() async throws -> [Int] {
        let (pool, loop, route) = (self.pool, self.loop, self.route)
        return try await loop.submit { () -> [Int] in
            var leases: [PooledConnection<UpstreamConnection>] = []
            while let lease = pool.leaseIdle(route, on: loop) { leases.append(lease) }
            for lease in leases { pool.release(lease, reusable: true) }
            return leases.map(\.id)
        }.get()
    }

    struct Unexpected: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }
}
