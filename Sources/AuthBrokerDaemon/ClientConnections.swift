import AuthBrokerCore
import AuthBrokerPAM
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// One registered client connection, as draining needs to know it.
package final class RegisteredClientConnection: Sendable {
    package let id: Int
    fileprivate let channel: any Channel
    /// Requests in hand (the full path's and the direct relay's). Counted without the registry's
    /// lock, which both event loops would otherwise take twice per request.
    fileprivate let requests = Atomic<Int>(0)
    /// Serving an open-ended response (the agent stream), which draining ends instead of
    /// waiting out the grace period for it.
    fileprivate let servesEventStream = Atomic<Bool>(false)
    /// The connection's CONNECT was intercepted: its requests came inside the client's TLS.
    private let intercepted = Atomic<Bool>(false)

    package var isIntercepted: Bool { self.intercepted.load(ordering: .relaxed) }
    /// Requests in hand now (the relay's and the full path's).
    package var requestsInHand: Int { self.requests.load(ordering: .sequentiallyConsistent) }

    func markIntercepted() {
        self.intercepted.store(true, ordering: .relaxed)
    }

    fileprivate init(id: Int, channel: any Channel) {
        self.id = id
        self.channel = channel
    }
}

/// Every open client connection, so that a graceful shutdown can close the idle ones at once
/// and the busy ones as soon as their response ends.
///
/// A request's start and draining race without a lock (Dekker's pattern, sequentially
/// consistent): a start counts itself, then looks at `draining`; draining sets it, then looks
/// at the counts. So either the start sees the drain and backs out, or the drain sees the
/// request and leaves its connection open.
package final class ClientConnectionRegistry: Sendable {
    private struct State {
        var nextID = 0
        var entries: [Int: RegisteredClientConnection] = [:]
    }
    private let state = NIOLockedValueBox(State())
    private let draining = Atomic<Bool>(false)

    package init() {}

    package var isDraining: Bool { self.draining.load(ordering: .sequentiallyConsistent) }
    package var count: Int { self.state.withLockedValue { $0.entries.count } }

    /// Registers a connection; nil when the daemon is draining (close it).
    package func register(_ channel: any Channel) -> RegisteredClientConnection? {
        self.state.withLockedValue { state in
            guard !self.isDraining else { return nil }
            state.nextID += 1
            let connection = RegisteredClientConnection(id: state.nextID, channel: channel)
            state.entries[connection.id] = connection
            return connection
        }
    }

    package func unregister(_ connection: RegisteredClientConnection) {
        self.state.withLockedValue { _ = $0.entries.removeValue(forKey: connection.id) }
    }

    package func requestStarted(_ connection: RegisteredClientConnection) {
        connection.requests.wrappingAdd(1, ordering: .sequentiallyConsistent)
    }

    /// A request the direct relay would take; refused while draining (the full path answers it).
    package func startRequestUnlessDraining(_ connection: RegisteredClientConnection) -> Bool {
        self.requestStarted(connection)
        guard !self.isDraining else {
            self.requestEnded(connection)
            return false
        }
        return true
    }

    package func requestEnded(_ connection: RegisteredClientConnection) {
        connection.requests.wrappingSubtract(1, ordering: .sequentiallyConsistent)
    }

    /// The connection starts an open-ended response. Returns false when the daemon is draining
    /// (answer 503 instead); otherwise draining will close the connection, ending the stream.
    /// (The same Dekker pairing as `startRequestUnlessDraining`.)
    package func eventStreamStarted(_ connection: RegisteredClientConnection) -> Bool {
        connection.servesEventStream.store(true, ordering: .sequentiallyConsistent)
        return !self.isDraining
    }

    /// Stops taking requests: idle connections close now, busy ones after their response, and
    /// event streams (agents) now: they would never end on their own.
    /// Once: a second call (shutdown's last listener, after SIGTERM began it) changes nothing,
    /// and must not close a connection that has since ended a response whose bytes are still
    /// queued (a full close would drop them; the request's own end half-closes after them).
    package func beginDraining() {
        let closing = self.state.withLockedValue { state -> [any Channel] in
            // Under the lock, so no registration is between its check and its entry.
            guard !self.draining.exchange(true, ordering: .sequentiallyConsistent) else { return [] }
            return state.entries.values.filter {
                $0.requests.load(ordering: .sequentiallyConsistent) == 0 || $0.servesEventStream.load(ordering: .sequentiallyConsistent)
            }.map(\.channel)
        }
        for channel in closing { channel.close(promise: nil) }
    }

    package func closeAll() {
        let all = self.state.withLockedValue { $0.entries.values.map(\.channel) }
        for channel in all { channel.close(promise: nil) }
    }
}

