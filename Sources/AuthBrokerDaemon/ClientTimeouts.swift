import AuthBrokerCore
import NIOCore
import NIOHTTP1

/// How long a client connection may hold a slot without making progress, and whether it is one
/// of the slots kept for the control API.
package struct ClientConnectionTerms: Sendable {
    /// From the first byte of a request until its head is complete (`request_head_timeout_ms`).
    package var headTimeout: TimeAmount
    /// Between requests, with no byte of the next one yet (`client_idle_timeout_ms`).
    package var idleTimeout: TimeAmount
    /// Accepted beyond `max_client_connections`, into a slot kept for `/v1/` requests so that
    /// `authbrokerctl` still answers while apps hold every other slot; anything else is refused.
    package var controlOnly: Bool
    /// `max_request_head_bytes`: how much of a head `HeadNormalizer` holds before it lets the
    /// decoder refuse it.
    package var maxHeadBytes: Int

    package init(limits: BrokerSettings.Limits, controlOnly: Bool) {
        self.maxHeadBytes = limits.maxRequestHeadBytes
        self.headTimeout = .milliseconds(Int64(limits.requestHeadTimeoutMilliseconds))
        // A control-only slot must not be held either: it gets the head timeout as idle timeout.
        let idle = Int64(limits.clientIdleTimeoutMilliseconds)
        self.idleTimeout = .milliseconds(controlOnly ? min(idle, Int64(limits.requestHeadTimeoutMilliseconds)) : idle)
        self.controlOnly = controlOnly
    }
}

/// Where a connection stands between requests, decided from what passed (pure, tested alone).
///
/// A connection is *waiting* when every request head it sent has been answered to the end and
/// every request it sent has ended: only then may a timer run (a long download, an agent's
/// event stream or a slow upload is progress, not idling). While waiting, no byte yet means the
/// idle timeout applies; once a byte of the next request arrived, its head must be complete
/// within the head timeout, counted from that byte.
package struct ClientWaitState: Sendable, Equatable {
    package enum Deadline: Sendable, Equatable {
        case none
        case idle
        case head
    }

    private var heads = 0
    private var requestEnds = 0
    private var responseEnds = 0
    private var bytesWhileWaiting = false

    package init() {}

    package var isWaiting: Bool { requestEnds >= heads && responseEnds >= heads }

    /// Request heads whose responses have not ended yet.
    package var unansweredHeads: Int { heads - responseEnds }

    /// Which timer must run now.
    package var deadline: Deadline {
        guard isWaiting else { return .none }
        return bytesWhileWaiting ? .head : .idle
    }

    /// Bytes arrived from the client; true when this starts the head timer.
    package mutating func bytesArrived() -> Bool {
        guard isWaiting, !bytesWhileWaiting else { return false }
        bytesWhileWaiting = true
        return true
    }

    package mutating func headArrived() {
        heads += 1
        bytesWhileWaiting = false
    }

    package mutating func requestEnded() {
        requestEnds += 1
    }

    package mutating func responseEnded() {
        responseEnds += 1
    }
}

/// Shared by the two handlers of one connection, on its event loop only.
final class ClientTimeoutState {
    var wait = ClientWaitState()
    /// The deadline that holds now, if any, and which it is.
    var armed: (deadline: ClientWaitState.Deadline, at: NIODeadline)?
    /// The one scheduled task, and when it fires. It is left to fire when the deadline moves
    /// later or goes away (every request does both), and then looks again: scheduling and
    /// cancelling a task per request cost a tenth of a cache hit's CPU.
    var timer: (task: Scheduled<Void>, firesAt: NIODeadline)?
    var timedOut = false

    func cancelTimer() {
        self.timer?.task.cancel()
        self.timer = nil
        self.armed = nil
    }
}

/// Before the HTTP decoder: sees that bytes of a request arrived, which the decoder does not
/// report until the head is complete.
final class ClientBytesObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let state: ClientTimeoutState
    private let timeouts: ClientTimeoutHandler

    init(state: ClientTimeoutState, timeouts: ClientTimeoutHandler) {
        self.state = state
        self.timeouts = timeouts
    }

    /// A request's first bytes came in this read. The head timer is set only at the read's end,
    /// and only if the head is still incomplete then: a head that arrives whole (nearly every
    /// one) never schedules a timer.
    private var headTimerDue = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if self.state.timedOut { return }  // the connection is being closed: nothing more is read
        if self.state.wait.bytesArrived() { self.headTimerDue = true }
        context.fireChannelRead(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if self.headTimerDue {
            self.headTimerDue = false
            self.timeouts.rearm()
        }
        context.fireChannelReadComplete()
    }
}

