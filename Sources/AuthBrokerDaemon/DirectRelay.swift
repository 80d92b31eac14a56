import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// What every client connection's `DirectRelayHandler` shares.
package struct DirectRelay: Sendable {
    let interceptor: Interceptor
    let registry: ClientConnectionRegistry
    let logger: Logger

    package init(interceptor: Interceptor, registry: ClientConnectionRegistry, logger: Logger) {
        self.interceptor = interceptor
        self.registry = registry
        self.logger = logger
    }
}

/// A relayed exchange the full path takes over: the relay read a response head it will not
/// answer itself (a 401, which the broker may answer from its store), and the full path
/// carries on from that head on the same connection, so the request is not sent twice.
package struct AdoptedExchange: Sendable {
    package let lease: PooledConnection<UpstreamConnection>
    package let exchange: UpstreamExchange
}

/// A request the direct relay began and gives to the full path. It stays counted in flight on
/// its connection across the hand-over (the full path takes the count over instead of counting
/// it in again): a drain that began in between would otherwise have closed the connection, or
/// answered 503 to a request that was already in flight when the drain began.
package struct RelayHandover: Sendable {
    /// The request it belongs to, to check it is handed to the right one.
    package let method: HTTPMethod
    package let uri: String
    /// The upstream exchange, when the full path carries it on.
    package let adopted: AdoptedExchange?
    /// The relay sent the request on a pooled connection the origin had closed: the full path
    /// sends it again, and that is its one retry.
    package let closedConnectionRetried: Bool
}

/// Where the direct relay leaves a `RelayHandover` for the connection's task, which takes it
/// with the request head the relay passes on right after.
package final class RelayHandoverSlot: Sendable {
    private let slot = NIOLockedValueBox<RelayHandover?>(nil)

    package init() {}

    func put(_ handover: RelayHandover) {
        self.slot.withLockedValue { $0 = handover }
    }

    /// Whatever is left (the connection ended before its task took it).
    package func takeAny() -> RelayHandover? {
        self.slot.withLockedValue { slot in
            defer { slot = nil }
            return slot
        }
    }

    /// The hand-over of `head`, if it is one.
    package func take(for head: HTTPRequestHead) -> RelayHandover? {
        self.slot.withLockedValue { slot in
            guard let handover = slot, handover.method == head.method, handover.uri == head.uri else { return nil }
            slot = nil
            return handover
        }
    }
}

/// The full path's side of a client connection's `DirectRelayHandler`: the connection's task
/// reports each request it has finished and will read past.
package struct DirectRelayLink: Sendable {
    let handler: NIOLoopBound<DirectRelayHandler>
    let handovers: RelayHandoverSlot

    func fullPathRequestDone() {
        let handler = self.handler
        if handler.eventLoop.inEventLoop {
            handler.value.fullPathRequestDone()
        } else {
            handler.eventLoop.execute { handler.value.fullPathRequestDone() }
        }
    }
}

