import Histogram
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// What one worker measured; merged across workers at the end.
struct WorkerResult: Sendable {
    var requests = 0
    var bytes = 0
    var errors = ErrorCounts()
    var reconnects = 0
    /// Latency of each counted request, in nanoseconds.
    var latency = Histogram<UInt64>(numberOfSignificantValueDigits: .three)
    /// Stream mode: request sent to first body byte, and to the end of the body.
    var firstByteNanos: Int64?
    var transferNanos: Int64?
    /// Hold-idle mode: the connection left open for the caller to close.
    var heldChannel: (any Channel)?

    mutating func merge(_ other: WorkerResult) {
        requests += other.requests
        bytes += other.bytes
        errors.merge(other.errors)
        reconnects += other.reconnects
        latency.add(other.latency)
    }
}

/// Errors by kind; every response is checked, so a fast wrong answer is never a fast answer.
struct ErrorCounts: Sendable, Codable {
    var status = 0
    var length = 0
    var connect = 0
    var io = 0
    var timeout = 0

    var total: Int { status + length + connect + io + timeout }

    mutating func merge(_ other: ErrorCounts) {
        status += other.status
        length += other.length
        connect += other.connect
        io += other.io
        timeout += other.timeout
    }
}

/// One simulated client: its connections and requests, confined to one event loop.
///
/// Every method runs on `loop`; the handlers of its channels call back into it there.
final class Worker {
    let loop: any EventLoop
    let plan: LoadPlan
    private let done: EventLoopPromise<WorkerResult>
    private var result = WorkerResult()
    private var expectedLength: Int?
    private var started = 0
    private var finished = false
    private var channel: (any Channel)?
    private var connectStartedAt = NIODeadline.now()
    private var consecutiveErrors = 0

    init(loop: any EventLoop, plan: LoadPlan, done: EventLoopPromise<WorkerResult>) {
        self.loop = loop
        self.plan = plan
        self.done = done
        self.expectedLength = plan.expectedLength
    }

    func start() {
        loop.preconditionInEventLoop()
        let bound = NIOLoopBound(self, eventLoop: loop)
        loop.assumeIsolated().scheduleTask(deadline: plan.hardDeadline) {
            bound.value.cutOff()
        }
        openConnection()
    }

    /// Whether another request may start now.
    private var mayStartAnother: Bool {
        if finished || result.errors.total >= plan.maxErrorsPerWorker { return false }
        if let limit = plan.requestsPerWorker { return started < limit }
        return NIODeadline.now() < plan.measureEnd
    }

    private func openConnection() {
        guard mayStartAnother else {
            finish()
            return
        }
        connectStartedAt = .now()
        let bound = NIOLoopBound(self, eventLoop: loop)
        let bootstrap = ClientBootstrap(group: loop)
            .connectTimeout(.seconds(10))
            .channelInitializer { channel in
                do {
                    let plan = bound.value.plan
                    if let authority = plan.tunnelAuthority {
                        // The rest goes in once the proxy has said 200.
                        try channel.pipeline.syncOperations.addHandler(TunnelPrelude(authority: authority, worker: bound.value))
                        return channel.eventLoop.makeSucceededVoidFuture()
                    }
                    try Self.addExchangeHandlers(channel, worker: bound.value)
                    return channel.eventLoop.makeSucceededVoidFuture()
                } catch {
                    return channel.eventLoop.makeFailedFuture(error)
                }
            }
        bootstrap.connect(to: plan.address).assumeIsolated().whenComplete { outcome in
            switch outcome {
            case .success(let channel):
                self.channel = channel
                if self.finished { channel.close(promise: nil) }
            case .failure:
                self.result.errors.connect += 1
                self.retryAfterError()
            }
        }
    }

    /// TLS when the plan has it, the HTTP codec and the exchange handler, at the end of the pipeline.
    static func addExchangeHandlers(_ channel: any Channel, worker: Worker) throws {
        if let tls = worker.plan.tls {
            try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: tls, serverHostname: worker.plan.serverHostname))
        }
        try channel.pipeline.syncOperations.addHTTPClientHandlers()
        try channel.pipeline.syncOperations.addHandler(ExchangeHandler(worker: worker))
    }

    private func retryAfterError() {
        consecutiveErrors += 1
        guard mayStartAnother else {
            finish()
            return
        }
        // Back off a little when errors repeat, so a refusing server is not spun against.
        let delay = TimeAmount.milliseconds(Int64(min(consecutiveErrors, 50)))
        let bound = NIOLoopBound(self, eventLoop: loop)
        loop.assumeIsolated().scheduleTask(in: delay) { bound.value.openConnection() }
    }

    // MARK: Events from ExchangeHandler

    /// The connection is up: the first request on it may go.
    func connectionActive(_ handler: ExchangeHandler) {
        sendOrStop(handler, isFirstOnConnection: true)
    }

    private func sendOrStop(_ handler: ExchangeHandler, isFirstOnConnection: Bool) {
        guard mayStartAnother else {
            handler.close()
            finish()
            return
        }
        started += 1
        let startedAt: NIODeadline =
            plan.mode == .newConnectionPerRequest && isFirstOnConnection ? connectStartedAt : .now()
        handler.send(startedAt: startedAt)
    }

    /// A whole response arrived and was checked.
    func exchangeFinished(
        _ handler: ExchangeHandler,
        status: UInt,
        bodyBytes: Int,
        startedAt: NIODeadline,
        firstByteAt: NIODeadline?,
        keepAlive: Bool
    ) {
        let now = NIODeadline.now()
        var failed = false
        if status != plan.expectedStatus {
            result.errors.status += 1
            failed = true
        } else if let expected = expectedLength, expected != bodyBytes {
            result.errors.length += 1
            failed = true
        } else if expectedLength == nil {
            expectedLength = bodyBytes
        }
        consecutiveErrors = failed ? consecutiveErrors + 1 : 0
        if startedAt >= plan.measureStart && !failed {
            result.requests += 1
            result.bytes += bodyBytes
            result.latency.record(UInt64(max(0, (now - startedAt).nanoseconds)))
            if plan.mode == .stream {
                result.transferNanos = (now - startedAt).nanoseconds
                result.firstByteNanos = firstByteAt.map { ($0 - startedAt).nanoseconds }
            }
        }
        if plan.mode == .holdIdle && !mayStartAnother {
            // Leave the connection open and idle; the caller closes it after measuring.
            result.heldChannel = handler.detach()
            channel = nil
            finish()
        } else if keepAlive && plan.mode != .newConnectionPerRequest {
            sendOrStop(handler, isFirstOnConnection: false)
        } else {
            handler.close()
            channel = nil
            result.reconnects += 1
            openConnection()
        }
    }

    /// The connection failed or closed while a request was in flight.
    func connectionLost(_ handler: ExchangeHandler, timedOut: Bool) {
        if timedOut { result.errors.timeout += 1 } else { result.errors.io += 1 }
        channel = nil
        retryAfterError()
    }

    /// The server closed an idle kept-alive connection: open another (not an error).
    func idleConnectionClosed(_ handler: ExchangeHandler) {
        channel = nil
        result.reconnects += 1
        openConnection()
    }

    // MARK: Ending

    /// The hard deadline passed: whatever is in flight is abandoned and counted.
    private func cutOff() {
        guard !finished else { return }
        if let channel {
            result.errors.timeout += 1
            channel.close(promise: nil)
        }
        finish()
    }

    private func finish() {
        guard !finished else { return }
        finished = true
        done.succeed(result)
    }
}

