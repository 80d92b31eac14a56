import AuthBrokerCore
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

#if canImport(Glibc)
import Glibc
#endif

/// Why an exchange on an upstream connection failed; mapped to a `BrokerError` by the interceptor,
/// which knows the origin and the settings.
/// A `101 Switching Protocols` the broker did not ask for.
struct UnsolicitedUpgrade: Error, CustomStringConvertible {
    var description: String { "101 Switching Protocols, though the broker asked for no upgrade" }
}

package enum UpstreamExchangeError: Error, Sendable {
    case connectionClosed
    case responseHeadTimeout
    case idleTimeout
    case responseHeadTooLarge
    /// The origin closed the connection in the middle of a response head.
    case responseIncomplete
    case protocolError(any Error & Sendable)
    case busy
}

/// One HTTP/1.1 connection to an origin, used by one exchange at a time (the pool leases it).
///
/// The channel pipeline ends in `UpstreamExchangeHandler`, which feeds response parts into a
/// per-exchange async sequence with read backpressure: the origin is read only as fast as the
/// client takes the bytes, so a 200 MiB download holds a few buffers, not the body. The parts of
/// one socket read travel as one batch, so the relay writes them to the client with one flush.
package final class UpstreamConnection: Sendable {
    package let id: Int
    package let route: UpstreamRoute
    package var origin: CanonicalOrigin { self.route.origin }
    package let channel: any Channel
    /// What it was made under (read before the handshake): the trust store's generation its
    /// chain was verified under, and the rules' that chose its address.
    package let generation: ConnectionGeneration
    private let handler: NIOLoopBound<UpstreamExchangeHandler>
    private let tlsError: NIOLockedValueBox<(any Error & Sendable)?>

    /// The TLS error the server's alert raised, if one closed the connection (in TLS 1.3 a
    /// refused client certificate is reported only after the handshake, on the first read).
    package var closingTLSError: (any Error)? { self.tlsError.withLockedValue { $0 } }

    package init(
        id: Int, route: UpstreamRoute, channel: any Channel, generation: ConnectionGeneration,
        handler: NIOLoopBound<UpstreamExchangeHandler>, tlsError: NIOLockedValueBox<(any Error & Sendable)?>
    ) {
        self.tlsError = tlsError
        self.id = id
        self.route = route
        self.channel = channel
        self.generation = generation
        self.handler = handler
    }

    /// Whether this connection may carry another exchange now: made under the rules in place
    /// (a reload may have moved its host with `[[route]]` or `connect_to`), and, over TLS,
    /// verified under the same anchors and pins.
    package func isCurrent(_ current: @autoclosure () -> ConnectionGeneration) -> Bool {
        let current = current()
        return self.generation.rules == current.rules && (self.origin.scheme == .http || self.generation.trust == current.trust)
    }

    package var isActive: Bool { self.channel.isActive }

    /// Writes the request head and returns the exchange through which the body is sent and
    /// the response read. With `requestEnds` the request has no body: its end goes in the same
    /// write and the response-head timer starts (no `finishRequest` follows).
    package func startExchange(head: HTTPRequestHead, requestEnds: Bool = false) async throws -> UpstreamExchange {
        let handler = self.handler
        // A task on the connection's own loop (the usual case, see EventLoopTaskExecutor) needs no hop.
        let responses =
            if self.channel.eventLoop.inEventLoop {
                try handler.value.beginExchange(requestEnds: requestEnds)
            } else {
                try await self.channel.eventLoop.submit { try handler.value.beginExchange(requestEnds: requestEnds) }.get()
            }
        if requestEnds {
            self.channel.write(HTTPClientRequestPart.head(head), promise: nil)
            try await self.channel.writeAndFlush(HTTPClientRequestPart.end(nil)).get()
            UpstreamExchange.requestFinished(handler)
        } else {
            try await self.channel.writeAndFlush(HTTPClientRequestPart.head(head)).get()
        }
        return UpstreamExchange(channel: self.channel, handler: handler, responseParts: responses)
    }

    /// Sends a request without a body and hands the response's parts to `sink` as they are read,
    /// with no task and no async sequence (the client connection's fast relay). Only on the
    /// connection's own event loop.
    func startRelay(head: HTTPRequestHead, to sink: any UpstreamRelaySink) throws {
        let handler = self.handler.value
        try handler.beginRelay(to: sink)
        self.channel.write(HTTPClientRequestPart.head(head), promise: nil)
        self.channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
        handler.requestFinished()
    }

    /// Turns the relayed exchange into an ordinary one whose response starts with `firstPart` (a
    /// head the relay read but will not answer itself), for the full path to take over.
    func adoptRelay(startingWith firstPart: HTTPClientResponsePart) -> UpstreamExchange? {
        guard let responses = self.handler.value.adoptRelay(startingWith: firstPart) else { return nil }
        return UpstreamExchange(channel: self.channel, handler: self.handler, responseParts: responses)
    }

    /// Stops reading the relayed response until `resumeRelay` (the client is not taking it).
    func pauseRelay() {
        self.handler.value.pauseReading()
    }

    func resumeRelay() {
        self.handler.value.resumeReading()
    }

    package func close() {
        self.channel.close(promise: nil)
    }
}