/// A client connection as the listener accepted it: registered, with its direct relay in place.
package struct AcceptedClientConnection: Sendable {
    package var connection: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>
    package var registration: RegisteredClientConnection
    package var relay: DirectRelayLink
    /// The process that connected, read at accept (see `ConnectionPeer`).
    package var peer: ConnectionPeer?
    /// `/v1/` requests are served: on the Unix socket, not on the proxy port, where any web page
    /// the user's browser shows could send them (to `127.0.0.1`, or to a name rebound to it).
    package var servesControlAPI: Bool

    /// Sets up an accepted channel's pipeline and registers it; on the channel's event loop.
    /// `serve` gets the connection once, when its full path is first needed or when it closes
    /// (`DirectRelayHandler`), and must run `ClientConnectionServer.serve` for it.
    /// - Throws: `ClientConnectionRefused` while the daemon drains (the channel is then closed).
    package static func configure(
        _ channel: any Channel, relay: DirectRelay, peer: ConnectionPeer? = nil, terms: ClientConnectionTerms,
        servesControlAPI: Bool = true, serve: @escaping @Sendable (AcceptedClientConnection) -> Void,
        onTimeout: @escaping @Sendable (ClientWaitState.Deadline) -> Void
    ) throws -> AcceptedClientConnection {
        guard let registration = relay.registry.register(channel) else { throw ClientConnectionRefused() }
        let registry = relay.registry
        let counters = relay.interceptor.counters
        counters.clientConnectionsOpen.add(1)
        channel.closeFuture.whenComplete { _ in
            registry.unregister(registration)
            counters.clientConnectionsOpen.subtract(1)
        }
        // No pipelining assistance: the connection's task takes one request at a time from the
        // inbound stream (whose watermarks bound what is read ahead) and answers in order, and
        // the direct relay holds what comes during its responses, so the handler's pausing of
        // reads per request (two epoll_ctl calls each) buys nothing.
        // Framing both ways is decided in one place each: `RequestFramingCheck` for what comes
        // in, `ResponseEncoder` for what goes out. The decoder keeps the bytes after a CONNECT
        // for the tunnel (`ClientTunnel`).
        try channel.pipeline.syncOperations.addHandler(
            ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes, limitConfiguration: .requestHeads(upTo: terms.maxHeadBytes)))
        )
        // Heads normalised before the decoder, which refuses a tab after `Content-Length: 5`.
        let normalizer = HeadNormalizer(.requests, maxHeadBytes: terms.maxHeadBytes)
        try channel.pipeline.syncOperations.addHandler(normalizer, position: .first)
        // Head and idle timeouts: bytes are seen before the decoder, heads and ends after it.
        let timeoutState = ClientTimeoutState()
        let timeouts = ClientTimeoutHandler(terms: terms, state: timeoutState, onTimeout: onTimeout)
        let framing = RequestFramingCheck(normalizer: normalizer)
        try channel.pipeline.syncOperations.addHandler(framing)
        try channel.pipeline.syncOperations.addHandler(ResponseEncoder(methods: framing, timeouts: timeouts))
        try channel.pipeline.syncOperations.addHandler(ClientBytesObserver(state: timeoutState, timeouts: timeouts), position: .first)
        try channel.pipeline.syncOperations.addHandler(timeouts)
        // Room for a few upstream reads on their way to the client before reading from the origin
        // pauses: with NIO's default 64 KiB the direct relay paused a fast download after nearly
        // every read (a relayed 1 GiB download: about 1090 MiB/s with it, 1360 with this).
        try channel.syncOptions?.setOption(.writeBufferWaterMark, value: .init(low: 128 * 1024, high: 512 * 1024))
        let handovers = RelayHandoverSlot()
        let handler = DirectRelayHandler(relay: relay, registration: registration, handovers: handovers, peer: peer)
        try channel.pipeline.syncOperations.addHandler(handler)
        let connection = try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
            wrappingChannelSynchronously: channel
        )
        let accepted = AcceptedClientConnection(
            connection: connection, registration: registration,
            relay: DirectRelayLink(handler: NIOLoopBound(handler, eventLoop: channel.eventLoop), handovers: handovers), peer: peer,
            servesControlAPI: servesControlAPI
        )
        handler.startFullPathWhenNeeded { serve(accepted) }
        return accepted
    }
}

extension ClientConnectionServer {
    /// Returns when `closeFuture` completes, or when the waiting task is cancelled (an
    /// EventLoopFuture's `get()` is not cancellable, and a task group waiting for the client to
    /// go would wait for its close after the answer it raced came).
    package static func untilClosed(_ closeFuture: EventLoopFuture<Void>) async {
        let (closed, signal) = AsyncStream<Void>.makeStream()
        closeFuture.whenComplete { _ in signal.finish() }
        for await _ in closed {}
    }
}

/// The daemon is draining and takes no new connection.
package struct ClientConnectionRefused: Error {}

