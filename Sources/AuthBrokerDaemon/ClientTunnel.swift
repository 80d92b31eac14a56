import AuthBrokerCore
import Logging
import NIOCore
import NIOHTTP1
import NIOSSL

/// A client's `CONNECT host:port`, answered with a blind tunnel: a TCP connection to the host
/// (through the upstream proxy when one is configured), `200`, then bytes both ways untouched
/// until either side closes. Programs that honour `https_proxy` send CONNECT for every
/// `https://` URL; a tunnelled connection is end to end between the program and the server, so
/// the broker adds nothing to it (no trust decision, identity or password of its own).
enum ClientTunnel {
    /// Bytes that went each way, for the access line.
    struct Totals: Sendable {
        var fromClient = 0
        var toClient = 0
    }

    /// Turns the client connection into one end of a tunnel to `upstream`: the HTTP handlers
    /// leave (bytes the client sent after the CONNECT, which its decoder kept, go upstream
    /// first), `200` goes out, and the two channels are joined. On the client's event loop.
    /// `idleTimeout`: with no byte either way for this long, the tunnel is closed.
    /// - Returns: the totals once both ends have closed.
    static func join(client: any Channel, upstream: any Channel, idleTimeout: TimeAmount) -> EventLoopFuture<Totals> {
        client.eventLoop.flatSubmit {
            let ended = client.eventLoop.makePromise(of: Totals.self)
            do {
                try Self.joinNow(client: client, upstream: upstream, idleTimeout: idleTimeout, ended: ended)
            } catch {
                client.close(promise: nil)
                upstream.close(promise: nil)
                ended.fail(error)
            }
            return ended.futureResult
        }
    }

    private static func joinNow(
        client: any Channel, upstream: any Channel, idleTimeout: TimeAmount, ended: EventLoopPromise<Totals>
    ) throws {
        let pipeline = client.pipeline.syncOperations
        let decoder = try pipeline.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
        let clientEnd = TunnelEnd()
        let upstreamEnd = TunnelEnd()
        let joined = JoinedEnds(client: clientEnd, upstream: upstreamEnd, ended: ended)
        clientEnd.joined = joined
        upstreamEnd.joined = joined

        // The upstream end first (the pipelines share this event loop: the connector opened it
        // here), holding what the server sends until the 200 is out.
        guard upstream.eventLoop === client.eventLoop else {
            throw ChannelError.operationUnsupported
        }
        try upstream.pipeline.syncOperations.addHandler(upstreamEnd)
        // Right after the decoder: once the handlers before it have gone, every byte the client
        // sends (and what the decoder kept) reaches this end and nothing after it.
        try pipeline.addHandler(clientEnd, position: .after(decoder))
        // In front of the client end, it sees every byte both ways on the client's side.
        try pipeline.addHandler(IdleStateHandler(allTimeout: idleTimeout), position: .before(clientEnd))
        for handler in Self.byteLevelHTTPHandlers(client) {
            pipeline.removeHandler(handler, promise: nil)
        }
        pipeline.removeHandler(try pipeline.handler(type: ResponseEncoder.self), promise: nil)
        // Removing the decoder hands its kept bytes on to the client end (`forwardBytes`).
        pipeline.removeHandler(decoder, promise: nil)

        var established = client.allocator.buffer(capacity: 64)
        established.writeString("HTTP/1.1 200 Connection established\r\n\r\n")
        clientEnd.writeRaw(established)
        upstreamEnd.start()
        clientEnd.start()
        // Opened with reads off (`openBlindTunnel`), so a server that speaks first loses nothing.
        upstream.setOption(.autoRead, value: true).whenFailure { _ in upstream.close(promise: nil) }
    }

