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
    var timer: Scheduled<Void>?
    var timedOut = false
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

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if self.state.timedOut { return }  // the connection is being closed: nothing more is read
        if self.state.wait.bytesArrived() { self.timeouts.rearm() }
        context.fireChannelRead(data)
    }
}

/// After the HTTP decoder: request heads and ends in; response ends from the `ResponseFramer`,
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
        self.state.timer?.cancel()
        self.state.timer = nil
        self.context = nil
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.state.timer?.cancel()
        self.state.timer = nil
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
                self.refuseDataRequest(context: context)
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
        self.rearm()
    }

    /// Starts, keeps or stops the timer for the state the connection is in now.
    func rearm() {
        guard let context = self.context, !self.state.timedOut else { return }
        self.state.timer?.cancel()
        self.state.timer = nil
        let deadline = self.state.wait.deadline
        let amount: TimeAmount
        switch deadline {
        case .none: return
        case .idle: amount = self.terms.idleTimeout
        case .head: amount = self.terms.headTimeout
        }
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        self.state.timer = context.eventLoop.scheduleTask(in: amount) {
            loopBound.value.expire(deadline)
        }
    }

    private func expire(_ deadline: ClientWaitState.Deadline) {
        guard let context = self.context, !self.state.timedOut else { return }
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
        self.state.timer?.cancel()
        self.writeAndClose(.clientConnectionsFull(), context: context)
    }

    private func writeAndClose(_ error: BrokerError, context: ChannelHandlerContext) {
        var (head, body) = error.response(requestID: RequestIDs.make())
        head.headers.replaceOrAdd(name: "Connection", value: "close")
        context.write(self.wrapOutboundOut(.head(head)), promise: nil)
        context.write(self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(self.wrapOutboundOut(.end(nil))).whenComplete { _ in
            channel.close(mode: .output).whenComplete { _ in channel.close(promise: nil) }
        }
    }
}