/// Serves one client connection: reads requests one at a time and answers each exactly once,
/// from the control API (`/v1/...`) or the interceptor (absolute-form targets). Plain requests
/// the connection's `DirectRelayHandler` relays itself never reach it.
package struct ClientConnectionServer: Sendable {
    package let interceptor: Interceptor
    package let control: ControlAPI
    package let registry: ClientConnectionRegistry
    package let counters: BrokerCounters
    package let settings: BrokerSettings
    package let logger: Logger
    /// A plain TCP connection for a CONNECT's blind tunnel, on the client's event loop
    /// (`UpstreamConnector.openBlindTunnel`).
    package let openTunnel: @Sendable (CanonicalOrigin, any EventLoop) async throws -> any Channel
    /// Which CONNECTs are intercepted, and the local CA that ends their TLS.
    package let interception: InterceptionScope

    package func serve(_ accepted: AcceptedClientConnection) async {
        let connection = accepted.connection
        let channel = connection.channel
        self.counters.clientConnectionsOnFullPath.add(1)
        defer { self.counters.clientConnectionsOnFullPath.subtract(1) }
        // Ending a connection after a complete response must not drop bytes still queued for
        // the socket: shut the output down once they are written, then close.
        let closeClient: @Sendable () -> Void = {
            channel.close(mode: .output).whenComplete { _ in channel.close(promise: nil) }
        }
        let abortClient: @Sendable () -> Void = { channel.close(promise: nil) }
        // Who is on the other end, for grants that belong to one process (PAM re-authentication):
        // read at accept, while the pid could only name the process that connected.
        let peer = accepted.peer
        let registry = self.registry
        let draining: @Sendable () -> Bool = { registry.isDraining }
        let closeFuture = channel.closeFuture
        let clientGone: @Sendable () async -> Void = { await Self.untilClosed(closeFuture) }

        try? await connection.executeThenClose { inbound, outbound in
            // Kept small: this frame and the wait for the next part are all that an idle
            // connection's task holds (a task keeps the stack its deepest await needed, so
            // answering here inline cost ~5 KiB per idle connection). The work is in functions
            // called when there is some.
            var requests = inbound.makeAsyncIterator()
            while true {
                let part: HTTPServerRequestPart?
                do {
                    part = try await requests.next()
                } catch {
                    await self.refuseMalformedRequest(error, writer: outbound, channel: channel)
                    return
                }
                guard case .head(let head)? = part else { return }
                let keepOpen = await self.serveFullPath(
                    head, accepted: accepted, peer: peer, requests: &requests, writer: outbound,
                    clientGone: clientGone, closeClient: closeClient, abortClient: abortClient, draining: draining
                )
                if !keepOpen { return }
            }
        }
        // A challenge the relay handed over just as the connection ended: its connection goes.
        if let leftover = accepted.relay.handovers.takeAny()?.adopted {
            self.interceptor.pool.release(leftover.lease, reusable: false)
        }
    }

    /// Garbage or an oversized head: answers 400 once and closes; the daemon carries on.
    @inline(never)  // out of the connection loop's frame, see `serve`
    private func refuseMalformedRequest(_ error: any Error, writer: ClientResponseWriter, channel: any Channel) async {
        if error is NIOSSLError || error is BoringSSLError {
            // An intercepted connection's TLS failed: nothing can be said to the client in it.
            self.reportInterceptedTLSFailure(error)
            channel.close(promise: nil)
            return
        }
        let brokerError: BrokerError =
            if case HTTPParserError.headerOverflow = error {
                .requestHeadTooLarge(limit: self.settings.limits.maxRequestHeadBytes)
            } else if let refusal = error as? InterceptedTargetRefused {
                .badRequest(code: .invalidHost, detail: "\(refusal).")
            } else {
                .malformedRequest(error)
            }
        let (head, body) = brokerError.response(requestID: RequestIDs.make(), keepAlive: false)
        try? await writer.write(contentsOf: [.head(head), .body(.byteBuffer(body)), .end(nil)])
        try? await channel.close(mode: .output).get()
        self.counters.brokerErrors.add(1)
        self.logger.notice(
            "malformed request from client; connection closed",
            metadata: ["error": "\(brokerError.code)"]
        )
    }

    /// The most common cause by far is a program that does not trust the local CA: the log says
    /// how to give it the CA bundle, or to let the host through untouched.
    private func reportInterceptedTLSFailure(_ error: any Error) {
        if case NIOSSLError.uncleanShutdown = error { return }  // a client that left without close_notify
        self.counters.brokerErrors.add(1)
        self.logger.notice(
            "an intercepted client's TLS failed; if the program does not trust the broker's local CA, run it with `authbrokerctl run -- PROGRAM` (or point it at the CA bundle `authbrokerctl env` names), or list the host in [proxy] tunnel",
            metadata: ["error": "\(error)"]
        )
    }

    /// Serves one request the direct relay passed on; whether the connection stays open.
    @inline(never)  // out of the connection loop's frame, see `serve`
    private func serveFullPath(
        _ head: HTTPRequestHead, accepted: AcceptedClientConnection, peer: ConnectionPeer?,
        requests: inout ClientRequestIterator, writer: ClientResponseWriter,
        clientGone: @escaping @Sendable () async -> Void, closeClient: @escaping @Sendable () -> Void,
        abortClient: @escaping @Sendable () -> Void, draining: @escaping @Sendable () -> Bool
    ) async -> Bool {
        // A request the relay hands over is counted already (`RelayHandover`).
        let handover = accepted.relay.handovers.take(for: head)
        if handover == nil { self.registry.requestStarted(accepted.registration) }
        // Each request runs in a child task that borrows the iterator: a task keeps the
        // stack slabs its deepest await needed until it ends, so serving requests in the
        // connection's own task left ~30 KiB on every idle connection.
        let borrowed = BorrowedRequests(requests)
        async let handled = self.handle(
            head, handover: handover, peer: peer, registration: accepted.registration, servesControlAPI: accepted.servesControlAPI,
            requests: borrowed, writer: writer, clientGone: clientGone, closeClient: closeClient, abortClient: abortClient, draining: draining
        )
        let outcome = await handled
        requests = borrowed.iterator
        self.registry.requestEnded(accepted.registration)
        if outcome.disposition == .close || self.registry.isDraining {
            // Writes handed to the writer reach the channel in order before this
            // half-close, which completes once they are on the socket.
            try? await accepted.connection.channel.close(mode: .output).get()
            return false
        }
        // Only now may the direct relay answer the next request: this one's response is
        // written, and the connection stays open.
        accepted.relay.fullPathRequestDone()
        return true
    }

    private func handle(
        _ head: HTTPRequestHead, handover: RelayHandover?, peer: ConnectionPeer?, registration: RegisteredClientConnection,
        servesControlAPI: Bool, requests borrowed: BorrowedRequests,
        writer: ClientResponseWriter, clientGone: @escaping @Sendable () async -> Void,
        closeClient: @escaping @Sendable () -> Void, abortClient: @escaping @Sendable () -> Void,
        draining: @escaping @Sendable () -> Bool
    ) async -> RequestOutcome {
        var requests = borrowed.iterator
        defer { borrowed.iterator = requests }
        let requestID = RequestIDs.make()
        let started = ContinuousClock.now
        var logger = self.logger
        logger[metadataKey: "request_id"] = "\(requestID)"
        self.counters.requestsTotal.add(1)
        self.counters.requestsInFlight.add(1)
        defer { self.counters.requestsInFlight.subtract(1) }
        // The flow log's view of this request; control requests are the broker's own, not a flow.
        let flows = self.interceptor.flows
        // (Origin-form targets are the control API's; intercepted ones were made absolute.)
        let isControl = head.uri.hasPrefix("/")
        let capture = flows?.isRecording == true && !isControl ? FlowCapture(bodyLimit: flows?.bodyLimit) : nil
        var target = "-"
        var flowURL = head.uri
        let outcome = await FlowCapture.$current.withValue(capture) {
            await self.dispatch(
                head, handover: handover, peer: peer, registration: registration, servesControlAPI: servesControlAPI,
                requestID: requestID, logger: logger, requests: &requests, writer: writer, clientGone: clientGone,
                closeClient: closeClient, abortClient: abortClient, draining: draining, target: &target, flowURL: &flowURL
            )
        }
        Self.logAccess(logger, requestID: requestID, method: head.method, target: target, outcome: outcome, since: started)
        if let flows, let capture {
            flows.record(
                FlowRecord(
                    requestID: requestID, head: head, url: flowURL, startedAt: started, outcome: outcome,
                    observed: capture.snapshot, app: peer?.requester, intercepted: registration.isIntercepted
                )
            )
        }
        return outcome
    }

    /// One request's answer, by its target: a tunnel, the control API, a `[[respond]]` rule or
    /// the interceptor, or the broker's error.
    private func dispatch(
        _ head: HTTPRequestHead, handover: RelayHandover?, peer: ConnectionPeer?, registration: RegisteredClientConnection,
        servesControlAPI: Bool, requestID: String, logger: Logger, requests: inout ClientRequestIterator,
        writer: ClientResponseWriter, clientGone: @escaping @Sendable () async -> Void,
        closeClient: @escaping @Sendable () -> Void, abortClient: @escaping @Sendable () -> Void,
        draining: @escaping @Sendable () -> Bool, target: inout String, flowURL: inout String
    ) async -> RequestOutcome {
        // After a CONNECT the decoder reads no more heads (the bytes are the tunnel's), so a
        // refused one ends the connection; its response has no body and no length, which the
        // close delimits (RFC 9112 §6.3).
        let isConnect: Bool = if case .CONNECT = head.method { true } else { false }
        let keepAlive = head.isKeepAlive && head.version == .http1_1 && !isConnect

        let outcome: RequestOutcome
        // The direct relay hands over only requests the proxy branch below takes; anywhere else
        // its connection is not needed.
        var adopted = handover?.adopted
        defer { if let adopted { self.interceptor.pool.release(adopted.lease, reusable: false) } }
        if Self.approximateSize(of: head) > self.settings.limits.maxRequestHeadBytes {
            outcome = await self.interceptor.respondWithError(
                .requestHeadTooLarge(limit: self.settings.limits.maxRequestHeadBytes), requestID: requestID,
                logger: logger, requests: &requests, writer: writer, clientWantsKeepAlive: false
            )
        } else {
            switch RequestTarget.parse(method: head.method.rawValue, uri: head.uri) {
            case .failure(let error):
                outcome = await self.interceptor.respondWithError(
                    .badRequest(error), requestID: requestID, logger: logger, requests: &requests,
                    writer: writer, clientWantsKeepAlive: keepAlive
                )
            case .success(.authority(let host, let port)):
                // The tunnel's far end; a CONNECT goes to TLS servers (the scheme routes nothing else).
                let origin = try? CanonicalOrigin(scheme: .https, host: host, port: port)
                target = origin?.authorityForm ?? "\(host):\(port)"
                flowURL = target
                if self.registry.isDraining {
                    outcome = await self.interceptor.respondWithError(
                        .shuttingDown(), requestID: requestID, logger: logger, requests: &requests,
                        writer: writer, clientWantsKeepAlive: false
                    )
                } else if let origin {
                    outcome = await self.tunnel(
                        to: origin, head: head, peer: peer, requestID: requestID, logger: logger,
                        requests: &requests, writer: writer, channel: registration.channel, registration: registration
                    )
                } else {
                    outcome = await self.interceptor.respondWithError(
                        .badRequest(code: .invalidHost, detail: "CONNECT \(target) does not name a host this broker can reach."),
                        requestID: requestID, logger: logger, requests: &requests, writer: writer, clientWantsKeepAlive: false
                    )
                }
            case .success(.asterisk):
                outcome = await self.interceptor.respondWithError(
                    .badRequest(
                        code: .asteriskNotSupported,
                        detail: "OPTIONS * asks about the broker itself, which has nothing to say; send OPTIONS https://host/path for an origin."
                    ),
                    requestID: requestID, logger: logger, requests: &requests, writer: writer,
                    clientWantsKeepAlive: keepAlive
                )
            case .success(.control(let path, _)) where !servesControlAPI:
                target = path
                outcome = await self.interceptor.respondWithError(
                    .badRequest(
                        code: .notAbsolute,
                        detail: "The proxy port takes proxy requests only: absolute-form (GET http://host/path HTTP/1.1) and CONNECT. The control API (/v1/) is on the daemon's Unix socket; use authbrokerctl."
                    ),
                    requestID: requestID, logger: logger, requests: &requests, writer: writer, clientWantsKeepAlive: false
                )
            case .success(.control(let path, let query)):
                target = path
                outcome = await self.serveControl(
                    head, path: path, query: query, peer: peer, registration: registration, requestID: requestID,
                    logger: logger, requests: &requests, writer: writer, keepAlive: keepAlive
                )
            case .success(.absolute(let origin, let pathAndQuery)):
                // Only the origin is logged: paths and queries can carry tokens.
                target = origin.description
                flowURL = origin.description + pathAndQuery
                let rules = self.interceptor.rules.current
                // A request the relay began before the drain is served (with Connection: close).
                if self.registry.isDraining, handover == nil {
                    outcome = await self.interceptor.respondWithError(
                        .shuttingDown(), requestID: requestID, logger: logger, requests: &requests,
                        writer: writer, clientWantsKeepAlive: false
                    )
                } else if let rule = rules.responses.first(where: {
                    $0.matches(method: head.method.rawValue, origin: origin, pathAndQuery: pathAndQuery)
                }) {
                    outcome = await self.respond(
                        with: rule, head: head, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                        keepAlive: keepAlive
                    )
                } else {
                    let exchange = adopted
                    adopted = nil
                    var client = ClientSide(
                        requestID: requestID, peer: peer, logger: logger, writer: writer, close: closeClient,
                        abort: abortClient, draining: draining, gone: clientGone
                    )
                    // A [[rewrite]]: another URL, other request fields; response fields at the pump.
                    var (head, origin, pathAndQuery) = (head, origin, pathAndQuery)
                    if let rule = rules.rewrites.first(where: {
                        $0.match.matches(method: head.method.rawValue, origin: origin, pathAndQuery: pathAndQuery)
                    }) {
                        (origin, pathAndQuery) = rule.rewritten(origin: origin, pathAndQuery: pathAndQuery)
                        head.uri = origin.description + pathAndQuery
                        rule.editRequest(&head.headers)
                        client.rewrite = rule
                        FlowCapture.current?.apply {
                            $0.rule = "rewrite config.toml:\(rule.line)"
                            switch rule.target {
                            case .url?: $0.rewrittenTo = origin.description + pathAndQuery
                            case .connectTo(let host, let port)?: $0.rewrittenTo = CanonicalOrigin.authorityForm(host: host, port: port)
                            case nil: break
                            }
                        }
                        logger.debug("a [[rewrite]] rule applies", metadata: ["line": "\(rule.line)", "to": "\(origin)"])
                    }
                    outcome = await self.interceptor.fetch(
                        head: head, origin: origin, pathAndQuery: pathAndQuery, adopted: exchange,
                        closedConnectionRetried: handover?.closedConnectionRetried ?? false, client: client, requests: &requests
                    )
                }
            }
        }
        return outcome
    }

    /// Answers from a `[[respond]]` rule: the request body is read and dropped, nothing goes to
    /// the network. The response carries `Authbroker-Rule: respond config.toml:LINE`, so it is
    /// never taken for the origin's.
    private func respond(
        with rule: CannedResponse, head: HTTPRequestHead, requestID: String, logger: Logger,
        requests: inout ClientRequestIterator, writer: ClientResponseWriter, keepAlive: Bool
    ) async -> RequestOutcome {
        let drained = await drainRequestBody(&requests)
        if case .malformed(let error) = drained {
            return await self.interceptor.respondWithError(
                .malformedRequest(error), requestID: requestID, logger: logger, requests: &requests, writer: writer,
                clientWantsKeepAlive: false, requestEnded: true
            )
        }
        let body: [UInt8]
        switch rule.body {
        case .inline(let bytes):
            body = bytes
        case .file(let path):
            do {
                body = try await NIOThreadPool.singleton.runIfActive {
                    guard let bytes = try PrivateFiles.readOwnedFile(
                        path, what: "the [[respond]] file", maxBytes: CannedResponse.maxBodyBytes, requireOwnership: false
                    ) else {
                        throw PrivateFileError(.io, "\(path) does not exist")
                    }
                    return bytes
                }
            } catch {
                let problem = BrokerError(
                    code: .destinationUnavailable, status: .badGateway, proxyErrorType: .destinationUnavailable,
                    title: "A [[respond]] file cannot be read",
                    detail: "The [[respond]] rule on line \(rule.line) of config.toml answers from a file that cannot be read: \(error). Fix the file or the rule."
                )
                return await self.interceptor.respondWithError(
                    problem, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                    clientWantsKeepAlive: keepAlive && drained == .ended, requestEnded: true
                )
            }
        }
        var headers = HTTPHeaders()
        for field in rule.headers { headers.add(name: field.name, value: field.value) }
        headers.add(name: "Content-Length", value: String(body.count))
        headers.add(name: BrokerHeaders.rule, value: "respond config.toml:\(rule.line)")
        headers.add(name: BrokerHeaders.requestID, value: requestID)
        let keep = keepAlive && drained == .ended && !self.registry.isDraining
        if !keep { headers.add(name: "Connection", value: "close") }
        let status = HTTPResponseStatus(statusCode: rule.status)
        let responseHead = HTTPResponseHead(version: .http1_1, status: status, headers: headers)
        var parts: [HTTPServerResponsePart] = [.head(responseHead)]
        if let capture = FlowCapture.current {
            capture.responded(responseHead)
            capture.apply { $0.rule = "respond config.toml:\(rule.line)" }
        }
        if head.method != .HEAD, !body.isEmpty {
            let buffer = ByteBuffer(bytes: body)
            FlowCapture.current?.responseBody(buffer)
            parts.append(.body(.byteBuffer(buffer)))
        }
        parts.append(.end(nil))
        try? await writer.write(contentsOf: parts)
        logger.debug("answered from a [[respond]] rule", metadata: ["line": "\(rule.line)"])
        return RequestOutcome(status: rule.status, bytes: body.count, brokerError: nil, disposition: keep ? .keepAlive : .close)
    }

    /// The access line of one request (both paths). `target`: the origin only, as paths and
    /// queries can carry tokens.
    static func logAccess(
        _ logger: Logger, requestID: String, method: HTTPMethod, target: String, outcome: RequestOutcome,
        since started: ContinuousClock.Instant
    ) {
        guard logger.logLevel <= .info else { return }
        let elapsed = ContinuousClock.now - started
        let access = AccessLine(
            bytes: outcome.bytes,
            durationMilliseconds: elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000,
            error: outcome.brokerError, method: method.rawValue, requestID: requestID, status: outcome.status,
            target: target
        )
        if let handler = logger.handler as? BrokerLogHandler, handler.logsAccessDirectly {
            handler.logAccess(access)
        } else {
            logger.info(BrokerLogHandler.accessLineMessage, metadata: access.metadata)
        }
    }

    private func serveControl(
        _ head: HTTPRequestHead, path: String, query: String?, peer: ConnectionPeer?,
        registration: RegisteredClientConnection, requestID: String, logger: Logger,
        requests: inout ClientRequestIterator, writer: ClientResponseWriter, keepAlive: Bool
    ) async -> RequestOutcome {
        var body = ByteBuffer()
        var complete = false
        do {
            while let part = try await requests.next() {
                switch part {
                case .body(var chunk):
                    guard body.readableBytes + chunk.readableBytes <= ControlAPI.maxBodyBytes else {
                        let error = BrokerError(
                            code: .bodyTooLarge, status: .payloadTooLarge, title: "Request body too large",
                            detail: "Control requests take at most \(ControlAPI.maxBodyBytes) bytes of JSON."
                        )
                        return await self.interceptor.respondWithError(
                            error, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                            clientWantsKeepAlive: false, requestEnded: true
                        )
                    }
                    body.writeBuffer(&chunk)
                case .end:
                    complete = true
                case .head:
                    break
                }
                if complete { break }
            }
        } catch {}
        guard complete else { return .clientClosed }
        if head.method == .GET, path == "/v1/agent", let challenges = self.control.challenges {
            guard self.registry.eventStreamStarted(registration) else {
                return await self.interceptor.respondWithError(
                    .shuttingDown(), requestID: requestID, logger: logger, requests: &requests, writer: writer,
                    clientWantsKeepAlive: false, requestEnded: true
                )
            }
            return await self.serveAgent(challenges, requestID: requestID, logger: logger, requests: &requests, writer: writer)
        }
        if head.method == .GET, path == "/v1/flows", let flows = self.control.flows, flows.isEnabled,
            case let parameters = ControlAPI.queryParameters(query),
            (try? ControlAPI.flag(parameters["follow"], name: "follow")) == true,
            let last = try? ControlAPI.flowCount(parameters)
        {
            guard self.registry.eventStreamStarted(registration) else {
                return await self.interceptor.respondWithError(
                    .shuttingDown(), requestID: requestID, logger: logger, requests: &requests, writer: writer,
                    clientWantsKeepAlive: false, requestEnded: true
                )
            }
            return await self.serveFlowStream(flows, last: last, requestID: requestID, requests: &requests, writer: writer)
        }
        // Off the event loop this connection's task prefers: control requests read and write
        // files and may wait on the keyring.
        let control = self.control
        let response = await withTaskExecutorPreference(globalConcurrentExecutor) {
            await control.handle(
                method: head.method, path: path, query: query, body: body, requestID: requestID, peer: peer?.identity
            )
        }
        var headers = response.headers
        headers.replaceOrAdd(name: BrokerHeaders.requestID, value: requestID)
        let keep = keepAlive && !self.registry.isDraining
        if !keep { headers.replaceOrAdd(name: "Connection", value: "close") }
        if response.status.code >= 400 { self.counters.brokerErrors.add(1) }
        try? await writer.write(
            contentsOf: [
                .head(HTTPResponseHead(version: .http1_1, status: response.status, headers: headers)),
                .body(.byteBuffer(response.body)), .end(nil),
            ]
        )
        return RequestOutcome(
            status: Int(response.status.code), bytes: response.body.readableBytes,
            brokerError: response.status.code >= 400 ? "control_error" : nil, disposition: keep ? .keepAlive : .close
        )
    }

    /// `GET /v1/agent`: a long-lived stream of JSON lines — `attached` (with the agent's id), then
    /// `challenge`, `withdrawn` and `notice` events — until the agent disconnects, which withdraws it from
    /// every challenge it holds. Answers come on other connections (`POST /v1/agent/{id}/answer`).
    private func serveAgent(
        _ challenges: AgentChallenges, requestID: String, logger: Logger, requests: inout ClientRequestIterator,
        writer: ClientResponseWriter
    ) async -> RequestOutcome {
        let (agent, events) = await challenges.attachAgent()
        logger.info("agent attached", metadata: ["agent": "\(agent)"])
        await Self.serveJSONLines(
            first: [Self.line(AgentEventJSON(event: "attached", agent: String(agent)))], then: events, requestID: requestID,
            requests: &requests, writer: writer
        ) { event in
            switch event {
            case .offered(let challenge, let space, let requester):
                Self.line(AgentEventJSON(event: "challenge", challenge: ChallengeJSON(challenge, space: space, requester: requester)))
            case .withdrawn(let challenge):
                Self.line(AgentEventJSON(event: "withdrawn", id: String(challenge)))
            case .notice(let notice):
                Self.line(AgentEventJSON(event: "notice", notice: .init(code: notice.code, host: notice.host, message: notice.message)))
            }
        }
        await challenges.detachAgent(agent)
        logger.info("agent detached", metadata: ["agent": "\(agent)"])
        return RequestOutcome(status: 200, bytes: 0, brokerError: nil, disposition: .close)
    }

    /// `GET /v1/flows?follow=true`: the last flows kept, then each flow as it ends, one JSON line
    /// each, until the client disconnects.
    private func serveFlowStream(
        _ flows: FlowLog, last: Int?, requestID: String, requests: inout ClientRequestIterator, writer: ClientResponseWriter
    ) async -> RequestOutcome {
        // Following first, so no flow ends unseen between the history and the live part.
        let (follower, live) = flows.follow()
        flows.startRecording()
        let history = flows.recent(last)
        let seen = history.last?.sequence ?? 0
        await Self.serveJSONLines(
            first: history.map { Self.line(FlowSummary($0)) }, then: live, requestID: requestID, requests: &requests, writer: writer
        ) { flow in
            flow.sequence > seen ? Self.line(FlowSummary(flow)) : nil
        }
        flows.unfollow(follower)
        return RequestOutcome(status: 200, bytes: 0, brokerError: nil, disposition: .close)
    }

    /// An open-ended `200` of JSON lines (`application/x-ndjson`, the agent and flow streams):
    /// `first`, then a line for each of `events` (nil: none), until the client closes its
    /// connection, as it sends nothing more.
    private static func serveJSONLines<Event: Sendable>(
        first: [ByteBuffer], then events: AsyncStream<Event>, requestID: String, requests: inout ClientRequestIterator,
        writer: ClientResponseWriter, line: @escaping @Sendable (Event) -> ByteBuffer?
    ) async {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/x-ndjson")
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: BrokerHeaders.requestID, value: requestID)
        headers.add(name: "Connection", value: "close")
        try? await writer.write(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)))
        if !first.isEmpty { try? await writer.write(contentsOf: first.map { .body(.byteBuffer($0)) }) }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                for await event in events {
                    guard let buffer = line(event) else { continue }
                    do {
                        try await writer.write(.body(.byteBuffer(buffer)))
                    } catch {
                        return
                    }
                }
            }
            while (try? await requests.next()) != nil {}
            group.cancelAll()
        }
        try? await writer.write(.end(nil))
    }

    private static func line(_ value: some Encodable) -> ByteBuffer {
        var buffer = (try? BrokerJSON.encoder().encode(value)).map { ByteBuffer(bytes: $0) } ?? ByteBuffer()
        buffer.writeString("\n")
        return buffer
    }

    /// The request head's size as it was on the wire, near enough for the configured limit.
    static func approximateSize(of head: HTTPRequestHead) -> Int {
        var size = head.method.rawValue.utf8.count + 1 + head.uri.utf8.count + 11
        for (name, value) in head.headers {
            size += name.utf8.count + 2 + value.utf8.count + 2
        }
        return size + 2
    }
}

