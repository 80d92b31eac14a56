import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerKerberos
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOSSL
import AuthBrokerTrust

package typealias ClientRequestIterator = NIOAsyncChannelInboundStream<HTTPServerRequestPart>.AsyncIterator
package typealias ClientResponseWriter = NIOAsyncChannelOutboundWriter<HTTPServerResponsePart>

/// What the client connection does after a request.
package enum ConnectionDisposition: Sendable {
    case keepAlive
    case close
}

/// The result of one request, for the access log line and the counters.
package struct RequestOutcome: Sendable {
    package var status: Int
    package var bytes: Int
    package var brokerError: String?
    package var disposition: ConnectionDisposition

    /// The response was cut off after its head reached the client: the origin (or the cache's
    /// file) failed mid-body, or the client left mid-response; its connection is cut. The same
    /// on both paths, so the access line and the flow log say the same of the same event.
    static func aborted(status: Int, bytes: Int) -> RequestOutcome {
        RequestOutcome(status: status, bytes: bytes, brokerError: Self.abortedError, disposition: .close)
    }

    /// The client left before any response head reached it.
    static let clientClosed = RequestOutcome(status: 0, bytes: 0, brokerError: "client_closed", disposition: .close)

    static let abortedError = "aborted"
}

/// The client's side of one request, as the full path sees it: who asked, where the response
/// goes, and how the client connection ends.
package struct ClientSide: Sendable {
    package var requestID: String
    package var peer: ConnectionPeer?
    package var logger: Logger
    package var writer: ClientResponseWriter
    /// Ends the client connection after the response under way.
    package var close: @Sendable () -> Void
    /// Ends the client connection at once (its response was cut off).
    package var abort: @Sendable () -> Void
    /// Whether the daemon is draining (no connection is kept alive then).
    package var draining: @Sendable () -> Bool
    /// Returns when the client's connection has closed (no default: one that returns at once
    /// says the client has gone, and every challenge the broker would answer goes unanswered).
    package var gone: @Sendable () async -> Void
    /// The `[[rewrite]]` whose response header edits apply to what the client gets.
    package var rewrite: RewriteRule? = nil
    /// The request's use of the HTTP cache, when the cache covers its origin.
    var cache: CacheExchange? = nil

    package init(
        requestID: String, peer: ConnectionPeer?, logger: Logger, writer: ClientResponseWriter,
        close: @escaping @Sendable () -> Void, abort: @escaping @Sendable () -> Void,
        draining: @escaping @Sendable () -> Bool, gone: @escaping @Sendable () async -> Void
    ) {
        self.requestID = requestID
        self.peer = peer
        self.logger = logger
        self.writer = writer
        self.close = close
        self.abort = abort
        self.draining = draining
        self.gone = gone
    }
}