    /// The handlers that read HTTP from bytes or time it (head normalising, the byte observer,
    /// the request timeouts): a tunnel's bytes are not HTTP, and an idle tunnel is not an idle
    /// client.
    private static func byteLevelHTTPHandlers(_ channel: any Channel) -> [any RemovableChannelHandler] {
        let pipeline = channel.pipeline.syncOperations
        var handlers: [any RemovableChannelHandler] = []
        if let normalizer = try? pipeline.handler(type: HeadNormalizer.self) { handlers.append(normalizer) }
        if let observer = try? pipeline.handler(type: ClientBytesObserver.self) { handlers.append(observer) }
        if let timeouts = try? pipeline.handler(type: ClientTimeoutHandler.self) { handlers.append(timeouts) }
        return handlers
    }
}

/// Both ends of one tunnel: completes the promise once both have closed.
private final class JoinedEnds {
    let client: TunnelEnd
    let upstream: TunnelEnd
    private var ended: EventLoopPromise<ClientTunnel.Totals>?

    init(client: TunnelEnd, upstream: TunnelEnd, ended: EventLoopPromise<ClientTunnel.Totals>) {
        self.client = client
        self.upstream = upstream
        self.ended = ended
    }

    func endClosed() {
        guard self.client.closed, self.upstream.closed, let ended = self.ended else { return }
        self.ended = nil
        // The ends hold this record; letting go of it here ends the cycle.
        self.client.joined = nil
        self.upstream.joined = nil
        ended.succeed(.init(fromClient: self.client.bytesRead, toClient: self.upstream.bytesRead))
    }
}