/// A client connection's request iterator, lent to the child task that serves one request and
/// taken back when it ends.
final class BorrowedRequests: @unchecked Sendable {  // one task at a time: the lender awaits the borrower
    var iterator: ClientRequestIterator

    init(_ iterator: ClientRequestIterator) {
        self.iterator = iterator
    }
}

/// Request ids: 15 hex digits (60 bits), enough to find one request's log lines. Fifteen, not
/// sixteen: Swift keeps a string of up to 15 bytes inline, so making one per request allocates
/// nothing. A counter from a random start, scrambled by a bijection on 60 bits (splitmix64's
/// finaliser with every step taken modulo 2^60), so ids never repeat within a run and do not
/// look sequential, at no system call per request (they are not secrets).
package enum RequestIDs {
    static let mask: UInt64 = (1 << 60) - 1
    private static let next = Atomic<UInt64>(UInt64.random(in: 0...mask))

    package static func make() -> String {
        let value = scrambled(Self.next.wrappingAdd(1, ordering: .relaxed).oldValue & Self.mask)
        // Written in place: one per request, so it is on the hot path.
        return String(unsafeUninitializedCapacity: 15) { digits in
            for index in 0..<15 {
                let nibble = UInt8(truncatingIfNeeded: value >> UInt64(56 - 4 * index)) & 0xF
                digits[index] = nibble < 10 ? UInt8(ascii: "0") + nibble : UInt8(ascii: "a") + nibble - 10
            }
            return 15
        }
    }

    /// One to one on values below 2^60: adding and multiplying by an odd number modulo 2^60,
    /// and `z ^ (z >> k)`, each are.
    static func scrambled(_ value: UInt64) -> UInt64 {
        var z = (value &+ 0x9E37_79B9_7F4A_7C15) & mask
        z = ((z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9) & mask
        z = ((z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB) & mask
        return z ^ (z >> 31)
    }
}

/// One line of the agent stream.
struct AgentEventJSON: Encodable {
    struct Notice: Encodable {
        var code: String
        var host: String
        var message: String
    }

    var event: String
    var agent: String? = nil
    var id: String? = nil
    var challenge: ChallengeJSON? = nil
    var notice: Notice? = nil
}