/// Takes a relayed response's parts straight from `UpstreamExchangeHandler`, on the connection's
/// event loop. After `.end` or a failure nothing more comes.
package protocol UpstreamRelaySink: AnyObject {
    func upstreamReceived(_ part: HTTPClientResponsePart)
    /// One read from the origin has been handed over: the moment to flush.
    func upstreamReadComplete()
    func upstreamFailed(_ error: UpstreamExchangeError)
}

/// The request and response of one exchange on an `UpstreamConnection`.
package struct UpstreamExchange: Sendable {
    let channel: any Channel
    let handler: NIOLoopBound<UpstreamExchangeHandler>
    package let responseParts: UpstreamExchangeHandler.ResponseParts

    package func writeBody(_ buffer: ByteBuffer) async throws {
        try await self.channel.writeAndFlush(HTTPClientRequestPart.body(.byteBuffer(buffer))).get()
    }

    /// Sends the end of the request; starts the response-head timer if no head came yet. The
    /// handler learns that the end reached the socket in the write's own completion, on the
    /// event loop, so that it is known before any later read from the origin is handled.
    package func finishRequest() async throws {
        let handler = self.handler
        let written = self.channel.eventLoop.makePromise(of: Void.self)
        written.futureResult.whenSuccess { handler.value.requestEndWritten() }
        self.channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: written)
        try await written.futureResult.get()
        Self.requestFinished(handler)
    }

    fileprivate static func requestFinished(_ handler: NIOLoopBound<UpstreamExchangeHandler>) {
        if handler.eventLoop.inEventLoop {
            handler.value.requestFinished()
        } else {
            handler.eventLoop.execute { handler.value.requestFinished() }
        }
    }
}