/// Fetches one absolute-form request upstream and streams the response back (the data plane).
///
/// The request body is pumped by the calling task (it owns the client's inbound iterator);
/// the response by a child task, so an `Expect: 100-continue` from the origin reaches the
/// client while the body is still to come.
package struct Interceptor: Sendable {
    package let pool: UpstreamPool<UpstreamConnection>
    package let settings: BrokerSettings
    /// `[[route]]`, `[[respond]]` and interception, as a reload last left them.
    package let rules: LiveRules
    package let counters: BrokerCounters
    /// The user's client identities (which one a request presents).
    package let store: TrustStore
    /// The current generation of trust and rules (pooled connections made under older ones are
    /// dropped).
    package let generation: @Sendable () -> ConnectionGeneration
    /// Answers Basic and Digest challenges from stored credentials.
    package let authenticator: HTTPAuthenticator
    /// Records which process had a client identity presented for it.
    package let audit: AuditLog?
    /// Asks agents about servers whose certificates do not verify (interactive requests only).
    package var challenges: AgentChallenges? = nil
    /// The flow log (`authbrokerctl flows`); nil in tests that do without.
    package var flows: FlowLog? = nil
    /// The HTTP cache (`[cache]`); nil when it is off.
    package var cache: ResponseCache? = nil

    package init(
        pool: UpstreamPool<UpstreamConnection>, settings: BrokerSettings, rules: LiveRules, counters: BrokerCounters,
        store: TrustStore, generation: @escaping @Sendable () -> ConnectionGeneration, authenticator: HTTPAuthenticator,
        audit: AuditLog?, challenges: AgentChallenges? = nil, flows: FlowLog? = nil, cache: ResponseCache? = nil
    ) {
        self.pool = pool
        self.settings = settings
        self.rules = rules
        self.counters = counters
        self.store = store
        self.generation = generation
        self.authenticator = authenticator
        self.audit = audit
        self.challenges = challenges
        self.flows = flows
        self.cache = cache
    }

    /// Methods whose response echoes the request received: TRACE (RFC 9110 §9.3.8). (IIS's
    /// TRACK never gets here: the request parser refuses it.)
    static func echoesRequest(_ method: HTTPMethod) -> Bool {
        method == .TRACE
    }

    /// Attempts per request at most: a stale pooled connection, a challenge, a stale nonce, and
    /// through a proxy its challenge and stale nonce too.
    static let maxAttempts = 6

    /// - Parameters:
    ///   - adopted: an exchange the client connection's direct relay started for this request
    ///     and hands over with its response head read (a challenge): the first attempt.
    ///   - closedConnectionRetried: the direct relay sent the request on a pooled connection the
    ///     origin had closed; sending it now is its one retry.
    package func proxy(
        head: HTTPRequestHead, origin: CanonicalOrigin, pathAndQuery: String, adopted: AdoptedExchange? = nil,
        closedConnectionRetried: Bool = false, client: ClientSide, requests: inout ClientRequestIterator
    ) async -> RequestOutcome {
        let (requestID, peer, logger, writer) = (client.requestID, client.peer, client.logger, client.writer)
        let (closeClient, abortClient, draining, clientGone) = (client.close, client.abort, client.draining, client.gone)
        // The `Authbroker-*` directives, read once: the identity it asks for, how long it may wait
        // for an agent (`Authbroker-Interactive`).
        let directives = BrokerDirectives(headers: head.headers)
        let route: UpstreamRoute
        do {
            route = try self.route(to: origin, identity: directives.identity, keyLog: directives.keyLog)
        } catch {
            return await self.respondWithError(
                error, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                clientWantsKeepAlive: head.isKeepAlive
            )
        }
        // Through the proxy, an http request goes in absolute form (RFC 9112 §3.2.2); https ones
        // go in origin form inside a CONNECT tunnel.
        let forwardProxy = origin.scheme == .http ? route.proxy : nil
        let upstreamTarget = forwardProxy == nil ? pathAndQuery : origin.description + pathAndQuery
        var upstreamHead = Self.upstreamHead(for: head, hostHeader: origin.hostHeader, pathAndQuery: pathAndQuery)
        upstreamHead.uri = upstreamTarget
        // The client's own Proxy-Authorization is for the configured proxy only, never an origin.
        let clientProxyAuthorization = route.proxy == nil ? nil : head.headers.first(name: "proxy-authorization")
        let agentWait = directives.interactiveWait
        let connectContext = UpstreamConnectContext.Value(
            requester: peer?.requester, agentWait: agentWait, clientProxyAuthorization: clientProxyAuthorization
        )
        if let identity = route.clientIdentity {
            self.audit?.record(.identityPresented(name: identity, origin: origin, requester: peer?.requester))
            FlowCapture.current?.apply { $0.identity = identity }
        }
        // RFC 9110 §10.1.1: an HTTP/1.0 client's Expect is ignored.
        let expectsContinue =
            (head.version.major, head.version.minor) >= (1, 1) && head.headers["expect"].contains { $0.lowercased() == "100-continue" }
        let clientWantsKeepAlive = head.isKeepAlive && head.version == .http1_1

        // A request without a body may be retried once on a fresh connection when a pooled
        // one turns out to have been closed by the origin before it answered.
        let bodyFraming = RequestBodyFraming(head)
        let hasNoBody = bodyFraming == .none
        // The body is kept (up to a bound) so the request can be sent again after a 401.
        let replay = ReplayBuffer(limit: self.settings.limits.requestBodyBufferBytes, head: head)
        let auth = NIOLockedValueBox(RequestAuthState(headers: head.headers))
        // A credential up front for a known space, and a fresh Kerberos token where one was taken
        // before (off the event loop): for the first attempt, and again for an attempt after a
        // response that used the last one up (a Digest nc, a token a replay cache keeps).
        let authorizeUpFront = { @Sendable () async in
            auth.withLockedValue { state in
                state = RequestAuthState(headers: head.headers)
                self.authenticator.authorizePreemptively(
                    origin: origin, method: head.method, uri: pathAndQuery, requester: { peer?.requester }, state: &state
                )
            }
            if self.authenticator.knowsNegotiate(at: origin) {
                var state = auth.withLockedValue { $0 }
                await self.authenticator.negotiatePreemptively(origin, uri: pathAndQuery, requester: peer?.requester, state: &state)
                auth.withLockedValue { $0 = state }
            }
        }
        // An adopted exchange went without a credential (the relay takes no origin with a known
        // space); one that became known meanwhile must not be taken as sent.
        // TRACE echoes the request it received (RFC 9110 §9.3.8: a client must not put what the
        // response would disclose in it): a stored credential added to it would come back to
        // an app that may not read secrets. It goes with the app's own fields only.
        let mayUseStoredCredentials = !Self.echoesRequest(head.method)
        if adopted == nil, mayUseStoredCredentials { await authorizeUpFront() }
        let proxyAuth = NIOLockedValueBox(RequestAuthState(proxyAuthorization: forwardProxy == nil ? nil : clientProxyAuthorization))
        // However the request ends, a password trial it still holds ends with it (`requestEnded`).
        defer {
            self.authenticator.requestEnded(auth.withLockedValue { $0 })
            self.authenticator.requestEnded(proxyAuth.withLockedValue { $0 })
        }
        if let forwardProxy, mayUseStoredCredentials {
            proxyAuth.withLockedValue { state in
                self.authenticator.authorizePreemptively(
                    origin: forwardProxy, method: head.method, uri: upstreamTarget, isProxy: true, requester: { peer?.requester },
                    state: &state
                )
            }
        }
        // A body too large to keep for a resend goes to a space the broker cannot authorize up
        // front only after the origin's 100 (or a timeout): its 401 comes first and is answered.
        let uploadPlan = UploadPlan(
            body: bodyFraming, clientExpectsContinue: expectsContinue,
            replayBound: self.settings.limits.requestBodyBufferBytes,
            credentialUpFront: auth.withLockedValue { $0.authorization != nil } || head.headers.contains(name: "authorization")
        )
        // The decisions (which attempt next, reuse, retry, keep-alive) are the machine's; this
        // loop leases, sends, pumps and reports back.
        var machine = RequestStateMachine(
            RequestStateMachine.Request(
                hasBody: !hasNoBody, idempotent: RequestStateMachine.Request.isIdempotent(method: head.method.rawValue),
                clientWantsKeepAlive: clientWantsKeepAlive,
                mayAskAboutTrust: agentWait != nil && self.challenges != nil, adopted: adopted != nil,
                closedConnectionRetried: closedConnectionRetried,
                maxAttempts: Self.maxAttempts, uploadPlan: uploadPlan
            )
        )
        // What the last attempt left, for the answer when the machine ends the request with it.
        var leaseError: BrokerError?
        var closingTLSError: (any Error)?
        var lastResult: ResponsePumpResult?
        var lastMalformedBody: (any Error)?
        var lastLeaseConnection: UpstreamConnection?
        var action = machine.start()
        while true {
            switch action {
            case .readRequestEnd:
                let ended: Bool
                if case .end? = try? await requests.next() { ended = true } else { ended = false }
                action = machine.requestEndRead(ended: ended)

            case .askAboutTrust:
                var trusted = false
                if let untrusted = leaseError?.serverTrustFailure, let wait = agentWait, let challenges = self.challenges {
                    trusted = await challenges.serverTrusted(untrusted, wait: wait, requester: peer?.requester, clientGone: clientGone)
                    if trusted { logger.debug("an agent trusted the server; connecting again") }
                }
                action = machine.trustAnswered(trusted)

            case .send(let attempt):
                var attemptHead = upstreamHead
                client.cache?.removeAbandonedConditions(from: &attemptHead.headers)
                if attempt.uploadPlan.addsExpect {
                    attemptHead.headers.replaceOrAdd(name: "Expect", value: "100-continue")
                }
                if let authorization = auth.withLockedValue({ $0.authorization }) {
                    attemptHead.headers.replaceOrAdd(name: "Authorization", value: authorization)
                }
                if forwardProxy != nil, let authorization = proxyAuth.withLockedValue({ $0.authorization }) ?? clientProxyAuthorization {
                    attemptHead.headers.replaceOrAdd(name: "Proxy-Authorization", value: authorization)
                }
                // A request without a body goes whole, head and end in one write.
                let sendsWhole = attempt.requestEnded && replay.isEmpty
                let lease: PooledConnection<UpstreamConnection>
                let exchange: UpstreamExchange
                if attempt.adopted, let adopted {
                    // Sent already, by the direct relay, as this attempt would have sent it: a
                    // relayed request has no body, directive, credential or proxy.
                    (lease, exchange) = (adopted.lease, adopted.exchange)
                } else {
                    do {
                        lease = try await UpstreamConnectContext.$current.withValue(connectContext) {
                            try await self.leaseTrustCurrent(route)
                        }
                    } catch {
                        let brokerError = self.mapLeaseError(error, origin: origin)
                        leaseError = brokerError
                        action = machine.leaseFailed(untrustedServer: brokerError.serverTrustFailure != nil).next
                        continue
                    }
                    do {
                        exchange = try await lease.connection.startExchange(head: attemptHead, requestEnds: sendsWhole)
                    } catch {
                        closingTLSError = lease.connection.closingTLSError
                        let step = machine.sendFailed(closedByTLSAlert: closingTLSError != nil, connectionReused: lease.reused)
                        self.pool.release(lease, step.release ?? .close)
                        action = step.next
                        continue
                    }
                }
                let result = await self.runExchange(
                    attempt, lease: lease, exchange: exchange, sendsWhole: sendsWhole, expectsContinue: expectsContinue,
                    context: AuthContext(
                        head: head, origin: origin, uri: pathAndQuery, replay: replay, state: auth,
                        mayAnswer: attempt.mayAnswerChallenges && mayUseStoredCredentials, agentWait: agentWait, peer: peer, clientGone: clientGone,
                        proxy: forwardProxy.map { (origin: $0, uri: upstreamTarget, state: proxyAuth) }
                    ),
                    route: route, client: client, requests: &requests
                )
                lastResult = result.pump
                lastMalformedBody = result.malformedBody
                lastLeaseConnection = lease.connection
                let step = machine.attemptEnded(
                    RequestStateMachine.AttemptEnd(
                        exchange: result.pump.exchange, requestComplete: result.requestComplete,
                        malformedBody: result.malformedBody != nil, bodyWithheld: result.bodyWithheld,
                        continueSentToClient: result.continueSentToClient,
                        connectionUsable: lease.connection.isActive && lease.connection.isCurrent(self.generation()),
                        closedByTLSAlert: lease.connection.closingTLSError != nil, connectionReused: lease.reused, draining: draining()
                    )
                )
                if let release = step.release { self.pool.release(lease, release) }
                switch result.pump {
                case .challengeAnswered(_, let byProxy):
                    logger.debug("answered the \(byProxy ? "proxy's" : "origin's") challenge from the store; sending the request again")
                case .expectationRefused:
                    logger.debug("the origin refused Expect: 100-continue; sending the request again without it")
                case .cacheValidationNotSelected:
                    logger.debug("the origin's 304 is not about the stored response; sending the request again without conditions")
                    if case .send = step.next, mayUseStoredCredentials { await authorizeUpFront() }
                case .failedBeforeHead:
                    if case .send = step.next { logger.debug("pooled connection was closed by the origin; retrying once on a new one") }
                default:
                    break
                }
                action = step.next

            case .respondWithError(let cause, let clientKeepAlive, let requestEnded):
                let error: BrokerError
                switch cause {
                case .leaseFailed:
                    error = leaseError ?? .connectionClosedEarly(origin: origin)
                    // The origin cannot be reached: a stored response that may be served stale answers.
                    if requestEnded, let cache = client.cache,
                        let outcome = await self.serveFallback(cache, error: error, head: head, client: client)
                    {
                        return outcome
                    }
                case .tlsAlertOnSend:
                    error = closingTLSError.map { .tlsHandshakeFailed(origin: origin, underlying: $0, identity: route.clientIdentity) }
                        ?? .connectionClosedEarly(origin: origin)
                case .closedOnSend:
                    error = .connectionClosedEarly(origin: origin)
                case .malformedBody:
                    error = lastMalformedBody.map { .malformedRequest($0) } ?? .connectionClosedEarly(origin: origin)
                }
                return await self.respondWithError(
                    error, requestID: requestID, logger: logger, requests: &requests, writer: writer,
                    clientWantsKeepAlive: clientKeepAlive, requestEnded: requestEnded
                )

            case .sendExchangeError(let keepAlive):
                guard let connection = lastLeaseConnection, case .failedBeforeHead(let failure)? = lastResult else {
                    return RequestOutcome(status: 0, bytes: 0, brokerError: "internal_error", disposition: .close)
                }
                let brokerError = self.mapExchangeError(failure, route: route, connection: connection)
                // Only a GET or HEAD without a body has a fallback, and its end was read before it was sent.
                if let cache = client.cache, let outcome = await self.serveFallback(cache, error: brokerError, head: head, client: client) {
                    return outcome
                }
                let (errorHead, body) = brokerError.response(requestID: requestID, keepAlive: keepAlive)
                FlowCapture.current?.responded(errorHead, body: body)
                try? await writer.write(contentsOf: [.head(errorHead), .body(.byteBuffer(body)), .end(nil)])
                self.counters.brokerErrors.add(1)
                return RequestOutcome(
                    status: Int(brokerError.status.code), bytes: body.readableBytes, brokerError: brokerError.code.rawValue,
                    disposition: keepAlive ? .keepAlive : .close
                )

            case .finish(let keepAlive):
                return self.outcome(of: lastResult, keepAlive: keepAlive)

            case .finishDiscardingBody:
                await Self.lingerDiscardingBody(&requests, closeClient: closeClient)
                return self.outcome(of: lastResult, keepAlive: false)

            case .finishAborting:
                abortClient()
                var (status, bytes) = (0, 0)
                if case .abortedAfterHead(let abortedStatus, let abortedBytes)? = lastResult { (status, bytes) = (abortedStatus, abortedBytes) }
                return .aborted(status: status, bytes: bytes)

            case .finishClientGone:
                return .clientClosed
            }
        }
    }

    /// What one attempt's exchange came to, for the machine.
    struct AttemptResult {
        var pump: ResponsePumpResult
        /// The request body has been read whole (on this attempt or an earlier one).
        var requestComplete: Bool
        /// The client's body broke HTTP/1.1 framing on this attempt.
        var malformedBody: (any Error)?
        var bodyWithheld: Bool
        var continueSentToClient: Bool
    }

    /// Runs one sent attempt: the response pump, and beside it the request body (held for the
    /// origin's `100 Continue`, streamed, or resent from the replay buffer).
    private func runExchange(
        _ attempt: RequestStateMachine.Attempt, lease: PooledConnection<UpstreamConnection>, exchange: UpstreamExchange,
        sendsWhole: Bool, expectsContinue: Bool, context: AuthContext, route: UpstreamRoute, client: ClientSide,
        requests: inout ClientRequestIterator
    ) async -> AttemptResult {
        let writer = client.writer
        let state = ExchangeState()
        var malformedBody: (any Error)?
        let gate = ContinueGate(
            ContinueGateStateMachine(
                holdsBody: attempt.uploadPlan.holdsBody && !attempt.requestEnded, clientExpectsContinue: expectsContinue,
                continueSentToClient: attempt.continueSentToClient
            )
        )
        let brokerAddedExpect = attempt.uploadPlan.addsExpect
        let clientWantsKeepAlive = context.head.isKeepAlive && context.head.version == .http1_1
        let pump: @Sendable () async -> ResponsePumpResult = {
            await self.pumpResponse(
                exchange.responseParts, route: route, connection: lease.connection, requestID: client.requestID,
                logger: client.logger, writer: writer, gate: gate, brokerAddedExpect: brokerAddedExpect,
                clientWantsKeepAlive: clientWantsKeepAlive, state: state, auth: context, closeClient: client.close,
                draining: client.draining, rewrite: client.rewrite, cache: client.cache, client: client,
                retries: { attempt.retriesClosedConnection(reused: lease.reused, closedByTLSAlert: $0) }
            )
        }
        let result: ResponsePumpResult
        if sendsWhole {
            // Nothing is left to send alongside the response: this task relays it itself,
            // with no child task per request.
            state.markRequestComplete()
            result = await pump()
        } else {
            let replay = context.replay
            result = await withTaskGroup(of: ResponsePumpResult.self) { group in
                group.addTask { await pump() }
                if attempt.requestEnded {
                    // A later attempt: the request ended on an earlier one; send its kept body again.
                    for chunk in replay.chunks() {
                        try? await exchange.writeBody(chunk)
                    }
                    try? await exchange.finishRequest()
                    state.markRequestComplete()
                } else {
                    switch await gate.bodyDecision(timeout: ExpectContinue.timeout) {
                    case .withhold:
                        // A final status came before the origin wanted the body: it stays unread.
                        break
                    case .send(let writeContinueToClient):
                        if writeContinueToClient {
                            try? await writer.write(.head(HTTPResponseHead(version: .http1_1, status: .continue)))
                            gate.continueWritten()
                        }
                        let body = await self.pumpRequestBody(requests: &requests, exchange: exchange, state: state, replay: replay)
                        if case .malformed(let error) = body {
                            malformedBody = error
                            state.markRequestBodyBroken()
                        }
                        // The client left (or broke its framing) mid-body: the origin would wait
                        // for the rest until a timeout, holding the connection. Closing it ends the
                        // response pump too.
                        if body != .ended { lease.connection.close() }
                    }
                }
                return await group.next() ?? .failedBeforeHead(nil)
            }
        }
        return AttemptResult(
            pump: result, requestComplete: state.requestComplete, malformedBody: malformedBody, bodyWithheld: gate.bodyWithheld,
            continueSentToClient: gate.continueSentToClient
        )
    }

    /// The outcome of a request whose response reached the client.
    private func outcome(of result: ResponsePumpResult?, keepAlive: Bool) -> RequestOutcome {
        switch result {
        case .completed(let completed)?:
            return RequestOutcome(status: completed.status, bytes: completed.bytes, brokerError: nil, disposition: keepAlive ? .keepAlive : .close)
        case .errorSent(let brokerError, let bytes, _)?:
            self.counters.brokerErrors.add(1)
            return RequestOutcome(
                status: Int(brokerError.status.code), bytes: bytes, brokerError: brokerError.code.rawValue, disposition: keepAlive ? .keepAlive : .close
            )
        default:
            return RequestOutcome(status: 0, bytes: 0, brokerError: nil, disposition: keepAlive ? .keepAlive : .close)
        }
    }

    /// Leases a connection, closing pooled ones verified under anchors or pins that have changed
    /// since (a removed anchor must not keep a connection trusted).
    private func leaseTrustCurrent(_ route: UpstreamRoute) async throws -> PooledConnection<UpstreamConnection> {
        while true {
            let lease = try await self.pool.lease(route)
            if lease.connection.isCurrent(self.generation()) { return lease }
            self.pool.release(lease, reusable: false)
        }
    }

    /// The route for a request: its origin, and the client identity it presents there (the one
    /// it names in `Authbroker-Identity`, or the user's rules for the host); `keyLog`: the
    /// request asked for its TLS keys to be logged (`Authbroker-Debug: keylog`), which takes
    /// connections of its own only while the key log is on for marked requests.
    func route(to origin: CanonicalOrigin, identity requested: String?, keyLog: Bool = false) throws(BrokerError) -> UpstreamRoute {
        let keyLogged =
            keyLog && origin.scheme == .https && self.settings.debug.tlsKeyLogPath != nil
            && self.settings.debug.tlsKeyLogScope == .marked
        guard let requested, origin.scheme == .https else {
            let route = self.automaticRoute(to: origin).route
            guard keyLogged else { return route }
            return UpstreamRoute(origin, clientIdentity: route.clientIdentity, proxy: route.proxy, keyLogged: true)
        }
        do {
            let identity = try self.store.clientIdentity(for: origin.host, requested: requested)
            return UpstreamRoute(
                origin, clientIdentity: identity?.name, proxy: self.rules.proxy(for: origin), keyLogged: keyLogged
            )
        } catch {
            throw BrokerError.badRequest(code: BrokerErrorCode(error.kind), detail: error.message)
        }
    }

    /// The route to `origin` for a request that names no client identity, with how long it
    /// holds: a plain HTTP route for good (it depends on the settings alone), an HTTPS one while
    /// its automatic client identity does. (The direct relay keeps it per client connection.)
    func automaticRoute(to origin: CanonicalOrigin) -> AutomaticRoute {
        let proxy = self.rules.proxy(for: origin)
        guard origin.scheme == .https else { return AutomaticRoute(route: UpstreamRoute(origin, proxy: proxy), identityChoice: nil) }
        let choice = self.store.automaticClientIdentity(for: origin.host)
        return AutomaticRoute(route: UpstreamRoute(origin, clientIdentity: choice.identity?.name, proxy: proxy), identityChoice: choice)
    }

    /// The head the client gets for an origin's (or the upstream proxy's) final head, on either
    /// path: the header rules of `ProxyHeaders.clientResponseHeaders`, only standard challenges,
    /// the rewrite rule's edits, and `Connection: close` when the client connection ends after it.
    /// - Parameter proxyChallenges: the head is the upstream proxy's own 407, whose challenges
    ///   are the client's to answer (the broker is its proxy), with `Proxy-Authorization`.
    static func clientResponseHead(
        _ head: HTTPResponseHead, requestID: String, proxyChallenges: Bool = false, rewrite: RewriteRule? = nil, close: Bool,
        logger: Logger
    ) -> HTTPResponseHead {
        var headers = ProxyHeaders.clientResponseHeaders(head.headers, requestID: requestID)
        if proxyChallenges {
            for value in head.headers["Proxy-Authenticate"] { headers.add(name: "Proxy-Authenticate", value: value) }
        }
        Self.keepOnlyStandardChallenges(status: head.status, in: &headers, requestID: requestID, logger: logger)
        rewrite?.editResponse(&headers)
        if close { headers.replaceOrAdd(name: "Connection", value: "close") }
        return HTTPResponseHead(version: .http1_1, status: head.status, headers: headers)
    }

    /// An origin's interim (1xx) head as the client gets it: under the rules of every forwarded
    /// head (`ProxyHeaders.clientResponseHeaders`: no hop-by-hop field or field `Connection`
    /// names, no `Authbroker-*` the origin set, no `Proxy-Status` member naming this broker).
    static func interimResponseHead(_ head: HTTPResponseHead) -> HTTPResponseHead {
        HTTPResponseHead(version: .http1_1, status: head.status, headers: ProxyHeaders.clientResponseHeaders(head.headers, requestID: nil))
    }

    /// DESIGN.md: a client sees only Basic and Digest challenges; Negotiate, NTLM, Bearer and the
    /// rest are removed from every response's `WWW-Authenticate` (a 200 may carry a server's final
    /// Negotiate token, RFC 4559 §5; an origin's 407 may carry any) and from a 407's
    /// `Proxy-Authenticate`; logged, at debug level where the field is not the status's challenge.
    /// - Parameter requestID: named in the log line (the direct relay's logger does not carry it).
    static func keepOnlyStandardChallenges(status: HTTPResponseStatus, in headers: inout HTTPHeaders, requestID: String?, logger: Logger) {
        Self.keepOnlyStandardChallenges(
            field: "WWW-Authenticate", challenging: status == .unauthorized, in: &headers, requestID: requestID, logger: logger
        )
        if status == .proxyAuthenticationRequired {
            Self.keepOnlyStandardChallenges(field: "Proxy-Authenticate", challenging: true, in: &headers, requestID: requestID, logger: logger)
        }
    }

    private static func keepOnlyStandardChallenges(
        field: String, challenging: Bool, in headers: inout HTTPHeaders, requestID: String?, logger: Logger
    ) {
        let values = headers[field]
        guard !values.isEmpty else { return }
        let filtered = ChallengeSelection.forClient(fieldValues: values)
        guard !filtered.stripped.isEmpty else { return }
        headers.remove(name: field)
        for value in filtered.values { headers.add(name: field, value: value) }
        var metadata: Logger.Metadata = ["field": "\(field)", "schemes": "\(filtered.stripped.joined(separator: ","))"]
        if let requestID { metadata["request_id"] = "\(requestID)" }
        logger.log(level: challenging ? .info : .debug, "removed challenges the client cannot answer", metadata: metadata)
    }

    // MARK: - Request side

    static func upstreamHead(for head: HTTPRequestHead, hostHeader: String, pathAndQuery: String) -> HTTPRequestHead {
        var headers = ProxyHeaders.upstreamRequestHeaders(head.headers, hostHeader: hostHeader)
        if let codings = (try? TransferCodings(head.headers)) ?? nil, codings.isChunked {
            // The body's framing is ours to redo (Transfer-Encoding is hop-by-hop), but codings
            // applied before `chunked` stay (RFC 9112 §6.1); `RequestFramer` writes it.
            headers.remove(name: "content-length")
            headers.replaceOrAdd(name: "Transfer-Encoding", value: codings.names.joined(separator: ", "))
        } else if Self.expectsBody(head.method), !headers.contains(name: "content-length") {
            headers.add(name: "Content-Length", value: "0")
        }
        return HTTPRequestHead(version: .http1_1, method: head.method, uri: pathAndQuery, headers: headers)
    }

    /// Methods whose request has a body by definition: without any framing it is an empty one.
    /// (A switch: `HTTPMethod`'s `==` compares the methods' names as strings.)
    private static func expectsBody(_ method: HTTPMethod) -> Bool {
        switch method {
        case .POST, .PUT, .PATCH: true
        default: false
        }
    }

    /// Sends the client's body upstream as it arrives; after an upstream failure keeps reading
    /// (and dropping) so the client connection stays in step. Returns how the body ended: whole,
    /// cut off by the client, or broken (its chunked framing is not HTTP/1.1).
    private func pumpRequestBody(
        requests: inout ClientRequestIterator, exchange: UpstreamExchange, state: ExchangeState, replay: ReplayBuffer
    ) async -> RequestBodyDrain {
        var upstreamOK = true
        let capture = FlowCapture.current
        do {
            while let part = try await requests.next() {
                switch part {
                case .body(let buffer):
                    replay.append(buffer)
                    capture?.requestBody(buffer)
                    guard upstreamOK else { continue }
                    do {
                        try await exchange.writeBody(buffer)
                        self.counters.bytesToUpstream.add(buffer.readableBytes)
                    } catch {
                        upstreamOK = false
                    }
                case .end:
                    if upstreamOK {
                        try? await exchange.finishRequest()
                    }
                    state.markRequestComplete()
                    return .ended
                case .head:
                    // The decoder never yields a second head before .end; treat as broken framing.
                    return .closed
                }
            }
        } catch {
            return .malformed(error)
        }
        return .closed
    }

    // MARK: - Response side

    /// How long a finished response waits for the rest of its request body before the client
    /// connection is ended instead of kept alive.
    static let requestLinger: Duration = .seconds(2)

    enum ResponsePumpResult: Sendable {
        struct Completed: Sendable {
            var status: Int
            var bytes: Int
            var upstreamKeepAlive: Bool
            var clientKeepAlive: Bool
            var requestComplete: Bool
        }
        case completed(Completed)
        /// Only when a retry on a fresh connection is allowed: nothing was sent to the client.
        case failedBeforeHead(UpstreamExchangeError?)
        /// The broker's own error response went to the client instead of a response head.
        case errorSent(BrokerError, bytes: Int, keepAlive: Bool)
        case abortedAfterHead(status: Int, bytes: Int)
        /// A 401 was answered from the store and its body read away; nothing reached the client.
        case challengeAnswered(upstreamKeepAlive: Bool, byProxy: Bool)
        /// The origin answered 417 to the broker's own `Expect` before the body; nothing reached
        /// the client.
        case expectationRefused
        /// A 304 to the cache's own validation did not select the stored response; it was read
        /// away, and nothing reached the client.
        case cacheValidationNotSelected(upstreamKeepAlive: Bool)

        /// The exchange's end as the request state machine reads it.
        var exchange: RequestStateMachine.Exchange {
            switch self {
            case .completed(let completed):
                .completed(upstreamKeepAlive: completed.upstreamKeepAlive, clientKeepAlive: completed.clientKeepAlive)
            case .failedBeforeHead(let error):
                if case .connectionClosed? = error { .failedBeforeHead(connectionClosed: true) } else { .failedBeforeHead(connectionClosed: false) }
            case .errorSent(_, _, let keepAlive): .errorSent(keepAlive: keepAlive)
            case .abortedAfterHead: .abortedAfterHead
            case .challengeAnswered(let upstreamKeepAlive, _): .challengeAnswered(upstreamKeepAlive: upstreamKeepAlive)
            case .expectationRefused: .expectationRefused
            case .cacheValidationNotSelected(let upstreamKeepAlive): .cacheValidationNotSelected(upstreamKeepAlive: upstreamKeepAlive)
            }
        }
    }

    /// What the response pump needs to answer a 401 itself.
    struct AuthContext: Sendable {
        var head: HTTPRequestHead
        var origin: CanonicalOrigin
        var uri: String
        var replay: ReplayBuffer
        var state: NIOLockedValueBox<RequestAuthState>
        /// False on the last allowed attempt: its 401 goes to the client whatever the store holds.
        var mayAnswer: Bool
        /// How long the request may wait for an agent (`Authbroker-Interactive`); nil: not at all.
        var agentWait: Duration?
        var peer: ConnectionPeer?
        /// Returns when the client's connection has closed.
        var clientGone: @Sendable () async -> Void
        /// For an http request through the upstream proxy: the proxy, the absolute-form target it
        /// was sent (which proxy Digest hashes), and the request's state with the proxy.
        var proxy: (origin: CanonicalOrigin, uri: String, state: NIOLockedValueBox<RequestAuthState>)?
    }

    /// How long a 401 waits for the rest of the request body before deciding without it.
    static let replayWait: Duration = .seconds(5)

    private func pumpResponse(
        _ parts: UpstreamExchangeHandler.ResponseParts, route: UpstreamRoute, connection: UpstreamConnection,
        requestID: String, logger: Logger,
        writer: ClientResponseWriter, gate: ContinueGate, brokerAddedExpect: Bool, clientWantsKeepAlive: Bool,
        state: ExchangeState, auth: AuthContext, closeClient: @Sendable () -> Void, draining: @Sendable () -> Bool,
        rewrite: RewriteRule?, cache: CacheExchange?, client: ClientSide, retries: @Sendable (_ closedByTLSAlert: Bool) -> Bool
    ) async -> ResponsePumpResult {
        var status = 0
        var bytes = 0
        var headSent = false
        var upstreamKeepAlive = false
        var clientKeepAlive = clientWantsKeepAlive
        var bodyWithheld = false
        var iterator = ResponsePartReader(parts)
        // What one read from the origin brought goes to the client with one flush.
        var output = BatchedResponseWriter(writer, capture: FlowCapture.current)
        // However the pump ends, a body still held must not be sent into a finished exchange.
        defer { gate.exchangeFailed() }
        do {
            while true {
                if iterator.batchConsumed { try await output.flush() }
                guard let part = try await iterator.next() else { break }
                switch part {
                case .head(let head) where head.status.code < 200:
                    // A 100 only to a client that asked for it, once, and only when the broker
                    // wants the body (RFC 9110 §10.1.1; the gate decides); 103 and others pass.
                    if head.status == .continue, !gate.originSentContinue() { continue }
                    if head.status == .switchingProtocols { continue }
                    // RFC 9110 §15.2: never a 1xx to an HTTP/1.0 client (it would take it as final).
                    if (auth.head.version.major, auth.head.version.minor) < (1, 1) { continue }
                    output.write(.head(Self.interimResponseHead(head)))
                case .head(let head):
                    // An interim response read with this head goes first (the wait below may be long).
                    try await output.flush()
                    // The order of the checks is the machine's; this runs them.
                    var decision = FinalHeadMachine(
                        FinalHeadMachine.Head(
                            status: head.status, throughProxy: auth.proxy != nil, mayAnswerChallenges: auth.mayAnswer,
                            brokerAddedExpect: brokerAddedExpect, cacheTakesPart: cache != nil
                        )
                    )
                    var step = decision.start()
                    var fromProxy = false
                    var kerberosFailure: (KerberosFailure, challenger: CanonicalOrigin, byProxy: Bool)?
                    var stored: (opened: OpenedCacheEntry, headers: HTTPHeaders, age: Int, cacheStatus: String)?
                    decisions: while true {
                        switch step {
                        case .askContinueGate:
                            // Whether this attempt's body was held and never sent (a final status first).
                            bodyWithheld = await gate.finalHeadArrived(status: head.status)
                            // A 407 is the upstream proxy's only when the request went through
                            // one, and is in the proxy's own space (an origin behind it may
                            // answer 407 too).
                            fromProxy =
                                head.status == .proxyAuthenticationRequired
                                && auth.proxy.map { self.authenticator.isOwnChallenge(ofProxy: $0.origin, head) } == true
                            step = decision.gateAnswered(bodyWithheld: bodyWithheld, isProxyChallenge: fromProxy)
                        case .checkProxyAccepted:
                            // A head from beyond the proxy (a 401 the broker answers included):
                            // the proxy took what the broker sent it.
                            if let proxy = auth.proxy, let failure = await self.proxyPassed(head, proxy: proxy) {
                                kerberosFailure = (failure, proxy.origin, true)
                            }
                            step = decision.proxyChecked(refused: kerberosFailure != nil)
                        case .answerChallenge(let byProxy):
                            let retry = await self.answer(head, auth: auth, requestState: state, isProxy: byProxy, bodyWithheld: bodyWithheld)
                            step = decision.challengeAnswered(retry)
                        case .checkOriginAccepted(let byProxy):
                            // Kerberos could not be done (no token for an app that could answer
                            // nothing else), or a server did not prove who it is: its response is
                            // not passed on; the broker's error says why.
                            kerberosFailure = await self.acceptOrRefuseKerberos(head, auth: auth, fromProxy: byProxy)
                            step = decision.originChecked(refused: kerberosFailure != nil)
                        case .consultCache:
                            // A client certificate is a credential too: what one app fetched
                            // with its identity is no more the others' than a password's answer.
                            let carriedCredentials =
                                route.clientIdentity != nil || auth.head.headers.contains(name: "authorization")
                                || auth.state.withLockedValue { $0.authorization } != nil
                            switch await cache?.finalHead(head, requestCarriedCredentials: carriedCredentials) ?? .forward {
                            case .forward:
                                step = decision.cacheDecided(.forward)
                            case .repeatUnconditionally:
                                step = decision.cacheDecided(.repeatUnconditionally)
                            case .serveStored(let opened, let headers, let age, let cacheStatus):
                                stored = (opened, headers, age, cacheStatus)
                                step = decision.cacheDecided(.serveStored)
                            }
                        case .discard(let discarded):
                            // Nothing reached the client: the request machine sends it again.
                            let readToEnd = await Self.readAway(&iterator)
                            switch discarded {
                            case .expectationRefused:
                                return .expectationRefused
                            case .challengeAnswered(let byProxy):
                                return .challengeAnswered(upstreamKeepAlive: readToEnd && head.isKeepAlive, byProxy: byProxy)
                            case .cacheValidationNotSelected:
                                return .cacheValidationNotSelected(upstreamKeepAlive: readToEnd && head.isKeepAlive)
                            }
                        case .kerberosError:
                            _ = await Self.readAway(&iterator)
                            // The failure that led here is never missing; if it were, the head
                            // the check was to stop must not reach the client either.
                            let brokerError =
                                kerberosFailure.map { BrokerError.kerberos($0.0, challenger: $0.challenger, isProxy: $0.byProxy, origin: auth.origin) }
                                ?? BrokerError.internalError("a Kerberos refusal without its failure")
                            return await self.sendErrorInstead(
                                brokerError, requestID: requestID, writer: writer, clientWantsKeepAlive: clientWantsKeepAlive,
                                state: state, closeClient: closeClient, draining: draining
                            )
                        case .serveStored:
                            // The entry is never missing here; if it were, the origin's answer to
                            // the cache's own validation must not reach the client.
                            guard let stored else {
                                _ = await Self.readAway(&iterator)
                                return await self.sendErrorInstead(
                                    .internalError("the cache chose a stored response it did not open"), requestID: requestID,
                                    writer: writer, clientWantsKeepAlive: clientWantsKeepAlive, state: state, closeClient: closeClient,
                                    draining: draining
                                )
                            }
                            // A stored response answers instead (`CacheExchange.finalHead` says
                            // why). A small body of the origin's (a 304 has none) is read away
                            // first so its connection stays usable; a large or unknown one (an
                            // error page that does not end) is not waited for: the connection closes.
                            let readToEnd = Self.isSmallBody(head) ? await Self.readAway(&iterator) : false
                            let served = await self.writeStored(
                                stored.opened, headers: stored.headers, age: stored.age, cacheStatus: stored.cacheStatus, proxyStatus: nil,
                                head: auth.head, client: client, drained: .ended
                            )
                            return .completed(
                                .init(
                                    status: served.status, bytes: served.bytes, upstreamKeepAlive: readToEnd && head.isKeepAlive,
                                    clientKeepAlive: served.disposition == ConnectionDisposition.keepAlive && clientKeepAlive,
                                    requestComplete: state.requestComplete
                                )
                            )
                        case .forward(let closeAfter):
                            // A withheld body stays unread, so the client connection ends after this.
                            if closeAfter { clientKeepAlive = false }
                            break decisions
                        }
                    }
                    status = Int(head.status.code)
                    upstreamKeepAlive = head.isKeepAlive
                    // Whether the request body will end is not known yet (the request pump may
                    // simply not have reached its end): that is decided when the response ends.
                    if draining() { clientKeepAlive = false }
                    output.write(
                        .head(
                            Self.clientResponseHead(
                                head, requestID: requestID, proxyChallenges: fromProxy, rewrite: rewrite, close: !clientKeepAlive, logger: logger
                            )
                        )
                    )
                    headSent = true
                case .body(let buffer):
                    bytes += buffer.readableBytes
                    self.counters.bytesFromUpstream.add(buffer.readableBytes)
                    output.write(.body(.byteBuffer(buffer)))
                    await cache?.body(buffer)
                case .end:
                    // Stored before the client sees the end: its next request finds the entry.
                    await cache?.ended()
                    output.write(.end(nil))
                    try await output.flush()
                    // A response that ends before its request body did: give the rest of the
                    // body a moment (the request pump is usually just behind), then end the
                    // client connection, because that rest may never come. (A withheld body is
                    // not pumped at all; the connection task discards it and closes.)
                    if bodyWithheld {
                        clientKeepAlive = false
                    } else if await !state.waitForRequestComplete(upTo: Self.requestLinger) {
                        clientKeepAlive = false
                        closeClient()
                    }
                    return .completed(
                        .init(
                            status: status, bytes: bytes, upstreamKeepAlive: upstreamKeepAlive,
                            clientKeepAlive: clientKeepAlive, requestComplete: state.requestComplete
                        )
                    )
                }
            }
            // The sequence ended without .end: the origin closed mid-response.
            try await output.flush()
            gate.exchangeFailed()
            if headSent { return .abortedAfterHead(status: status, bytes: bytes) }
            return await self.failBeforeHead(
                .connectionClosed, route: route, connection: connection, requestID: requestID, writer: writer,
                clientWantsKeepAlive: clientWantsKeepAlive, state: state, closeClient: closeClient,
                draining: draining, retries: retries, cache: cache, client: client, requestHead: auth.head
            )
        } catch let error as UpstreamExchangeError {
            gate.exchangeFailed()
            // What came before the failure still reaches the client (then the cut).
            if (try? await output.flush()) == nil { return .abortedAfterHead(status: status, bytes: bytes) }
            if headSent { return .abortedAfterHead(status: status, bytes: bytes) }
            return await self.failBeforeHead(
                error, route: route, connection: connection, requestID: requestID, writer: writer,
                clientWantsKeepAlive: clientWantsKeepAlive, state: state, closeClient: closeClient,
                draining: draining, retries: retries, cache: cache, client: client, requestHead: auth.head
            )
        } catch {
            // Writing to the client failed: it went away. Dropping the sequence closes upstream.
            return .abortedAfterHead(status: status, bytes: bytes)
        }
    }

    /// Asks the authenticator about a 401 (or the upstream proxy's 407), once the request body it
    /// would resend is known.
    private func answer(
        _ head: HTTPResponseHead, auth: AuthContext, requestState: ExchangeState, isProxy: Bool, bodyWithheld: Bool
    ) async -> Bool {
        var resendable: DigestEntityBody?
        if bodyWithheld {
            // Never sent, still unread at the client: it goes with the next attempt.
            resendable = .unavailable
        } else if auth.replay.mayComplete {
            _ = await requestState.waitForRequestComplete(upTo: Self.replayWait)
            resendable = requestState.requestComplete ? auth.replay.bytes.map { .bytes($0) } : nil
        }
        let body = resendable
        let authenticator = self.authenticator
        let (challenger, uri, stateBox) =
            if isProxy, let proxy = auth.proxy { (proxy.origin, proxy.uri, proxy.state) } else { (auth.origin, auth.uri, auth.state) }
        let decided = await untilClientGone(auth.clientGone) { () -> (retry: Bool, state: RequestAuthState) in
            var state = stateBox.withLockedValue { $0 }
            let retry = await authenticator.answerChallenge(
                head, origin: challenger, method: auth.head.method, uri: uri, resendableBody: body, isProxy: isProxy,
                agentWait: auth.agentWait, requester: auth.peer?.requester, state: &state
            )
            // Kept even when the client has left meanwhile: a password trial it holds is released
            // when the request ends (`requestEnded`).
            stateBox.withLockedValue { $0 = state }
            return (retry, state)
        }
        guard let decided else { return false }
        return decided.retry
    }

    /// A head that came from beyond the upstream proxy: the proxy took what the broker sent it
    /// (`responseAccepted`, `negotiateAccepted`). Its Negotiate token is not sent again on a
    /// later attempt of this request: the proxy's connection is authenticated now, a replay
    /// cache would refuse the same token, and a new connection gets a 407 and a fresh one.
    /// Returns the failure when the proxy's final token does not prove who it is.
    private func proxyPassed(
        _ head: HTTPResponseHead, proxy: (origin: CanonicalOrigin, uri: String, state: NIOLockedValueBox<RequestAuthState>)
    ) async -> KerberosFailure? {
        let proxyState = proxy.state.withLockedValue { $0 }
        if let failure = await self.authenticator.negotiateAccepted(head, challenger: proxy.origin, isProxy: true, uri: proxy.uri, state: proxyState) {
            return failure
        }
        self.authenticator.responseAccepted(head, origin: proxy.origin, uri: proxy.uri, fromBeyondProxy: true, state: proxyState)
        proxy.state.withLockedValue { state in
            guard state.negotiate != nil else { return }
            state.negotiate = nil
            state.authorization = nil
        }
        return nil
    }

    /// A final head the client may see, before it does: the origin takes it as the answer to
    /// what the broker sent it (`responseAccepted`, `negotiateAccepted`). Returns the Kerberos
    /// failure that must replace it, and whose it is: a 401/407 to Negotiate the app cannot
    /// answer otherwise, or a final token that does not prove the server's identity.
    private func acceptOrRefuseKerberos(
        _ head: HTTPResponseHead, auth: AuthContext, fromProxy: Bool
    ) async -> (KerberosFailure, challenger: CanonicalOrigin, byProxy: Bool)? {
        if head.status == .unauthorized || fromProxy, let failure = self.kerberosFailureForClient(head, auth: auth, isProxy: fromProxy) {
            return (failure, fromProxy ? auth.proxy?.origin ?? auth.origin : auth.origin, fromProxy)
        }
        if head.status != .unauthorized, !fromProxy {
            let authState = auth.state.withLockedValue { $0 }
            if let failure = await self.authenticator.negotiateAccepted(head, challenger: auth.origin, isProxy: false, uri: auth.uri, state: authState) {
                return (failure, auth.origin, false)
            }
            self.authenticator.responseAccepted(head, origin: auth.origin, uri: auth.uri, state: authState)
        }
        return nil
    }

    /// Why the client gets the broker's Kerberos error instead of this 401 (or the proxy's 407):
    /// the challenger asked for Negotiate, `[kerberos]` allows it, no token could be made, and
    /// the response has no Basic or Digest challenge the app could answer instead.
    private func kerberosFailureForClient(_ head: HTTPResponseHead, auth: AuthContext, isProxy: Bool) -> KerberosFailure? {
        let stateBox = isProxy ? auth.proxy?.state : auth.state
        guard let failure = stateBox?.withLockedValue({ $0.negotiateFailure }) else { return nil }
        let field = isProxy ? "Proxy-Authenticate" : "WWW-Authenticate"
        return ChallengeSelection.clientVisible(AuthChallenge.parse(fieldValues: head.headers[field])).isEmpty ? failure : nil
    }

    /// Answers with the broker's error (a Kerberos failure, or an internal one where a check's
    /// result went missing) in place of the upstream response, whose body was read away; the
    /// request body, which may still be arriving, gets a moment to end first.
    private func sendErrorInstead(
        _ brokerError: BrokerError, requestID: String, writer: ClientResponseWriter, clientWantsKeepAlive: Bool, state: ExchangeState,
        closeClient: @Sendable () -> Void, draining: @Sendable () -> Bool
    ) async -> ResponsePumpResult {
        let requestDone = await state.waitForRequestComplete(upTo: Self.requestLinger)
        return await self.sendError(
            brokerError, requestDone: requestDone, requestID: requestID, writer: writer, clientWantsKeepAlive: clientWantsKeepAlive,
            closeClient: closeClient, draining: draining
        )
    }

    /// Writes the broker's error as this attempt's response (none of the origin's reached the
    /// client), then ends the client connection if the request body did not end (its rest may
    /// never come). Counted by `outcome(of:)`.
    private func sendError(
        _ brokerError: BrokerError, requestDone: Bool, requestID: String, writer: ClientResponseWriter, clientWantsKeepAlive: Bool,
        closeClient: @Sendable () -> Void, draining: @Sendable () -> Bool
    ) async -> ResponsePumpResult {
        let keepAlive = requestDone && clientWantsKeepAlive && !draining()
        let (head, body) = brokerError.response(requestID: requestID, keepAlive: keepAlive)
        FlowCapture.current?.responded(head, body: body)
        try? await writer.write(contentsOf: [.head(head), .body(.byteBuffer(body)), .end(nil)])
        if !requestDone { closeClient() }
        return .errorSent(brokerError, bytes: body.readableBytes, keepAlive: keepAlive)
    }

    /// Whether a response's body is known to be small enough to read away rather than close its
    /// connection: none (a 304, a 204), or a `Content-Length` of at most 64 KiB.
    private static func isSmallBody(_ head: HTTPResponseHead) -> Bool {
        guard head.status.mayHaveResponseBody else { return true }
        guard let length = head.headers.first(name: "content-length").flatMap({ Int($0) }) else { return false }
        return length <= 64 * 1024
    }

    /// Reads the rest of a response the client will not see (an answered 401 or 407, a 417)
    /// away, so its connection can carry the next attempt. Returns whether it ended cleanly.
    private static func readAway(_ iterator: inout ResponsePartReader) async -> Bool {
        do {
            while let part = try await iterator.next() {
                if case .end = part { return true }
            }
        } catch {}
        return false
    }

    /// After a response to a request whose body was withheld (never read): reads and drops what
    /// the client still sends, for up to `requestLinger`, so a client that writes its whole body
    /// before it reads gets to read the response; the connection then closes (its head said so).
    private static func lingerDiscardingBody(_ requests: inout ClientRequestIterator, closeClient: @escaping @Sendable () -> Void) async {
        let timer = Task {
            try await Task.sleep(for: Self.requestLinger)
            closeClient()
        }
        _ = await drainRequestBody(&requests)
        timer.cancel()
    }

    /// The origin failed before a response head: answer with the broker's error right here,
    /// while the request body may still be arriving, then end the client connection if that
    /// body did not finish (its rest may never come).
    private func failBeforeHead(
        _ error: UpstreamExchangeError, route: UpstreamRoute, connection: UpstreamConnection, requestID: String,
        writer: ClientResponseWriter, clientWantsKeepAlive: Bool, state: ExchangeState, closeClient: @Sendable () -> Void,
        draining: @Sendable () -> Bool, retries: @Sendable (_ closedByTLSAlert: Bool) -> Bool, cache: CacheExchange?, client: ClientSide,
        requestHead: HTTPRequestHead
    ) async -> ResponsePumpResult {
        // The machine's retry rule, asked here: a retry leaves the answer to the machine.
        if (self.isConnectionClosed(error) && retries(connection.closingTLSError != nil)) || state.requestBodyBroken {
            return .failedBeforeHead(error)
        }
        let brokerError = self.mapExchangeError(error, route: route, connection: connection)
        let requestDone = state.requestComplete
        // No answer in time (or none at all): a stored response that may be served stale answers.
        if requestDone, let cache, let outcome = await self.serveFallback(cache, error: brokerError, head: requestHead, client: client) {
            return .completed(
                .init(
                    status: outcome.status, bytes: outcome.bytes, upstreamKeepAlive: false,
                    clientKeepAlive: outcome.disposition == ConnectionDisposition.keepAlive, requestComplete: true
                )
            )
        }
        return await self.sendError(
            brokerError, requestDone: requestDone, requestID: requestID, writer: writer, clientWantsKeepAlive: clientWantsKeepAlive,
            closeClient: closeClient, draining: draining
        )
    }

    private func isConnectionClosed(_ error: UpstreamExchangeError) -> Bool {
        if case .connectionClosed = error { return true }
        return false
    }

    // MARK: - Errors

    private func mapLeaseError(_ error: any Error, origin: CanonicalOrigin) -> BrokerError {
        if let brokerError = error as? BrokerError { return brokerError }
        if let poolError = error as? UpstreamPoolError {
            switch poolError.failure {
            case .tooManyPending(let limit): return .tooManyPending(origin: origin, limit: limit)
            case .shuttingDown: return .shuttingDown()
            case .connectFailed(let underlying):
                return BrokerError.fromConnectError(underlying, origin: origin, settings: self.settings)
            }
        }
        return BrokerError.fromConnectError(error, origin: origin, settings: self.settings)
    }

    func mapExchangeError(_ error: UpstreamExchangeError?, route: UpstreamRoute, connection: UpstreamConnection) -> BrokerError {
        let origin = route.origin
        // A TLS alert that closed the connection says more than "closed" (TLS 1.3 reports a
        // refused client certificate this way).
        if let tlsError = connection.closingTLSError {
            return .tlsHandshakeFailed(origin: origin, underlying: tlsError, identity: route.clientIdentity)
        }
        switch error {
        case .connectionClosed?, nil, .busy?:
            return .connectionClosedEarly(origin: origin)
        case .responseHeadTimeout?:
            return .responseHeadTimeout(origin: origin, milliseconds: self.settings.upstream.responseHeadTimeoutMilliseconds)
        case .idleTimeout?:
            return .idleTimeout(origin: origin, milliseconds: self.settings.upstream.idleTimeoutMilliseconds)
        case .responseHeadTooLarge?:
            return .responseHeadTooLarge(origin: origin, limit: self.settings.limits.maxResponseHeadBytes)
        case .responseIncomplete?:
            return .responseIncomplete(origin: origin)
        case .protocolError(let underlying)?:
            if underlying is NIOSSLError || underlying is BoringSSLError || ClientCertificateAlert(underlying) != nil {
                return .tlsHandshakeFailed(origin: origin, underlying: underlying, identity: route.clientIdentity)
            }
            return .upstreamProtocolError(origin: origin, underlying: underlying)
        }
    }

    /// Answers with a broker error, then reads the rest of the request body so the connection
    /// stays usable (or closes it when the client did not want to keep it).
    package func respondWithError(
        _ error: BrokerError, requestID: String, logger: Logger, requests: inout ClientRequestIterator,
        writer: ClientResponseWriter, clientWantsKeepAlive: Bool, requestEnded: Bool = false
    ) async -> RequestOutcome {
        self.counters.brokerErrors.add(1)
        let drained: RequestBodyDrain = requestEnded ? .ended : await drainRequestBody(&requests)
        // A body that breaks HTTP framing is the client's error, and it outranks ours.
        var error = error
        if case .malformed(let parseError) = drained { error = .malformedRequest(parseError) }
        let keepAlive = clientWantsKeepAlive && drained == .ended
        let (head, body) = error.response(requestID: requestID, keepAlive: keepAlive)
        FlowCapture.current?.responded(head, body: body)
        try? await writer.write(contentsOf: [.head(head), .body(.byteBuffer(body)), .end(nil)])
        return RequestOutcome(
            status: Int(error.status.code), bytes: body.readableBytes, brokerError: error.code.rawValue,
            disposition: keepAlive ? .keepAlive : .close
        )
    }
}