/// One HTTP/1.1 connection's exchanges, one at a time; bodies are counted, never kept.
final class ExchangeHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundOut = HTTPClientRequestPart

    private let worker: Worker
    private var context: ChannelHandlerContext?
    private var inFlight = false
    private var detached = false
    private var closedByUs = false
    private var startedAt = NIODeadline.now()
    private var firstByteAt: NIODeadline?
    private var status: UInt = 0
    private var keepAlive = true
    private var bodyBytes = 0

    /// The same request every time, built once per connection.
    private let head: HTTPRequestHead

    init(worker: Worker) {
        self.worker = worker
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: worker.plan.hostHeader)
        headers.add(name: "User-Agent", value: "authbroker-load")
        if worker.plan.mode == .newConnectionPerRequest { headers.add(name: "Connection", value: "close") }
        head = HTTPRequestHead(version: .http1_1, method: .GET, uri: worker.plan.requestTarget, headers: headers)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        worker.connectionActive(self)
        context.fireChannelActive()
    }

    func send(startedAt: NIODeadline) {
        guard let context else { return }
        inFlight = true
        self.startedAt = startedAt
        firstByteAt = nil
        bodyBytes = 0
        context.write(wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head):
            status = head.status.code
            keepAlive = head.isKeepAlive
        case .body(let buffer):
            if firstByteAt == nil { firstByteAt = .now() }
            bodyBytes += buffer.readableBytes
        case .end:
            guard inFlight else { return }
            inFlight = false
            worker.exchangeFinished(
                self, status: status, bodyBytes: bodyBytes, startedAt: startedAt,
                firstByteAt: firstByteAt, keepAlive: keepAlive)
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        if detached || closedByUs {
            // Ours to close; nothing to report.
        } else if inFlight {
            inFlight = false
            worker.connectionLost(self, timedOut: false)
        } else {
            worker.idleConnectionClosed(self)
        }
        context.fireChannelInactive()
    }

    /// Closes the connection on purpose (not an error).
    func close() {
        inFlight = false
        closedByUs = true
        context?.close(promise: nil)
    }

    /// Stops reporting to the worker and hands over the connection, which stays open.
    func detach() -> (any Channel)? {
        detached = true
        return context?.channel
    }
}

/// `CONNECT host:port` through the proxy; on `200`, the TLS and HTTP handlers take over the
/// connection (and see it become active), and this handler leaves. Anything else is an error.
final class TunnelPrelude: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let authority: String
    private let worker: Worker
    private var received: [UInt8] = []

    init(authority: String, worker: Worker) {
        self.authority = authority
        self.worker = worker
    }

    func channelActive(context: ChannelHandlerContext) {
        var request = context.channel.allocator.buffer(capacity: 128)
        request.writeString("CONNECT \(self.authority) HTTP/1.1\r\nHost: \(self.authority)\r\n\r\n")
        context.writeAndFlush(self.wrapOutboundOut(request), promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = self.unwrapInboundIn(data)
        self.received += buffer.readBytes(length: buffer.readableBytes) ?? []
        guard let end = self.received.firstRange(of: Array("\r\n\r\n".utf8)) else {
            if self.received.count > 16_384 { context.close(promise: nil) }
            return
        }
        // The server does not speak first in TLS, so nothing follows the proxy's answer yet.
        guard self.received.starts(with: Array("HTTP/1.1 200".utf8)), end.upperBound == self.received.count else {
            context.close(promise: nil)
            return
        }
        do {
            try Worker.addExchangeHandlers(context.channel, worker: self.worker)
            // The new handlers start their work (the handshake, the first request) as the
            // connection becomes active for them.
            context.fireChannelActive()
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        } catch {
            context.close(promise: nil)
        }
    }
}