/// One end of a tunnel: what it reads goes out of its partner, with back-pressure (an end stops
/// reading while its partner cannot write), and when it closes its partner closes once its
/// writes are out.
private final class TunnelEnd: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    // Strong: the ends hold their shared record; it lets go of them when both channels close.
    var joined: JoinedEnds?
    private var context: ChannelHandlerContext?
    /// Reads wait for `start` (the 200 goes out first) and for the partner's writability.
    private var started = false
    private var pendingRead = false
    private(set) var closed = false
    private(set) var bytesRead = 0

    /// The other end, while the tunnel lasts.
    private var partner: TunnelEnd? {
        guard let joined else { return nil }
        return joined.client === self ? joined.upstream : joined.client
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if !context.channel.isActive { self.markClosed() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func start() {
        self.started = true
        if self.pendingRead { self.readIfAllowed() }
        if self.closed { self.partner?.closeAfterWrites() }
    }

    func writeRaw(_ buffer: ByteBuffer) {
        guard let context else { return }
        context.writeAndFlush(self.wrapOutboundOut(buffer), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = self.unwrapInboundIn(data)
        self.bytesRead += buffer.readableBytes
        self.partner?.write(buffer)
    }

    func read(context: ChannelHandlerContext) {
        self.pendingRead = true
        self.readIfAllowed()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { self.partner?.readIfAllowed() }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.markClosed()
        if self.started { self.partner?.closeAfterWrites() }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if case IdleStateHandler.IdleStateEvent.all = event {
            // Nothing either way for tunnel_idle_timeout_ms: closing one end closes the other.
            context.close(promise: nil)
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // A reset or a failed write: the tunnel is over.
        context.close(promise: nil)
    }

    // MARK: Driven by the partner

    /// Written and flushed at once: bytes the decoder kept after a CONNECT arrive with no read
    /// completion after them, and a client that sent all it had with its CONNECT (a TLS
    /// ClientHello) would wait forever for a flush at the next one.
    fileprivate func write(_ buffer: ByteBuffer) {
        self.context?.writeAndFlush(self.wrapOutboundOut(buffer), promise: nil)
    }

    fileprivate func readIfAllowed() {
        guard self.started, self.pendingRead, let context, self.partner?.isWritable ?? false else { return }
        self.pendingRead = false
        context.read()
    }

    private var isWritable: Bool { self.context?.channel.isWritable ?? false }

    fileprivate func closeAfterWrites() {
        guard let context, !self.closed else { return }
        let channel = context.channel
        channel.close(mode: .output).whenComplete { _ in channel.close(promise: nil) }
    }

    private func markClosed() {
        guard !self.closed else { return }
        self.closed = true
        self.joined?.endClosed()
    }
}

extension ClientConnectionServer {
    /// `CONNECT host:port`: intercepted (`ClientInterception`) where the broker has something to
    /// add, else a blind tunnel; or the broker's error and a close.
    func tunnel(
        to origin: CanonicalOrigin, head: HTTPRequestHead, peer: ConnectionPeer?, requestID: String, logger: Logger,
        requests: inout ClientRequestIterator, writer: ClientResponseWriter, channel: any Channel,
        registration: RegisteredClientConnection
    ) async -> RequestOutcome {
        // The CONNECT's end (it has no body); the decoder keeps what follows for the tunnel.
        guard case .end? = try? await requests.next() else { return .clientClosed }
        let decision = await self.interception.decide(origin)
        if case .intercept(let reason) = decision {
            return await self.intercept(
                origin, reason: reason, requestID: requestID, logger: logger, requests: &requests, writer: writer, channel: channel,
                registration: registration
            )
        }
        let context = UpstreamConnectContext.Value(
            requester: peer?.requester, agentWait: nil,
            clientProxyAuthorization: self.interceptor.rules.proxy(for: origin) == nil ? nil : head.headers.first(name: "proxy-authorization")
        )
        let upstream: any Channel
        do {
            upstream = try await UpstreamConnectContext.$current.withValue(context) {
                try await self.openTunnel(origin, channel.eventLoop)
            }
        } catch {
            let brokerError = error as? BrokerError ?? .internalError("opening the tunnel failed: \(error)")
            return await self.interceptor.respondWithError(
                brokerError, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                clientWantsKeepAlive: false, requestEnded: true
            )
        }
        self.counters.tunnelsOpened.add(1)
        do {
            let idle = TimeAmount.milliseconds(Int64(self.settings.limits.tunnelIdleTimeoutMilliseconds))
            let totals = try await ClientTunnel.join(client: channel, upstream: upstream, idleTimeout: idle).get()
            self.counters.bytesFromUpstream.add(totals.toClient)
            self.counters.bytesToUpstream.add(totals.fromClient)
            return RequestOutcome(status: 200, bytes: totals.toClient, brokerError: nil, disposition: .close)
        } catch {
            logger.warning("a tunnel could not be set up", metadata: ["error": "\(error)"])
            return RequestOutcome(status: 0, bytes: 0, brokerError: "internal_error", disposition: .close)
        }
    }

    /// Ends the client's TLS here and keeps serving the connection: its requests are read as
    /// the CONNECT was, made absolute for `origin`.
    private func intercept(
        _ origin: CanonicalOrigin, reason: InterceptPolicy.Reason, requestID: String, logger: Logger,
        requests: inout ClientRequestIterator, writer: ClientResponseWriter, channel: any Channel,
        registration: RegisteredClientConnection
    ) async -> RequestOutcome {
        let tls: NIOSSLContext
        do {
            tls = try await self.interception.authority.serverContext(for: origin.host)
        } catch {
            logger.warning("a CONNECT could not be intercepted", metadata: ["origin": "\(origin.authorityForm)", "error": "\(error.code)"])
            return await self.interceptor.respondWithError(
                error, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                clientWantsKeepAlive: false, requestEnded: true
            )
        }
        do {
            try await ClientInterception.start(
                channel, origin: origin, tls: tls, maxHeadBytes: self.settings.limits.maxRequestHeadBytes
            ).get()
        } catch {
            logger.warning("an interception could not be set up", metadata: ["error": "\(error)"])
            return RequestOutcome(status: 0, bytes: 0, brokerError: "internal_error", disposition: .close)
        }
        self.counters.connectsIntercepted.add(1)
        registration.markIntercepted()
        FlowCapture.current?.apply { $0.intercepted = true }
        logger.debug("intercepting a CONNECT", metadata: ["origin": "\(origin.authorityForm)", "why": "\(reason.logDescription)"])
        return RequestOutcome(status: 200, bytes: 0, brokerError: nil, disposition: .keepAlive)
    }
}