/// How the rest of a request body ended when it was read only to be dropped.
package enum RequestBodyDrain: Equatable {
    case ended
    case closed
    case malformed(any Error)

    package static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case (.ended, .ended), (.closed, .closed), (.malformed, .malformed): true
        default: false
        }
    }
}

/// Reads and drops the rest of a request body.
package func drainRequestBody(_ requests: inout ClientRequestIterator) async -> RequestBodyDrain {
    do {
        while let part = try await requests.next() {
            if case .end = part { return .ended }
            if case .head = part { return .closed }
        }
    } catch {
        return .malformed(error)
    }
    return .closed
}

/// Shared between the two pumps of one exchange: whether the request body has ended, and
/// who waits for it to.
final class ExchangeState: Sendable {
    private struct State {
        var requestComplete = false
        var requestBodyBroken = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }
    private let box = NIOLockedValueBox(State())

    var requestComplete: Bool { self.box.withLockedValue { $0.requestComplete } }

    /// The client's body broke HTTP/1.1 framing: the exchange's failure is the client's, and the
    /// request side answers it (400), not the response pump.
    var requestBodyBroken: Bool { self.box.withLockedValue { $0.requestBodyBroken } }

    func markRequestBodyBroken() {
        self.box.withLockedValue { $0.requestBodyBroken = true }
    }

