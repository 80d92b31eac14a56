/// One request on the full data path, as decisions: which attempt goes upstream next, what the
/// end of each attempt means for its upstream connection and for the client, and when the
/// request is over. Pure: events in, actions out; the shell (`Interceptor.proxy`) leases
/// connections, writes and reads, and reports back.
///
/// The rules it owns, each pinned by a transcript test (`RequestStateMachineTests`):
/// - **Reuse**: an upstream connection goes back to the pool only when the request was sent
///   whole, the origin kept the connection alive, and it is still usable. A response that ended
///   before its request body did leaves the origin out of step (it would read the rest of the
///   body as the next request: one app's body answering another app's request).
/// - **One retry on a closed pooled connection**, for an idempotent request (RFC 9110 §9.2.2:
///   a proxy must not retry another by itself) without a body, when the
///   connection had waited in the pool (an origin drops those unseen: a keep-alive timeout, a
///   restart, a network change), and not when a TLS alert closed it (that alert is the origin's
///   answer). A connection made for the request that closes before answering is the origin's
///   answer too: no retry. The other idle connections to the origin are closed with it
///   (`Release.closeWithIdle`), so the retry goes on a fresh one, not on another dropped one.
/// - **Trust is asked about once**: an interactive request whose server is not trusted asks an
///   agent once; a yes connects anew, a no (or a second failure) is the broker's error.
/// - **The client's broken body outranks the origin**: a body that broke HTTP/1.1 framing is a
///   400 for the client, unless the origin's answer already reached it.
/// - **A 304 that does not select what the cache validated is asked again** (the shell removes
///   the cache's conditional fields; the cache gives a validation up once).
/// - **Challenges are answered on all but the last attempt** (`mayAnswerChallenges`), so a
///   request makes at most `maxAttempts` attempts for credentials.
/// - **Keep-alive**: the client connection stays open only when the request was read whole, the
///   client asked for it, the response allowed it, and the daemon is not draining.
package struct RequestStateMachine: Sendable {
    /// What the shell knows of the request before any attempt.
    package struct Request: Sendable, Hashable {
        /// The request has a body (its framing is not `.none`).
        package var hasBody: Bool
        /// Its method is idempotent (RFC 9110 §9.2.2, `isIdempotent`): only such a request is ever
        /// sent again after a connection closed under it.
        package var idempotent: Bool

        /// RFC 9110 §9.2.2: the safe methods, PUT and DELETE.
        package static func isIdempotent(method: String) -> Bool {
            ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"].contains(method)
        }
        /// The client asked to keep its connection (HTTP/1.1 without `Connection: close`).
        package var clientWantsKeepAlive: Bool
        /// The request may ask an agent whether to trust a server (`Authbroker-Interactive`).
        package var mayAskAboutTrust: Bool
        /// The first attempt was already sent by the direct relay, which handed it over.
        package var adopted: Bool
        /// The direct relay sent the request on a pooled connection the origin had closed, and
        /// handed it over to be sent again: that was its one retry.
        package var closedConnectionRetried: Bool
        /// Attempts allowed for answering challenges (`Interceptor.maxAttempts`).
        package var maxAttempts: Int
        /// How the body goes on the first attempt (held for `100 Continue` or streamed).
        package var uploadPlan: UploadPlan

        package init(
            hasBody: Bool, idempotent: Bool, clientWantsKeepAlive: Bool, mayAskAboutTrust: Bool, adopted: Bool,
            closedConnectionRetried: Bool = false, maxAttempts: Int, uploadPlan: UploadPlan
        ) {
            self.hasBody = hasBody
            self.idempotent = idempotent
            self.clientWantsKeepAlive = clientWantsKeepAlive
            self.mayAskAboutTrust = mayAskAboutTrust
            self.adopted = adopted
            self.closedConnectionRetried = closedConnectionRetried
            self.maxAttempts = maxAttempts
            self.uploadPlan = uploadPlan
        }
    }

    /// One attempt as the shell sends it.
    package struct Attempt: Sendable, Hashable {
        /// 1 for the first; every connect, retry and resend counts.
        package var number: Int
        /// Use the exchange the direct relay already sent instead of leasing.
        package var adopted: Bool
        /// The request body has been read whole already (a bodiless request, or a resend).
        package var requestEnded: Bool
        /// The upload plan for this attempt: `Expect` added, body held for `100 Continue`.
        package var uploadPlan: UploadPlan
        /// A `100 Continue` already reached the client (never a second one).
        package var continueSentToClient: Bool
        /// A 401 (or the upstream proxy's 407) may be answered from the store on this attempt.
        package var mayAnswerChallenges: Bool
        /// The request may go again if this attempt's connection turns out closed before any
        /// answer (`retriesClosedConnection`).
        package var mayRetryClosedConnection: Bool

        /// Whether a connection closed before any answer (not by a TLS alert) means sending this
        /// attempt again: the response pump then leaves the answer to the machine.
        package func retriesClosedConnection(reused: Bool, closedByTLSAlert: Bool) -> Bool {
            self.mayRetryClosedConnection && reused && !closedByTLSAlert
        }
    }

    /// Why the request ends with the broker's own error, for the shell to map to one.
    package enum ErrorCause: Sendable, Hashable {
        /// Leasing a connection failed (connect, TLS, trust, pool limits): the lease's error.
        case leaseFailed
        /// The upstream connection closed with a TLS alert as the request head went out.
        case tlsAlertOnSend
        /// The upstream connection closed as the request head went out.
        case closedOnSend
        /// The client's body broke HTTP/1.1 framing.
        case malformedBody
    }

    package enum Action: Sendable, Hashable {
        /// Read the request's end now (a request without a body): `requestEndRead(_:)`.
        case readRequestEnd
        /// Send an attempt: `leaseFailed`, `sendFailed` or `attemptEnded` follow.
        case send(Attempt)
        /// Ask an agent whether to trust the server: `trustAnswered(_:)` follows.
        case askAboutTrust
        /// Answer with the broker's error for `cause` after reading the rest of the body away
        /// (unless `requestEnded`); keep the connection when `clientKeepAlive` and the body ends.
        case respondWithError(ErrorCause, clientKeepAlive: Bool, requestEnded: Bool)
        /// Answer with the broker's error for the exchange's failure before any response head,
        /// now, without reading the rest of the body.
        case sendExchangeError(keepAlive: Bool)
        /// The response reached the client: the request is over.
        case finish(keepAlive: Bool)
        /// The response reached the client, but the request body was never read: read it away
        /// for a moment (so a client that writes all before reading gets to read), then close.
        case finishDiscardingBody
        /// The response was cut off after its head: end the client connection abruptly.
        case finishAborting
        /// The client left before its request ended: close.
        case finishClientGone
    }

    /// What becomes of an attempt's upstream connection.
    package enum Release: Sendable, Hashable {
        case reuse
        case close
        /// Close it, and the origin's idle connections with it: it had waited in the pool and the
        /// origin had dropped it, as it likely dropped the others that waited (a restart, a
        /// network change).
        case closeWithIdle
    }

    /// One decision: what to do with the attempt's connection (nil: it had none), then what next.
    package struct Step: Sendable, Hashable {
        package var release: Release?
        package var next: Action

        package init(release: Release?, next: Action) {
            self.release = release
            self.next = next
        }
    }

    /// How an attempt's exchange ended, as the response pump reports it.
    package enum Exchange: Sendable, Hashable {
        /// The response went to the client whole.
        case completed(upstreamKeepAlive: Bool, clientKeepAlive: Bool)
        /// Nothing reached the client; the pump left the answer to the request side.
        case failedBeforeHead(connectionClosed: Bool)
        /// The broker's error went to the client instead of a response head.
        case errorSent(keepAlive: Bool)
        /// The response was cut off after its head reached the client.
        case abortedAfterHead
        /// A 401 (or the proxy's 407) was answered from the store and read away.
        case challengeAnswered(upstreamKeepAlive: Bool)
        /// The origin refused the `Expect` the broker added (417), before the body.
        case expectationRefused
        /// A 304 to the cache's own validation did not select its stored response; read away.
        case cacheValidationNotSelected(upstreamKeepAlive: Bool)
    }

    /// An attempt's end, with what the request side learned meanwhile.
    package struct AttemptEnd: Sendable, Hashable {
        package var exchange: Exchange
        /// The request body has been read whole (on this attempt or before).
        package var requestComplete: Bool
        /// The client's body broke HTTP/1.1 framing on this attempt.
        package var malformedBody: Bool
        /// This attempt's body was held for `100 Continue` and never sent (a final status came).
        package var bodyWithheld: Bool
        /// A `100 Continue` has reached the client.
        package var continueSentToClient: Bool
        /// The connection is still open and verified under the current anchors and pins.
        package var connectionUsable: Bool
        /// A TLS alert closed the connection (the origin's answer, not a stale pooled connection).
        package var closedByTLSAlert: Bool
        /// The connection had waited in the pool (idle, or between requests) rather than being
        /// made for this attempt.
        package var connectionReused: Bool
        /// The daemon is shutting down: no connection is kept alive.
        package var draining: Bool

        package init(
            exchange: Exchange, requestComplete: Bool, malformedBody: Bool = false, bodyWithheld: Bool = false,
            continueSentToClient: Bool = false, connectionUsable: Bool = true, closedByTLSAlert: Bool = false,
            connectionReused: Bool = true, draining: Bool = false
        ) {
            self.exchange = exchange
            self.requestComplete = requestComplete
            self.malformedBody = malformedBody
            self.bodyWithheld = bodyWithheld
            self.continueSentToClient = continueSentToClient
            self.connectionUsable = connectionUsable
            self.closedByTLSAlert = closedByTLSAlert
            self.connectionReused = connectionReused
            self.draining = draining
        }
    }

    private let request: Request
    private var attempt = 0
    private var requestEnded = false
    private var askedAboutTrust = false
    private var uploadPlan: UploadPlan
    private var continueSentToClient = false
    private var closedConnectionRetried: Bool
    package private(set) var isFinished = false

    package init(_ request: Request) {
        self.request = request
        self.uploadPlan = request.uploadPlan
        self.closedConnectionRetried = request.closedConnectionRetried
    }

    /// The first action.
    package mutating func start() -> Action {
        // A request without a body: its end follows the head at once; taking it first lets the
        // whole request go upstream in one write.
        self.request.hasBody ? self.nextAttempt() : .readRequestEnd
    }

    /// The request's end was read (`ended`), or the client left first.
    package mutating func requestEndRead(ended: Bool) -> Action {
        guard ended else { return self.finish(.finishClientGone) }
        self.requestEnded = true
        return self.nextAttempt()
    }

    /// Leasing a connection for the attempt failed; `untrustedServer`: because the server's
    /// certificate is not trusted (an agent may be asked about it).
    package mutating func leaseFailed(untrustedServer: Bool) -> Step {
        if untrustedServer, self.request.mayAskAboutTrust, !self.askedAboutTrust {
            self.askedAboutTrust = true
            return Step(release: nil, next: .askAboutTrust)
        }
        return Step(release: nil, next: self.respond(.leaseFailed))
    }

    /// An agent answered (or did not) whether to trust the server.
    package mutating func trustAnswered(_ trusted: Bool) -> Action {
        trusted ? self.nextAttempt() : self.respond(.leaseFailed)
    }

    /// Sending the attempt's head failed: the connection closed (`closedByTLSAlert`: with an
    /// alert); `connectionReused`: it had waited in the pool.
    package mutating func sendFailed(closedByTLSAlert: Bool, connectionReused: Bool) -> Step {
        if self.mayRetryClosedConnection && connectionReused && !closedByTLSAlert {
            return Step(release: .closeWithIdle, next: self.retry())
        }
        return Step(
            release: Self.closedRelease(reused: connectionReused, byTLSAlert: closedByTLSAlert),
            next: self.respond(closedByTLSAlert ? .tlsAlertOnSend : .closedOnSend)
        )
    }

    /// The attempt's exchange ended.
    package mutating func attemptEnded(_ end: AttemptEnd) -> Step {
        self.requestEnded = end.requestComplete
        self.continueSentToClient = end.continueSentToClient
        if !end.bodyWithheld { self.uploadPlan.bodyStarted() }

        // The client's broken body ended the exchange: unless the origin's answer already
        // reached the client, the error is the client's.
        if end.malformedBody {
            switch end.exchange {
            case .failedBeforeHead, .challengeAnswered, .expectationRefused, .cacheValidationNotSelected:
                return Step(release: .close, next: self.finish(.respondWithError(.malformedBody, clientKeepAlive: false, requestEnded: true)))
            case .completed, .errorSent, .abortedAfterHead:
                break
            }
        }

        switch end.exchange {
        case .completed(let upstreamKeepAlive, let clientKeepAlive):
            let reuse = end.requestComplete && upstreamKeepAlive && end.connectionUsable
            if end.bodyWithheld { return Step(release: reuse ? .reuse : .close, next: self.finish(.finishDiscardingBody)) }
            let keepAlive = end.requestComplete && clientKeepAlive && !end.draining
            return Step(release: reuse ? .reuse : .close, next: self.finish(.finish(keepAlive: keepAlive)))
        case .failedBeforeHead(let connectionClosed):
            if connectionClosed, self.mayRetryClosedConnection, end.connectionReused, !end.closedByTLSAlert {
                return Step(release: .closeWithIdle, next: self.retry())
            }
            let keepAlive = end.requestComplete && self.request.clientWantsKeepAlive && !end.draining
            let release = connectionClosed ? Self.closedRelease(reused: end.connectionReused, byTLSAlert: end.closedByTLSAlert) : .close
            return Step(release: release, next: self.finish(.sendExchangeError(keepAlive: keepAlive)))
        case .errorSent(let keepAlive):
            return Step(release: .close, next: self.finish(.finish(keepAlive: keepAlive && end.requestComplete && !end.draining)))
        case .abortedAfterHead:
            return Step(release: .close, next: self.finish(.finishAborting))
        case .challengeAnswered(let upstreamKeepAlive), .cacheValidationNotSelected(let upstreamKeepAlive):
            // A connection whose request body was withheld is out of step with the origin.
            let reuse = end.requestComplete && upstreamKeepAlive && end.connectionUsable
            return Step(release: reuse ? .reuse : .close, next: self.nextAttempt())
        case .expectationRefused:
            _ = self.uploadPlan.expectationFailed()
            return Step(release: .close, next: self.nextAttempt())
        }
    }

    // MARK: -

    /// Only an idempotent request without a body may be sent again after a closed connection, and once.
    private var mayRetryClosedConnection: Bool { self.request.idempotent && !self.request.hasBody && !self.closedConnectionRetried }

    /// A connection that waited in the pool and closed before any answer makes the others that
    /// wait suspect, retried or not (a POST that may not go again still clears them for the next).
    private static func closedRelease(reused: Bool, byTLSAlert: Bool) -> Release {
        reused && !byTLSAlert ? .closeWithIdle : .close
    }

    private mutating func retry() -> Action {
        self.closedConnectionRetried = true
        return self.nextAttempt()
    }

    private mutating func nextAttempt() -> Action {
        self.attempt += 1
        return .send(
            Attempt(
                number: self.attempt, adopted: self.request.adopted && self.attempt == 1, requestEnded: self.requestEnded,
                uploadPlan: self.uploadPlan, continueSentToClient: self.continueSentToClient,
                mayAnswerChallenges: self.attempt < self.request.maxAttempts,
                mayRetryClosedConnection: self.mayRetryClosedConnection
            )
        )
    }

    private mutating func respond(_ cause: ErrorCause) -> Action {
        self.finish(.respondWithError(cause, clientKeepAlive: self.request.clientWantsKeepAlive, requestEnded: self.requestEnded))
    }

    private mutating func finish(_ action: Action) -> Action {
        self.isFinished = true
        return action
    }
}

extension RequestStateMachine.Request {
    /// A request the direct relay takes (`DirectRelayPolicy`): no body, the client keeps its
    /// connection, no agent to ask, and one attempt (a challenge goes to the full path, which
    /// adopts the exchange). The relay reports its attempt's end to a machine made from this, so
    /// reuse, retry and keep-alive are decided by the same rules on both paths.
    package static let directlyRelayed = Self(
        hasBody: false, idempotent: true, clientWantsKeepAlive: true, mayAskAboutTrust: false, adopted: false, maxAttempts: 1,
        uploadPlan: UploadPlan(body: .none, clientExpectsContinue: false, replayBound: 0, credentialUpFront: false)
    )
}