/// Bridges an upstream channel to the exchange that currently owns it.
package final class UpstreamExchangeHandler: ChannelDuplexHandler {
    package typealias InboundIn = HTTPClientResponsePart
    package typealias OutboundIn = HTTPClientRequestPart
    package typealias OutboundOut = HTTPClientRequestPart

    /// Batches of response parts, one per read from the origin (never empty).
    package typealias ResponseParts = NIOThrowingAsyncSequenceProducer<
        [HTTPClientResponsePart], any Error, NIOAsyncSequenceProducerBackPressureStrategies.HighLowWatermark,
        ReadDemand
    >
    typealias Source = ResponseParts.Source

    /// Who takes the current exchange's response.
    private enum Consumer {
        /// A task, through an async sequence, in batches.
        case sequence(Source)
        /// A channel handler on the same event loop, part by part.
        case relay(any UpstreamRelaySink)
    }

    private struct Exchange {
        var generation: Int
        var consumer: Consumer
        /// The request's end has been written to the socket (at once for a request without a
        /// body). A response that ends before it did was not an answer to the whole request: the
        /// origin may read the rest of the body as a request of its own and answer it later, so
        /// the connection is out of step and is closed, never reused (response desync).
        var requestEndWritten: Bool
        var headReceived = false
        /// The response's framing was faulty though readable: its connection ends with it.
        var closesAfterResponse = false
        /// When the response head is due, from the end of the request on.
        var headDeadline: NIODeadline?
    }

    private let responseHeadTimeout: TimeAmount
    /// An exchange with no read from the origin and no write to it for this long fails.
    private let idleTimeout: TimeAmount
    private let maxResponseHeadBytes: Int
    private let onClose: @Sendable () -> Void
    /// In front of the decoder; told where each response ends, so what follows is read as a head
    /// again. (Here rather than in a handler of its own: each handler costs every response part.)
    private let headNormalizer: HeadNormalizer?
    private var context: ChannelHandlerContext?
    private var exchange: Exchange?
    /// Checks the current exchange's `headDeadline`. Armed lazily, like the pool's idle timers:
    /// it stays pending across exchanges and, when it fires early, is armed again for the
    /// deadline then current, instead of one timer scheduled and cancelled per request.
    private var headTimer: Scheduled<Void>?
    /// The current exchange's last read or flushed write; `idleTimer` checks it the same lazy
    /// way. (It replaced NIO's IdleStateHandler, which made a promise per write to time its
    /// completion.)
    private var lastActivity = NIODeadline.uptimeNanoseconds(0)
    private var idleTimer: Scheduled<Void>?
    /// The current exchange's parts from the read in progress, yielded as one batch when the
    /// read completes (or the response ends, or the exchange fails).
    private var batch: [HTTPClientResponsePart] = []
    private var readPaused = false
    private var readPending = false
    private var isClosed = false
    /// Counts exchanges, so a late signal from a finished exchange's sequence cannot touch the next.
    private var generation = 0

    package convenience init(
        responseHeadTimeout: TimeAmount, idleTimeout: TimeAmount, maxResponseHeadBytes: Int,
        onClose: @escaping @Sendable () -> Void
    ) {
        self.init(
            responseHeadTimeout: responseHeadTimeout, idleTimeout: idleTimeout, maxResponseHeadBytes: maxResponseHeadBytes,
            headNormalizer: nil, onClose: onClose
        )
    }

    init(
        responseHeadTimeout: TimeAmount, idleTimeout: TimeAmount, maxResponseHeadBytes: Int,
        headNormalizer: HeadNormalizer?, onClose: @escaping @Sendable () -> Void
    ) {
        self.headNormalizer = headNormalizer
        self.responseHeadTimeout = responseHeadTimeout
        self.idleTimeout = idleTimeout
        self.maxResponseHeadBytes = maxResponseHeadBytes
        self.onClose = onClose
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        // Also on close: a closed channel's handlers are removed after `channelInactive`.
        self.headTimer?.cancel()
        self.headTimer = nil
        self.idleTimer?.cancel()
        self.idleTimer = nil
    }

    func beginExchange(requestEnds: Bool) throws -> ResponseParts {
        try self.begin(requestEnds: requestEnds) { context in
            let (parts, source) = self.makeResponseParts(context: context)
            return (.sequence(source), parts)
        }
    }

    /// A relayed request has no body: its end is written with its head.
    package func beginRelay(to sink: any UpstreamRelaySink) throws {
        try self.begin(requestEnds: true) { _ in (.relay(sink), ()) }
    }

    /// The current exchange's request end reached the socket.
    func requestEndWritten() {
        self.exchange?.requestEndWritten = true
    }

    /// Starts the next exchange, its response going to the consumer `make` returns (with what
    /// the caller gets back).
    private func begin<Result>(requestEnds: Bool, _ make: (ChannelHandlerContext) -> (Consumer, Result)) throws -> Result {
        guard !self.isClosed, let context else { throw UpstreamExchangeError.connectionClosed }
        guard self.exchange == nil else { throw UpstreamExchangeError.busy }
        self.generation += 1
        self.headNormalizer?.responseExpected()
        let (consumer, result) = make(context)
        self.exchange = Exchange(generation: self.generation, consumer: consumer, requestEndWritten: requestEnds)
        self.batch = []
        self.readPaused = false
        self.lastActivity = context.eventLoop.now
        if self.idleTimer == nil { self.arm(.idle, at: self.lastActivity + self.idleTimeout, context: context) }
        context.read()
        return result
    }

    private func makeResponseParts(context: ChannelHandlerContext) -> (ResponseParts, Source) {
        let demand = ReadDemand(handler: NIOLoopBound(self, eventLoop: context.eventLoop), generation: self.generation)
        let result = ResponseParts.makeSequence(
            backPressureStrategy: .init(lowWatermark: 2, highWatermark: 8),
            finishOnDeinit: false,
            delegate: demand
        )
        return (result.sequence, result.source)
    }

    /// The relay hands its exchange over: the parts it read and did not use come first in the
    /// sequence, then the rest as usual. Called from the relay sink, inside `channelRead`.
    /// Nil when there is no relayed exchange in progress.
    func adoptRelay(startingWith firstPart: HTTPClientResponsePart) -> ResponseParts? {
        guard let context, var exchange = self.exchange, case .relay = exchange.consumer else { return nil }
        let (sequence, source) = self.makeResponseParts(context: context)
        exchange.consumer = .sequence(source)
        self.exchange = exchange
        self.batch = [firstPart]
        self.readPaused = false
        return sequence
    }

    func pauseReading() {
        if self.exchange != nil { self.readPaused = true }
    }

    func resumeReading() {
        guard self.readPaused else { return }
        self.readPaused = false
        if self.readPending, let context {
            self.readPending = false
            context.read()
        }
    }

    package func requestFinished() {
        guard let context, var exchange = self.exchange, !exchange.headReceived, exchange.headDeadline == nil else {
            return
        }
        let deadline = context.eventLoop.now + self.responseHeadTimeout
        exchange.headDeadline = deadline
        self.exchange = exchange
        if self.headTimer == nil { self.arm(.head, at: deadline, context: context) }
    }

    /// The exchange's two deadlines, each checked by its own lazily armed timer.
    private enum ExchangeTimer {
        case head, idle
    }

    private func arm(_ timer: ExchangeTimer, at deadline: NIODeadline, context: ChannelHandlerContext) {
        let loopBoundSelf = NIOLoopBound(self, eventLoop: context.eventLoop)
        let scheduled = context.eventLoop.scheduleTask(deadline: deadline) {
            loopBoundSelf.value.fired(timer)
        }
        switch timer {
        case .head: self.headTimer = scheduled
        case .idle: self.idleTimer = scheduled
        }
    }

    /// The exchange fails when the timer's deadline has passed, and the timer is armed again for
    /// it when not. With no exchange, or no head awaited, the timer lapses: the next exchange (or
    /// the end of its request) arms it again.
    private func fired(_ timer: ExchangeTimer) {
        let deadline: NIODeadline?
        switch timer {
        case .head:
            self.headTimer = nil
            deadline = self.exchange.flatMap { $0.headReceived ? nil : $0.headDeadline }
        case .idle:
            self.idleTimer = nil
            deadline = self.exchange == nil ? nil : self.lastActivity + self.idleTimeout
        }
        guard let context, let deadline else { return }
        if deadline <= context.eventLoop.now {
            self.fail(timer == .head ? .responseHeadTimeout : .idleTimeout, close: true)
        } else {
            self.arm(timer, at: deadline, context: context)
        }
    }

    /// Writes count when flushed (they go out then): one clock read per flush, not per part.
    package func flush(context: ChannelHandlerContext) {
        if self.exchange != nil { self.lastActivity = context.eventLoop.now }
        context.flush()
    }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = self.unwrapInboundIn(data)
        let ends = if case .end = part { true } else { false }
        if ends { self.headNormalizer?.messageEnded() }
        guard var exchange = self.exchange else {
            // Bytes from the origin with no request outstanding: the connection is unusable.
            context.close(promise: nil)
            return
        }
        if case .head(let head) = part, head.status == .switchingProtocols {
            // The broker never asks for an upgrade (`Upgrade` is not forwarded): after a 101 the
            // origin no longer speaks HTTP, and the client would wait for a response that never comes.
            self.fail(.protocolError(UnsolicitedUpgrade()), close: true)
            return
        }
        if case .head(let head) = part, head.status.code >= 200 {
            self.headNormalizer?.headDecoded()
            if Self.approximateSize(of: head) > self.maxResponseHeadBytes {
                self.fail(.responseHeadTooLarge, close: true)
                return
            }
            exchange.headReceived = true
            exchange.headDeadline = nil
            // RFC 9112 §6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing (a
            // 1.0 recipient would not have read it so); the connection is closed after it,
            // whatever it says about keep-alive.
            exchange.closesAfterResponse = (head.version.major, head.version.minor) < (1, 1) && head.headers.contains(name: "transfer-encoding")
            self.exchange = exchange
        }
        let outOfStep = ends && !exchange.requestEndWritten
        if ends {
            self.exchange = nil
            if outOfStep || exchange.closesAfterResponse {
                // Closed before the consumer hears of the end, so it is never released reusable.
                self.isClosed = true
                context.close(promise: nil)
            } else {
                // Keep reading while idle in the pool, so a close by the origin is noticed.
                self.readPaused = false
                if self.readPending {
                    self.readPending = false
                    context.read()
                }
            }
        }
        switch exchange.consumer {
        case .relay(let sink):
            // Last: on `.end` the sink may release this connection and start the next exchange.
            sink.upstreamReceived(part)
        case .sequence(let source):
            self.batch.append(part)
            if ends {
                self.yieldBatch(to: source)
                source.finish()
            }
        }
    }

    package func channelReadComplete(context: ChannelHandlerContext) {
        if self.exchange != nil { self.lastActivity = context.eventLoop.now }
        switch self.exchange?.consumer {
        case .sequence(let source)?: self.yieldBatch(to: source)
        case .relay(let sink)?: sink.upstreamReadComplete()
        case nil: break
        }
        context.fireChannelReadComplete()
    }

    private func yieldBatch(to source: Source) {
        guard !self.batch.isEmpty else { return }
        let batch = self.batch
        self.batch = []
        switch source.yield(batch) {
        case .stopProducing: self.readPaused = true
        case .produceMore, .dropped: break
        }
    }

    package func read(context: ChannelHandlerContext) {
        if self.readPaused {
            self.readPending = true
        } else {
            context.read()
        }
    }

    package func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.fail(Self.exchangeError(for: error), close: true)
    }

    /// What an error from the pipeline means for the exchange: a reset is a closed connection
    /// (retried like one when nothing was sent back yet), a header section over the decoder's
    /// limits is too large, an end of stream inside a head is an incomplete response.
    package static func exchangeError(for error: any Error) -> UpstreamExchangeError {
        switch error {
        case HTTPParserError.headerOverflow:
            return .responseHeadTooLarge
        case HTTPParserError.invalidEOFState:
            return .responseIncomplete
        case let parserError as HTTPParserError:
            return .protocolError(parserError)
        case let ioError as IOError where [ECONNRESET, EPIPE].contains(ioError.errnoCode):
            return .connectionClosed
        default:
            return .protocolError(SendableErrorBox(String(describing: error)))
        }
    }

    package func channelInactive(context: ChannelHandlerContext) {
        self.isClosed = true
        self.fail(.connectionClosed, close: false)
        self.onClose()
        context.fireChannelInactive()
    }

    fileprivate func resumeReading(generation: Int) {
        guard self.exchange?.generation == generation else { return }
        self.resumeReading()
    }

    /// The consumer went away before the response ended (client disconnected): the rest of
    /// the response cannot be delivered, so the connection cannot be reused.
    fileprivate func consumerTerminated(generation: Int) {
        if self.exchange?.generation == generation {
            self.fail(.connectionClosed, close: true)
        }
    }

    private func fail(_ error: UpstreamExchangeError, close: Bool) {
        let failed = self.exchange
        self.exchange = nil
        if close, let context {
            self.isClosed = true
            context.close(promise: nil)
        }
        switch failed?.consumer {
        case .sequence(let source)?:
            // What was read before the failure is delivered first.
            self.yieldBatch(to: source)
            source.finish(error)
        case .relay(let sink)?:
            sink.upstreamFailed(error)
        case nil:
            break
        }
    }

    /// The response head's size as it was on the wire, near enough for a limit check.
    static func approximateSize(of head: HTTPResponseHead) -> Int {
        var size = 12 + head.status.reasonPhrase.utf8.count + 2
        for (name, value) in head.headers {
            size += name.utf8.count + 2 + value.utf8.count + 2
        }
        return size + 2
    }
}

/// The response sequence's delegate: resumes reading from the origin when the consumer
/// wants more.
package struct ReadDemand: NIOAsyncSequenceProducerDelegate {
    let handler: NIOLoopBound<UpstreamExchangeHandler>
    let generation: Int

    package func produceMore() {
        let (handler, generation) = (self.handler, self.generation)
        handler.eventLoop.execute { handler.value.resumeReading(generation: generation) }
    }

    package func didTerminate() {
        let (handler, generation) = (self.handler, self.generation)
        handler.eventLoop.execute { handler.value.consumerTerminated(generation: generation) }
    }
}

/// A non-Sendable error's description, carried across isolation domains.
package struct SendableErrorBox: Error, Sendable, CustomStringConvertible {
    package let description: String
    package init(_ description: String) { self.description = description }
}

/// What a pooled connection was made under; one that differs from the current is not reused.
package struct ConnectionGeneration: Sendable, Hashable {
    /// The trust store's generation (anchors, pins, exceptions, the system roots).
    package var trust: UInt64
    /// The rules' generation (`LiveRules`: a reload).
    package var rules: UInt64

    package init(trust: UInt64, rules: UInt64) {
        self.trust = trust
        self.rules = rules
    }
}