    func markRequestComplete() {
        self.resumeWaiters(markingComplete: true)
    }

    /// Waits until the request body has ended or `bound` has passed; returns whether it ended.
    func waitForRequestComplete(upTo bound: Duration) async -> Bool {
        if self.requestComplete { return true }
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                await withCheckedContinuation { continuation in
                    let resumeNow = self.box.withLockedValue { state in
                        if state.requestComplete { return true }
                        state.waiters.append(continuation)
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            }
            group.addTask { try? await Task.sleep(for: bound) }
            await group.next()
            group.cancelAll()
            // The sleeper ends on cancellation; a parked waiter is resumed here so the group can end.
            self.resumeWaiters(markingComplete: false)
        }
        return self.requestComplete
    }

    private func resumeWaiters(markingComplete: Bool) {
        let waiters = self.box.withLockedValue { state in
            if markingComplete { state.requestComplete = true }
            defer { state.waiters = [] }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}


/// A request body kept, up to a bound, so the request can be sent again after a 401.
final class ReplayBuffer: Sendable {
    private struct State {
        var chunks: [ByteBuffer] = []
        var size = 0
        var overflowed: Bool
    }
    private let limit: Int
    private let box: NIOLockedValueBox<State>

    /// A body declared larger than `limit` is never kept.
    init(limit: Int, head: HTTPRequestHead) {
        self.limit = limit
        let declared = head.headers.first(name: "content-length").flatMap { Int($0) } ?? 0
        self.box = NIOLockedValueBox(State(overflowed: declared > limit))
    }

    func append(_ buffer: ByteBuffer) {
        self.box.withLockedValue { state in
            guard !state.overflowed else { return }
            state.size += buffer.readableBytes
            if state.size > self.limit {
                state.overflowed = true
                state.chunks = []
            } else {
                state.chunks.append(buffer)
            }
        }
    }

    /// Whether the whole body can still be kept.
    var mayComplete: Bool { self.box.withLockedValue { !$0.overflowed } }

    /// The kept body, or nil when it was too large.
    var bytes: [UInt8]? {
        self.box.withLockedValue { state in
            guard !state.overflowed else { return nil }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(state.size)
            for chunk in state.chunks { bytes += chunk.readableBytesView }
            return bytes
        }
    }

    func chunks() -> [ByteBuffer] { self.box.withLockedValue { $0.chunks } }

    /// Whether no body byte was kept (none came, or it was too large to keep).
    var isEmpty: Bool { self.box.withLockedValue { $0.size == 0 && !$0.overflowed } }
}

/// The parts of a response one at a time, from the batches the upstream handler yields (one per
/// read), telling when a batch is used up: the moment to flush what was written for it.
struct ResponsePartReader {
    private var batches: UpstreamExchangeHandler.ResponseParts.AsyncIterator
    private var batch: [HTTPClientResponsePart] = []
    private var index = 0

    init(_ parts: UpstreamExchangeHandler.ResponseParts) {
        self.batches = parts.makeAsyncIterator()
    }

    /// Whether every part read so far has been returned (the next call waits for the origin).
    var batchConsumed: Bool { self.index == self.batch.count }

    mutating func next() async throws -> HTTPClientResponsePart? {
        while self.index == self.batch.count {
            guard let batch = try await self.batches.next() else { return nil }
            self.batch = batch
            self.index = 0
        }
        defer { self.index += 1 }
        return self.batch[self.index]
    }
}

/// Response parts for the client, held until `flush` hands them to the channel in one write.
struct BatchedResponseWriter {
    private let writer: ClientResponseWriter
    private var pending: [HTTPServerResponsePart] = []
    /// The flow log's view of the request, told of the head and the body as they go.
    private let capture: FlowCapture?

    init(_ writer: ClientResponseWriter, capture: FlowCapture?) {
        self.writer = writer
        self.capture = capture
    }

    mutating func write(_ part: HTTPServerResponsePart) {
        if let capture = self.capture {
            switch part {
            case .head(let head): capture.responded(head)
            case .body(.byteBuffer(let buffer)): capture.responseBody(buffer)
            default: break
            }
        }
        self.pending.append(part)
    }

    mutating func flush() async throws {
        guard !self.pending.isEmpty else { return }
        let parts = self.pending
        self.pending.removeAll(keepingCapacity: true)
        try await self.writer.write(contentsOf: parts)
    }
}

/// A route for a request that names no client identity, and what it depends on besides the origin.
struct AutomaticRoute {
    let route: UpstreamRoute
    /// The client identity choice an HTTPS route was made with; nil for plain HTTP, whose route
    /// depends on the settings alone, which do not change.
    let identityChoice: TrustStore.AutomaticIdentity?

    func holds(in store: TrustStore) -> Bool {
        self.identityChoice?.holds(in: store) ?? true
    }
}