/// Relays the plain requests of one client connection itself, with channel handlers only.
///
/// It sits in front of the connection's `NIOAsyncChannel`, whose task (the full path, in
/// `ClientConnectionServer` and `Interceptor`) serves everything else. A request is relayed here
/// when `DirectRelayPolicy` allows its head, the full path has no request in hand (so responses
/// stay in order), its origin goes through no proxy, presents no client identity, has no known
/// authentication space and never challenged a relayed request, and an idle pooled connection to
/// it lives on this event loop. The response goes to the client part by part as the origin's
/// reads bring it, with the same header rules, error answers, access line and counters as the
/// full path, and with back-pressure from the client's writability.
///
/// A final head goes through the full path's checks in its order (`FinalHeadMachine`), and the
/// full path takes over when the origin answers 401 (the broker may hold a credential): it
/// adopts the exchange, 401 head and all (`AdoptedExchange`). When the origin
/// closed a pooled connection before the response head, the full path sends the request again
/// on a fresh one, as it does for its own requests. Parts that arrive while a relayed response is in flight are held,
/// and delivered in order when it ends.
package final class DirectRelayHandler: ChannelDuplexHandler {
    package typealias InboundIn = HTTPServerRequestPart
    package typealias InboundOut = HTTPServerRequestPart
    package typealias OutboundIn = HTTPServerResponsePart
    package typealias OutboundOut = HTTPServerResponsePart

    private enum Held {
        case part(HTTPServerRequestPart)
        case error(any Error)
    }

    /// Parts held beyond this stop reads from the client until the relayed response ends.
    package static let maxHeldParts = 64

    private let relay: DirectRelay
    private let registration: RegisteredClientConnection
    private let handovers: RelayHandoverSlot
    /// The process on the other end, for the flow log.
    private let peer: ConnectionPeer?
    private var context: ChannelHandlerContext?
    /// Request heads given to the full path that it has not reported done.
    private var fullPathPending = 0
    private var current: RelayedRequest?
    private var held: [Held] = []
    private var readWithheld = false
    /// The scheme and authority of this connection's last relayed target, parsed once.
    private var knownTarget: RequestTarget.AbsolutePrefix?
    /// A part went on to the full path since the last read completed: only then does the read's
    /// completion go on too (the full path's stream has nothing to deliver otherwise).
    private var forwardedSinceReadComplete = false
    /// The route of this connection's last relayable target, kept while it holds: choosing an
    /// HTTPS route's client identity afresh was about 1% of the daemon's work per request.
    private var lastRoute: AutomaticRoute?
    /// The last origin the authenticator knew no space at, and its count of learnt spaces then.
    private var noSpacesKnown: (origin: CanonicalOrigin, learnt: UInt64)?
    /// Starts the connection's task (the full path), once: when a part or an error first goes on
    /// to it, or when the connection ends (the task then closes its async channel, which must not
    /// go unfinished). Until then a connection whose requests this handler answers holds no task,
    /// whose memory was about half of an idle connection's.
    private var startFullPath: (() -> Void)?

    package init(relay: DirectRelay, registration: RegisteredClientConnection, handovers: RelayHandoverSlot, peer: ConnectionPeer?) {
        self.relay = relay
        self.registration = registration
        self.handovers = handovers
        self.peer = peer
    }

    /// A request has gone upstream and its response has not ended.
    private var relayInFlight: Bool {
        guard let current else { return false }
        if case .awaitingRequestEnd = current.phase { return false }
        return true
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.fullPathNeeded()
    }

    /// Sets what starts the full path; on the event loop, before the channel's first read.
    package func startFullPathWhenNeeded(_ start: @escaping () -> Void) {
        self.startFullPath = start
    }

    /// Starts the full path unless it has started; dropping the closure also ends its reference
    /// cycle (it holds the connection, whose pipeline holds this handler).
    private func fullPathNeeded() {
        guard let start = self.startFullPath else { return }
        self.startFullPath = nil
        start()
    }

    package func fullPathRequestDone() {
        self.fullPathPending -= 1
    }

    // MARK: Client side

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.receive(self.unwrapInboundIn(data), context: context)
    }

    private func receive(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        if let current = self.current {
            guard case .awaitingRequestEnd = current.phase else {
                self.held.append(.part(part))
                return
            }
            if case .end = part {
                self.send(current, context: context)
            } else {
                // A body after all (the policy rules out framing for one): the full path takes it.
                self.handToFullPath(current, context: context)
                self.forwardedSinceReadComplete = true
                self.passOn(part, context: context)
            }
            return
        }
        if case .head(let head) = part {
            if self.fullPathPending == 0, let relayed = self.relayable(head, context: context) {
                self.current = relayed
                return
            }
            self.fullPathPending += 1
        }
        self.forwardedSinceReadComplete = true
        self.passOn(part, context: context)
    }

    /// A part for the full path, whose task starts now if it has not.
    private func passOn(_ part: HTTPServerRequestPart, context: ChannelHandlerContext) {
        self.fullPathNeeded()
        context.fireChannelRead(self.wrapInboundOut(part))
    }

    package func channelReadComplete(context: ChannelHandlerContext) {
        guard self.forwardedSinceReadComplete else { return }
        self.forwardedSinceReadComplete = false
        context.fireChannelReadComplete()
    }

    package func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if self.relayInFlight || !self.held.isEmpty {
            self.held.append(.error(error))
        } else {
            self.deliver(error, context: context)
        }
    }

    private func deliver(_ error: any Error, context: ChannelHandlerContext) {
        if let current = self.current { self.handToFullPath(current, context: context) }
        self.fullPathNeeded()
        context.fireErrorCaught(error)
    }

    package func read(context: ChannelHandlerContext) {
        if self.relayInFlight && self.held.count >= Self.maxHeldParts {
            self.readWithheld = true
        } else {
            context.read()
        }
    }

    package func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable, let current = self.current, current.paused, let lease = current.lease {
            current.paused = false
            lease.connection.resumeRelay()
        }
        context.fireChannelWritabilityChanged()
    }

    package func channelInactive(context: ChannelHandlerContext) {
        if let current = self.current {
            // The response can no longer be delivered: its upstream connection cannot be reused.
            // Gone mid-response, it was cut (`aborted`, with what reached the client), as the
            // full path says when its write fails; gone before the head, the client left.
            let outcome: RequestOutcome =
                if case .relaying = current.phase { .aborted(status: current.status, bytes: current.bytes) } else { .clientClosed }
            current.status = outcome.status
            current.bytes = outcome.bytes
            self.finish(current, reusable: false, brokerError: outcome.brokerError, context: context)
        }
        self.held.removeAll()
        self.fullPathNeeded()
        context.fireChannelInactive()
    }

    // MARK: Deciding and sending

    /// A request this handler may relay, by its head and what the broker knows of its origin.
    private func relayable(_ head: HTTPRequestHead, context: ChannelHandlerContext) -> RelayedRequest? {
        let interceptor = self.relay.interceptor
        guard DirectRelayPolicy.headAllows(head),
            ClientConnectionServer.approximateSize(of: head) <= interceptor.settings.limits.maxRequestHeadBytes
        else { return nil }
        let (target, known) = RequestTarget.parse(method: head.method.rawValue, uri: head.uri, reusing: self.knownTarget)
        guard case .success(.absolute(let origin, let pathAndQuery)) = target, let known else { return nil }
        self.knownTarget = known
        let route: UpstreamRoute
        if let lastRoute = self.lastRoute, lastRoute.route.origin == origin, lastRoute.holds(in: interceptor.store) {
            route = lastRoute.route
        } else {
            let fresh = interceptor.automaticRoute(to: origin)
            self.lastRoute = fresh
            route = fresh.route
        }
        // Where the cache covers the origin, the relay answers fresh hits held in memory itself;
        // the full path does everything else there (misses are stored, requests validated).
        var cachedHit: (entry: ResponseCache.Entry, age: Int)?
        if let cache = interceptor.cache, cache.covers(host: origin.host) {
            guard let hit = cache.directHit(for: head, url: known.originDescription + pathAndQuery) else { return nil }
            cachedHit = hit
        }
        guard
            route.proxy == nil, route.clientIdentity == nil,
            !self.mayGetCredentialsUpFront(at: origin),
            // A [[respond]] or [[rewrite]] rule may apply: the full path decides.
            !interceptor.rules.cover(host: origin.host),
            self.relay.registry.startRequestUnlessDraining(self.registration)
        else { return nil }
        interceptor.counters.requestsInFlight.add(1)
        let relayed = RelayedRequest(
            handler: self, head: head, route: route, originDescription: known.originDescription, hostHeader: known.hostHeader,
            pathAndQuery: pathAndQuery
        )
        if let flows = interceptor.flows, flows.isRecording {
            relayed.flow = RelayedFlow(url: known.originDescription + pathAndQuery, bodyLimit: flows.bodyLimit)
        }
        relayed.cachedHit = cachedHit
        return relayed
    }

    /// Whether a request to `origin` may carry a credential the full path adds; asked of the
    /// authenticator again only when the origin changes or it has learnt a space since.
    private func mayGetCredentialsUpFront(at origin: CanonicalOrigin) -> Bool {
        let authenticator = self.relay.interceptor.authenticator
        let learnt = authenticator.spacesLearnt
        if let known = self.noSpacesKnown, known.learnt == learnt, known.origin == origin { return false }
        guard !authenticator.knowsSpaces(at: origin) else { return true }
        self.noSpacesKnown = (origin, learnt)
        return false
    }

    /// The request has ended: it goes upstream on an idle pooled connection of this event loop,
    /// or to the full path when there is none.
    private func send(_ relayed: RelayedRequest, context: ChannelHandlerContext) {
        relayed.phase = .awaitingResponse
        // A bodiless request: the machine reads its end, then sends attempt 1 (this relay's).
        _ = relayed.machine.start()
        _ = relayed.machine.requestEndRead(ended: true)
        let interceptor = self.relay.interceptor
        if let hit = relayed.cachedHit {
            self.answerFromCache(relayed, hit: hit, context: context)
            return
        }
        guard let lease = interceptor.pool.leaseIdle(relayed.route, on: context.eventLoop) else {
            self.handToFullPath(relayed, context: context)
            return
        }
        // From here a hand-over closes the connection (`end` releases it, not reusable).
        relayed.lease = lease
        guard lease.connection.isCurrent(interceptor.generation()) else {
            self.handToFullPath(relayed, context: context)
            return
        }
        do {
            try lease.connection.startRelay(head: relayed.upstreamHead, to: relayed)
        } catch {
            self.handToFullPath(relayed, context: context)
        }
    }

    /// Answers a fresh hit held in memory: head, body and end in one write.
    private func answerFromCache(_ relayed: RelayedRequest, hit: (entry: ResponseCache.Entry, age: Int), context: ChannelHandlerContext) {
        let interceptor = self.relay.interceptor
        relayed.clientKeepAlive = !self.relay.registry.isDraining
        let answer = StoredAnswerFields(
            age: hit.age, requestID: relayed.requestID, cacheStatus: CacheStatusField.hit, keepAlive: relayed.clientKeepAlive
        )
        interceptor.cache?.count(.hit)
        relayed.status = hit.entry.head.status
        let body = relayed.head.method == .HEAD ? nil : hit.entry.memoryBody.flatMap { $0.readableBytes > 0 ? $0 : nil }
        relayed.bytes = body?.readableBytes ?? 0
        // The entry's head encoded once, this answer's fields and the body after it: one buffer,
        // and no head to build or encode. The flow log needs the head as fields.
        if relayed.flow == nil, var response = hit.entry.clientHead {
            response.reserveCapacity(minimumWritableBytes: 160 + relayed.bytes)
            if answer.complete(&response) {
                if let body { response.writeImmutableBuffer(body) }
                context.triggerUserOutboundEvent(ResponseEncoder.EncodedResponse(bytes: response), promise: nil)
                context.flush()
                self.finish(relayed, reusable: false, brokerError: nil, context: context)
                return
            }
        }
        let head = Interceptor.storedResponseHead(hit.entry, clientHeaders: hit.entry.clientHeaders, answer: answer, rewrite: nil)
        relayed.flow?.observed.responded(head)
        context.write(self.wrapOutboundOut(.head(head)), promise: nil)
        if let body {
            relayed.flow?.observed.responseBody(body)
            context.write(self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        }
        context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        self.finish(relayed, reusable: false, brokerError: nil, context: context)
    }

    /// Gives the request to the full path, which carries on with `adopted` when given, or else
    /// sends it (again) itself.
    /// `retrying`: its connection closed before any answer; the full path sends it again once.
    private func handToFullPath(
        _ relayed: RelayedRequest, context: ChannelHandlerContext, adopted: AdoptedExchange? = nil, retrying: Bool = false
    ) {
        guard self.end(relayed, release: retrying ? .closeWithIdle : .close, handingOver: true) else { return }
        self.fullPathPending += 1
        self.handovers.put(
            RelayHandover(method: relayed.head.method, uri: relayed.head.uri, adopted: adopted, closedConnectionRetried: retrying)
        )
        self.passOn(.head(relayed.head), context: context)
        if case .awaitingRequestEnd = relayed.phase {
            // Its end, when it comes, follows it there.
        } else {
            self.passOn(.end(nil), context: context)
        }
        context.fireChannelReadComplete()
    }

    // MARK: Upstream side (called by RelayedRequest on this event loop)

    fileprivate func relayReceived(_ part: HTTPClientResponsePart, for relayed: RelayedRequest) {
        guard relayed === self.current, let context = self.context, let lease = relayed.lease else { return }
        let interceptor = self.relay.interceptor
        switch (relayed.phase, part) {
        case (.awaitingResponse, .head(let head)) where head.status.code < 200:
            // As the full path: no 100 (the client sent no Expect), no 101; 103 and others pass.
            if head.status == .continue || head.status == .switchingProtocols { return }
            context.write(self.wrapOutboundOut(.head(Interceptor.interimResponseHead(head))), promise: nil)
        case (.awaitingResponse, .head(let head)):
            // The full path's checks in its order (`FinalHeadMachine`), answered as they come out
            // for what `relayable` lets through: no body to hold, no proxy, no credential sent
            // (nothing for the origin to accept or refuse), nothing of the cache's.
            var decision = FinalHeadMachine(FinalHeadMachine.Head(status: head.status, mayAnswerChallenges: true))
            var step = decision.start()
            decided: while true {
                switch step {
                case .askContinueGate:
                    step = decision.gateAnswered(bodyWithheld: false)
                case .checkOriginAccepted:
                    step = decision.originChecked(refused: false)
                case .forward:
                    break decided
                case .answerChallenge, .checkProxyAccepted, .consultCache, .discard, .kerberosError, .serveStored:
                    // A 401, which the broker may answer from its store (or a check the relay
                    // cannot make): the full path takes the exchange over, connection and all.
                    if let exchange = lease.connection.adoptRelay(startingWith: part) {
                        relayed.lease = nil
                        let adopted = AdoptedExchange(lease: lease, exchange: exchange)
                        self.handToFullPath(relayed, context: context, adopted: adopted)
                    } else {
                        self.handToFullPath(relayed, context: context)
                    }
                    self.deliverHeld(context: context)
                    return
                }
            }
            relayed.status = Int(head.status.code)
            relayed.upstreamKeepAlive = head.isKeepAlive
            if self.relay.registry.isDraining { relayed.clientKeepAlive = false }
            let responseHead = Interceptor.clientResponseHead(
                head, requestID: relayed.requestID, close: !relayed.clientKeepAlive, logger: self.relay.logger
            )
            relayed.flow?.observed.responded(responseHead)
            context.write(self.wrapOutboundOut(.head(responseHead)), promise: nil)
            relayed.phase = .relaying
        case (.relaying, .body(let buffer)):
            relayed.bytes += buffer.readableBytes
            relayed.flow?.observed.responseBody(buffer)
            interceptor.counters.bytesFromUpstream.add(buffer.readableBytes)
            context.write(self.wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
        case (.relaying, .end):
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
            let step = relayed.machine.attemptEnded(
                RequestStateMachine.AttemptEnd(
                    exchange: .completed(upstreamKeepAlive: relayed.upstreamKeepAlive, clientKeepAlive: relayed.clientKeepAlive),
                    requestComplete: true,
                    connectionUsable: lease.connection.isActive && lease.connection.isCurrent(interceptor.generation()),
                    draining: self.relay.registry.isDraining
                )
            )
            if case .finish(let keepAlive) = step.next { relayed.clientKeepAlive = keepAlive }
            self.finish(relayed, reusable: step.release == .reuse, brokerError: nil, context: context)
        case (.awaitingRequestEnd, _), (.awaitingResponse, .body), (.awaitingResponse, .end), (.relaying, .head):
            // Not what a response decoder yields; never reuse a connection that did it.
            lease.connection.close()
        }
    }

    fileprivate func relayReadComplete(for relayed: RelayedRequest) {
        guard relayed === self.current, let context = self.context, let lease = relayed.lease else { return }
        switch relayed.phase {
        case .awaitingResponse, .relaying:
            context.flush()
            if !context.channel.isWritable {
                // The client is not taking the bytes as fast as the origin sends them.
                relayed.paused = true
                lease.connection.pauseRelay()
            }
        case .awaitingRequestEnd:
            break
        }
    }

    fileprivate func relayFailed(_ error: UpstreamExchangeError, for relayed: RelayedRequest) {
        guard relayed === self.current, let context = self.context, let lease = relayed.lease else { return }
        let interceptor = self.relay.interceptor
        switch relayed.phase {
        case .awaitingResponse:
            var closed = false
            if case .connectionClosed = error { closed = true }
            let step = relayed.machine.attemptEnded(
                RequestStateMachine.AttemptEnd(
                    exchange: .failedBeforeHead(connectionClosed: closed), requestComplete: true,
                    closedByTLSAlert: lease.connection.closingTLSError != nil, connectionReused: lease.reused,
                    draining: self.relay.registry.isDraining
                )
            )
            if case .send = step.next {
                // A pooled connection the origin had closed: the full path sends it on a fresh one.
                self.handToFullPath(relayed, context: context, retrying: true)
                self.deliverHeld(context: context)
                return
            }
            let brokerError = interceptor.mapExchangeError(error, route: relayed.route, connection: lease.connection)
            if case .sendExchangeError(let keepAlive) = step.next, !keepAlive { relayed.clientKeepAlive = false }
            let (head, body) = brokerError.response(requestID: relayed.requestID, keepAlive: relayed.clientKeepAlive)
            relayed.flow?.observed.responded(head)
            relayed.flow?.observed.responseBody(body)
            context.write(self.wrapOutboundOut(.head(head)), promise: nil)
            context.write(self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
            interceptor.counters.brokerErrors.add(1)
            relayed.status = Int(brokerError.status.code)
            relayed.bytes = body.readableBytes
            self.finish(relayed, reusable: false, brokerError: brokerError.code.rawValue, context: context)
        case .relaying:
            // After the head the client cannot be told: what came before the failure goes out,
            // then its connection is cut (`finishAborting`), as on the full path.
            _ = relayed.machine.attemptEnded(RequestStateMachine.AttemptEnd(exchange: .abortedAfterHead, requestComplete: true))
            relayed.clientKeepAlive = false
            context.flush()
            self.finish(relayed, reusable: false, brokerError: RequestOutcome.abortedError, context: context)
            context.close(promise: nil)
        case .awaitingRequestEnd:
            break
        }
    }

    /// The relayed request is over: its connection goes back, the access line is written, and
    /// what arrived meanwhile is delivered.
    private func finish(_ relayed: RelayedRequest, reusable: Bool, brokerError: String?, context: ChannelHandlerContext) {
        guard self.end(relayed, release: reusable ? .reuse : .close) else { return }
        // Draining may have begun after the machine was asked and before `end` counted the
        // request out, and then saw this connection busy and left it open: ask again now that
        // it is counted out (the registry's Dekker pairing), or it would idle out the grace period.
        if relayed.clientKeepAlive, self.relay.registry.isDraining { relayed.clientKeepAlive = false }
        let interceptor = self.relay.interceptor
        interceptor.counters.requestsTotal.add(1)
        interceptor.counters.requestsRelayedDirectly.add(1)
        let outcome = RequestOutcome(
            status: relayed.status, bytes: relayed.bytes, brokerError: brokerError,
            disposition: relayed.clientKeepAlive ? .keepAlive : .close
        )
        ClientConnectionServer.logAccess(
            self.relay.logger, requestID: relayed.requestID, method: relayed.head.method, target: relayed.originDescription,
            outcome: outcome, since: relayed.started
        )
        if let flow = relayed.flow, let flows = interceptor.flows {
            flows.record(
                FlowRecord(
                    requestID: relayed.requestID, head: relayed.head, url: flow.url, startedAt: relayed.started, outcome: outcome,
                    observed: flow.observed, app: self.peer?.requester, intercepted: self.registration.isIntercepted
                )
            )
        }
        guard context.channel.isActive else { return }
        if !relayed.clientKeepAlive {
            let channel = context.channel
            channel.close(mode: .output).whenComplete { _ in channel.close(promise: nil) }
            return
        }
        self.deliverHeld(context: context)
    }

    /// Ends the relay's hold on `relayed` (its connection back to the pool, its counts undone;
    /// when `handingOver`, its connection's request count passes to the full path instead);
    /// false when it is not the current request (a late callback).
    private func end(_ relayed: RelayedRequest, release: RequestStateMachine.Release, handingOver: Bool = false) -> Bool {
        guard relayed === self.current else { return false }
        self.current = nil
        let interceptor = self.relay.interceptor
        if let lease = relayed.lease {
            relayed.lease = nil
            interceptor.pool.release(lease, release)
        }
        interceptor.counters.requestsInFlight.subtract(1)
        if !handingOver { self.relay.registry.requestEnded(self.registration) }
        return true
    }

    /// Delivers what arrived while a relayed response was in flight, in order, until another
    /// relay starts.
    private func deliverHeld(context: ChannelHandlerContext) {
        if !self.held.isEmpty {
            while !self.relayInFlight, !self.held.isEmpty {
                switch self.held.removeFirst() {
                case .part(let part): self.receive(part, context: context)
                case .error(let error): self.deliver(error, context: context)
                }
            }
            context.fireChannelReadComplete()
        }
        // Reads stopped while too much was held resume once there is room again.
        if self.readWithheld, !self.relayInFlight || self.held.count < Self.maxHeldParts {
            self.readWithheld = false
            context.read()
        }
    }
}

/// One request the direct relay has in hand.
final class RelayedRequest: UpstreamRelaySink {
    enum Phase {
        /// The head is in; its end (which follows at once for a body-less request) is not.
        case awaitingRequestEnd
        case awaitingResponse
        /// The response head went to the client.
        case relaying
    }

    private weak var handler: DirectRelayHandler?
    let head: HTTPRequestHead
    let route: UpstreamRoute
    /// `route.origin.description`, for the access line.
    let originDescription: String
    private let hostHeader: String
    private let pathAndQuery: String
    /// Made when the request goes upstream: a cache hit never does.
    lazy var upstreamHead = Interceptor.upstreamHead(for: self.head, hostHeader: self.hostHeader, pathAndQuery: self.pathAndQuery)
    let requestID = RequestIDs.make()
    let started = ContinuousClock.now
    var phase = Phase.awaitingRequestEnd
    var lease: PooledConnection<UpstreamConnection>?
    var status = 0
    var bytes = 0
    var upstreamKeepAlive = false
    var clientKeepAlive = true
    /// Reading from the origin is paused until the client is writable again.
    var paused = false
    /// What the flow log keeps of it; nil when the flow log is off.
    var flow: RelayedFlow?
    /// A fresh response from the cache that answers it, with its age: no upstream at all.
    var cachedHit: (entry: ResponseCache.Entry, age: Int)?
    /// The rules for its one upstream attempt, the full path's (`RequestStateMachine`).
    var machine = RequestStateMachine(.directlyRelayed)

    init(
        handler: DirectRelayHandler, head: HTTPRequestHead, route: UpstreamRoute, originDescription: String, hostHeader: String,
        pathAndQuery: String
    ) {
        self.handler = handler
        self.head = head
        self.route = route
        self.originDescription = originDescription
        self.hostHeader = hostHeader
        self.pathAndQuery = pathAndQuery
    }

    func upstreamReceived(_ part: HTTPClientResponsePart) {
        self.handler?.relayReceived(part, for: self)
    }

    func upstreamReadComplete() {
        self.handler?.relayReadComplete(for: self)
    }

    func upstreamFailed(_ error: UpstreamExchangeError) {
        self.handler?.relayFailed(error, for: self)
    }
}

/// What the flow log keeps of a relayed request while it is in flight (on the event loop).
struct RelayedFlow {
    let url: String
    var observed: FlowObservation

    init(url: String, bodyLimit: Int?) {
        self.url = url
        self.observed = FlowObservation(bodyLimit: bodyLimit)
        // No credential, identity or rule applies on the relay (`DirectRelayHandler`), and a
        // relayed request has no body (`DirectRelayPolicy`): the empty capture says so.
        self.observed.applied.relayedDirectly = true
    }
}