/// After the HTTP decoder: request heads and ends in; response ends from the `ResponseEncoder`,
/// which every response passes anyway (an outbound half here would cost each response part a
/// handler more). Runs the head and idle timers, and on a control-only slot refuses anything but
/// a `/v1/` request.
final class ClientTimeoutHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let terms: ClientConnectionTerms
    private let state: ClientTimeoutState
    private let onTimeout: @Sendable (ClientWaitState.Deadline) -> Void
    private var context: ChannelHandlerContext?
    /// On a control-only slot, a data request was refused: its remaining parts are dropped.
    private var refusing = false
    /// That refusal waits for the responses to the requests before it (RFC 9112 §9.3.2: in
    /// order), written when the last of them ends.
    private var refusalDue = false

    init(terms: ClientConnectionTerms, state: ClientTimeoutState, onTimeout: @escaping @Sendable (ClientWaitState.Deadline) -> Void) {
        self.terms = terms
        self.state = state
        self.onTimeout = onTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        if context.channel.isActive { self.rearm() }
    }

    func channelActive(context: ChannelHandlerContext) {
        self.rearm()
        context.fireChannelActive()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.state.cancelTimer()
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.state.cancelTimer()
        context.fireChannelInactive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if self.refusing { return }
        let part = self.unwrapInboundIn(data)
        switch part {
        case .head(let head):
            self.state.wait.headArrived()
            self.rearm()
            if self.terms.controlOnly && !head.uri.hasPrefix("/v1/") {
                self.refusing = true
                if self.state.wait.unansweredHeads > 1 {
                    self.refusalDue = true
                } else {
                    self.refuseDataRequest(context: context)
                }
                return
            }
        case .end:
            self.state.wait.requestEnded()
            self.rearm()
        case .body:
            break
        }
        context.fireChannelRead(data)
    }

    /// A response's end is on its way to the client.
    func responseEnded() {
        self.state.wait.responseEnded()
        if self.refusalDue, self.state.wait.unansweredHeads == 1, let context = self.context {
            self.refusalDue = false
            // After the end being written now: the refusal's head must follow it.
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.execute {
                let (handler, context) = bound.value
                handler.refuseDataRequest(context: context)
            }
            return
        }
        self.rearm()
    }

    /// Sets the deadline for the state the connection is in now; the timer is scheduled anew
    /// only when none runs or it would fire too late.
    func rearm() {
        guard let context = self.context, !self.state.timedOut else { return }
        let deadline = self.state.wait.deadline
        let amount: TimeAmount
        switch deadline {
        case .none:
            self.state.armed = nil
            return
        case .idle: amount = self.terms.idleTimeout
        case .head: amount = self.terms.headTimeout
        }
        let at = context.eventLoop.now + amount
        self.state.armed = (deadline, at)
        if let timer = self.state.timer {
            if timer.firesAt <= at { return }
            timer.task.cancel()
        }
        self.schedule(at: at, context: context)
    }

    private func schedule(at: NIODeadline, context: ChannelHandlerContext) {
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        let task = context.eventLoop.scheduleTask(deadline: at) { loopBound.value.timerFired() }
        self.state.timer = (task, at)
    }

    private func timerFired() {
        self.state.timer = nil
        guard let context = self.context, !self.state.timedOut, let armed = self.state.armed else { return }
        if armed.at > context.eventLoop.now {
            self.schedule(at: armed.at, context: context)
            return
        }
        self.expire(armed.deadline)
    }

    private func expire(_ deadline: ClientWaitState.Deadline) {
        guard let context = self.context else { return }
        self.state.timedOut = true
        self.onTimeout(deadline)
        switch deadline {
        case .head:
            // RFC 9110 §15.5.9: 408 tells the client the server gave up waiting for its request.
            let error = BrokerError.requestHeadTimeout(milliseconds: Int(self.terms.headTimeout.nanoseconds / 1_000_000))
            self.writeAndClose(error, context: context)
        case .idle, .none:
            // An idle keep-alive connection is closed without a word (RFC 9112 §9.6).
            context.close(promise: nil)
        }
    }

    private func refuseDataRequest(context: ChannelHandlerContext) {
        self.refusing = true
        self.state.timedOut = true
        self.state.cancelTimer()
        self.writeAndClose(.clientConnectionsFull(), context: context)
    }

    private func writeAndClose(_ error: BrokerError, context: ChannelHandlerContext) {
        let (head, body) = error.response(requestID: RequestIDs.make(), keepAlive: false)
        context.write(self.wrapOutboundOut(.head(head)), promise: nil)
        context.write(self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(self.wrapOutboundOut(.end(nil))).whenComplete { _ in
            channel.close(mode: .output).whenComplete { _ in channel.close(promise: nil) }
        }
        // The answer may never get out: a client that reads nothing, or one inside an
        // intercepted connection that stopped mid-handshake (TLS holds the write until the
        // handshake ends). The connection is closed regardless after a moment.
        context.eventLoop.scheduleTask(in: Self.answerGrace) { channel.close(promise: nil) }
    }

    /// How long a timed-out or refused connection's answer gets to go out before it is closed.
    static let answerGrace = TimeAmount.seconds(1)
}
