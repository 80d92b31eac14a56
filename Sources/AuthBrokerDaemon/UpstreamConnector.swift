import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerKerberos
import AuthBrokerTrust
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOTLS
import SwiftASN1
import X509

/// What the connector needs to present a client identity in a TLS handshake.
package struct ClientIdentityMaterial: Sendable {
    /// Leaf first.
    package var chain: [NIOSSLCertificate]
    package var privateKey: NIOSSLPrivateKey
    /// Changes when the identity is replaced, so a cached TLS context is not reused for the new one.
    package var version: String

    package init(chain: [NIOSSLCertificate], privateKey: NIOSSLPrivateKey, version: String) {
        self.chain = chain
        self.privateKey = privateKey
        self.version = version
    }
}

/// Loads a client identity's chain and private key by name (the key is in the secret store, so
/// this may block on it: implementations do that off the event loops).
package protocol ClientIdentitySource: Sendable {
    func material(named name: String) async throws -> ClientIdentityMaterial
}

/// Opens connections to origins: TCP (with the config's `resolve` overrides), then TLS whose
/// server trust is decided by our `TrustEvaluator` in NIOSSL's custom verification callback,
/// presenting the route's client identity when it names one.
package final class UpstreamConnector: Sendable {
    private let group: any EventLoopGroup
    private let settings: BrokerSettings
    private let trust: TrustEvaluator
    private let tlsConfiguration: TLSConfiguration
    private let tlsContext: NIOSSLContext
    /// For routes whose keys are logged (`UpstreamRoute.keyLogged`): only with a key log for
    /// marked requests (for all of them, the shared configuration logs every connection's).
    private let keyLogged: (configuration: TLSConfiguration, context: NIOSSLContext)?
    private let identities: (any ClientIdentitySource)?
    /// Answers the upstream proxy's 407s to CONNECT from stored passwords (nil: never).
    private let proxyAuthenticator: HTTPAuthenticator?
    /// TLS contexts that present an identity, by name and whether keys are logged, with the
    /// identity's version (making one parses the key).
    private let identityContexts = NIOLockedValueBox<[IdentityContextKey: (version: String, context: NIOSSLContext)]>([:])

    private struct IdentityContextKey: Hashable {
        var name: String
        var keyLogged: Bool
    }
    private let logger: Logger

    /// `[[route]]` and the rest that a reload replaces.
    let rules: LiveRules
    /// What a connection made now is made under.
    package var generation: ConnectionGeneration { ConnectionGeneration(trust: self.trust.storeGeneration, rules: self.rules.generation) }

    /// How long a closing TLS connection waits for the server's close_notify.
    static let tlsShutdownTimeout: TimeAmount = .milliseconds(100)

    package init(
        group: any EventLoopGroup, settings: BrokerSettings, rules: LiveRules? = nil, trust: TrustEvaluator,
        identities: (any ClientIdentitySource)? = nil, proxyAuthenticator: HTTPAuthenticator? = nil,
        keyLog: NIOSSLKeyLogCallback? = nil, keyLogAll: Bool = true, logger: Logger
    ) throws {
        self.rules = rules ?? LiveRules(settings)
        self.proxyAuthenticator = proxyAuthenticator
        self.group = group
        self.settings = settings
        self.trust = trust
        self.identities = identities
        self.logger = logger
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.minimumTLSVersion = .tlsv12
        tls.applicationProtocols = ["http/1.1"]
        // Every check is ours (custom callback below); BoringSSL's own roots are never consulted.
        tls.certificateVerification = .fullVerification
        tls.trustRoots = .certificates([])
        // Closing, the daemon sends close_notify but need not wait long for the server's: NIOSSL's
        // default 5 s let an origin that keeps sending (an endless header line) hold an event loop
        // busy decrypting bytes nobody reads, starving the other connections on it.
        tls.shutdownTimeout = Self.tlsShutdownTimeout
        // `[debug] tls_key_log`: every connection's keys (`keyLogAll`), or only those of routes
        // that ask (`UpstreamRoute.keyLogged`), from a configuration of their own.
        if let keyLog, keyLogAll {
            tls.keyLogCallback = keyLog
            self.keyLogged = nil
        } else if let keyLog {
            var logged = tls
            logged.keyLogCallback = keyLog
            self.keyLogged = (logged, try NIOSSLContext(configuration: logged))
        } else {
            self.keyLogged = nil
        }
        self.tlsConfiguration = tls
        self.tlsContext = try NIOSSLContext(configuration: tls)
    }

    /// The TLS context for `route`: the shared one, or one presenting its client identity.
    private func tlsContext(for route: UpstreamRoute) async throws -> NIOSSLContext {
        let logged = route.keyLogged ? self.keyLogged : nil
        guard let name = route.clientIdentity else { return logged?.context ?? self.tlsContext }
        guard let identities = self.identities else {
            throw BrokerError.clientIdentityUnavailable(name: name, origin: route.origin, reason: "this daemon has no secret store")
        }
        let material: ClientIdentityMaterial
        do {
            material = try await identities.material(named: name)
        } catch let error as BrokerError {
            throw error
        } catch {
            throw BrokerError.clientIdentityUnavailable(name: name, origin: route.origin, reason: "\(error)")
        }
        let key = IdentityContextKey(name: name, keyLogged: logged != nil)
        if let cached = self.identityContexts.withLockedValue({ $0[key] }), cached.version == material.version {
            return cached.context
        }
        var configuration = logged?.configuration ?? self.tlsConfiguration
        configuration.certificateChain = material.chain.map { .certificate($0) }
        configuration.privateKey = .privateKey(material.privateKey)
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: configuration)
        } catch {
            throw BrokerError.clientIdentityUnavailable(
                name: name, origin: route.origin, reason: "its certificate and key do not make a usable TLS identity (\(error))"
            )
        }
        self.identityContexts.withLockedValue { $0[key] = (material.version, context) }
        return context
    }

    /// A TLS connection that completed its handshake, or the error explaining why not.
    package struct Connected: Sendable {
        package var channel: any Channel
        package var handler: NIOLoopBound<UpstreamExchangeHandler>
    }

    /// Connects to `origin` and returns a connection ready for its first exchange, on
    /// `eventLoop` when given (the requesting client connection's), else on any of the group's.
    /// - Throws: `BrokerError` naming what failed (DNS, refused, timeout, untrusted server, TLS).
    package func connect(
        route: UpstreamRoute, id: Int, on eventLoop: (any EventLoop)? = nil, onClose: @escaping @Sendable () -> Void
    ) async throws -> UpstreamConnection {
        try await self.open(
            route: route, id: id, on: eventLoop, onClose: onClose, observation: NIOLockedValueBox(nil)
        )
    }

    /// Shakes hands with `origin` and reports the chain it presented and our verdict on it,
    /// trusted or not (for `POST /v1/inspect` and `authbrokerctl anchors trust-server`).
    package func inspect(origin: CanonicalOrigin) async throws -> Inspection {
        let observation = NIOLockedValueBox<TrustObservation?>(nil)
        do {
            let route = UpstreamRoute(origin, proxy: self.rules.proxy(for: origin))
            let connection = try await self.open(route: route, id: -1, on: nil, onClose: {}, observation: observation)
            connection.close()
        } catch {
            guard observation.withLockedValue({ $0 }) != nil else { throw error }
        }
        guard let seen = observation.withLockedValue({ $0 }) else {
            throw BrokerError.internalError("The TLS handshake with \(origin.hostHeader) finished without a trust decision")
        }
        let pems = seen.chainDER.map { der in
            (try? Certificate(derEncoded: der).serializeAsPEM().pemString) ?? ""
        }
        return Inspection(decision: seen.decision, chainPEM: pems)
    }

    private func open(
        route: UpstreamRoute, id: Int, on eventLoop: (any EventLoop)?, onClose: @escaping @Sendable () -> Void,
        observation decisionBox: NIOLockedValueBox<TrustObservation?>
    ) async throws -> UpstreamConnection {
        let origin = route.origin
        let tlsContext = origin.scheme == .https ? try await self.tlsContext(for: route) : self.tlsContext
        let handshake = self.group.next().makePromise(of: Void.self)
        let settings = self.settings
        let generation = self.generation
        // The TLS error that closed the channel, if any: in TLS 1.3 a server's verdict on our
        // client certificate arrives just after the handshake completed.
        let channelError = NIOLockedValueBox<(any Error & Sendable)?>(nil)
        let channel: any Channel
        if let proxy = route.proxy, origin.scheme == .https {
            do {
                channel = try await self.openTunnel(through: proxy, to: origin, on: eventLoop)
            } catch {
                handshake.fail(error)
                throw error
            }
            do {
                try await channel.eventLoop.submit { [self] in
                    try self.configurePipeline(
                        channel: channel, origin: origin, tlsContext: tlsContext, decisionBox: decisionBox,
                        channelError: channelError, handshake: handshake, onClose: onClose
                    )
                }.get()
            } catch {
                channel.close(promise: nil)
                handshake.fail(error)
                throw BrokerError.proxyTunnelFailed(proxy: proxy, origin: origin, reason: "the tunnel closed as it opened")
            }
        } else {
            do {
                channel = try await self.connectTCP(to: route.firstHop, for: origin, on: eventLoop) { [self] channel in
                    try self.configurePipeline(
                        channel: channel, origin: origin, tlsContext: tlsContext, decisionBox: decisionBox,
                        channelError: channelError, handshake: handshake, onClose: onClose
                    )
                }
            } catch {
                handshake.fail(error)
                throw error
            }
        }

        if origin.scheme == .https {
            let timeoutMilliseconds = settings.upstream.tlsHandshakeTimeoutMilliseconds
            let timer = channel.eventLoop.scheduleTask(in: .milliseconds(Int64(timeoutMilliseconds))) {
                handshake.fail(BrokerError.tlsHandshakeTimeout(origin: origin, milliseconds: timeoutMilliseconds))
                channel.close(promise: nil)
            }
            do {
                try await handshake.futureResult.get()
                timer.cancel()
            } catch {
                timer.cancel()
                channel.close(promise: nil)
                if let seen = decisionBox.withLockedValue({ $0 }), !seen.decision.isTrusted {
                    throw BrokerError.untrustedServer(origin: origin, decision: seen.decision, chainDER: seen.chainDER)
                }
                if let broker = error as? BrokerError { throw broker }
                throw BrokerError.tlsHandshakeFailed(origin: origin, underlying: error, identity: route.clientIdentity)
            }
        } else {
            handshake.succeed(())
        }
        let handler: NIOLoopBound<UpstreamExchangeHandler>
        do {
            handler = try await channel.eventLoop.submit {
                NIOLoopBound(
                    try channel.pipeline.syncOperations.handler(type: UpstreamExchangeHandler.self), eventLoop: channel.eventLoop
                )
            }.get()
        } catch {
            // The channel closed as soon as it opened: say why, when TLS told us.
            if let tlsError = channelError.withLockedValue({ $0 }) {
                throw BrokerError.tlsHandshakeFailed(origin: origin, underlying: tlsError, identity: route.clientIdentity)
            }
            throw BrokerError.connectionClosedEarly(origin: origin)
        }
        return UpstreamConnection(
            id: id, route: route, channel: channel, generation: generation, handler: handler, tlsError: channelError
        )
    }

    /// A TCP connection to `hop` (with the config's `resolve` overrides), or a connection to the
    /// Unix socket a `[[route]]` names for it, set up by `initializer`.
    ///
    /// - Throws: `BrokerError` for a failed connect: `origin`'s own error (DNS, refused, timeout),
    ///   or, when `hop` is the upstream proxy rather than `origin`, that error as the proxy's.
    private func connectTCP(
        to hop: CanonicalOrigin, for origin: CanonicalOrigin, on eventLoop: (any EventLoop)? = nil,
        initializer: @escaping @Sendable (any Channel) throws -> Void
    ) async throws -> any Channel {
        // On the requester's event loop when given, so the exchange never hops threads.
        let bootstrap = ClientBootstrap(group: eventLoop ?? self.group)
            .connectTimeout(self.settings.upstream.connectTimeout)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try initializer(channel) }
            }
        if let route = self.rules.unixRoute(for: hop.host) {
            do {
                return try await bootstrap.connect(unixDomainSocketPath: route.socketPath).get()
            } catch {
                throw BrokerError.unixRouteUnreachable(error, route: route, origin: origin)
            }
        }
        // A [[rewrite]] connect_to: another address, the same name for TLS and trust.
        let (host, port) = self.rules.connectTarget(for: hop.host) ?? (hop.host, hop.port)
        do {
            let bootstrap = bootstrap.channelOption(.socketOption(.tcp_nodelay), value: 1)
            if let override = self.settings.upstream.resolveOverride(host: host, port: port) {
                return try await bootstrap.connect(to: try SocketAddress(ipAddress: override.address, port: port)).get()
            }
            return try await bootstrap.connect(host: host, port: port).get()
        } catch {
            let mapped = BrokerError.fromConnectError(error, origin: hop, settings: self.settings)
            if hop != origin { throw BrokerError.proxyUnreachable(mapped, proxy: hop, origin: origin) }
            throw mapped
        }
    }

    /// A plain TCP connection to `origin` (`host:port` of a client's CONNECT) with an empty
    /// pipeline, for a blind tunnel: through the upstream proxy's own CONNECT when one is
    /// configured for the host (its 407 answered as for any tunnel), else straight there.
    /// - Throws: `BrokerError`, as `connect`.
    package func openBlindTunnel(to origin: CanonicalOrigin, on eventLoop: any EventLoop) async throws -> any Channel {
        if let proxy = self.rules.proxy(for: origin) {
            return try await self.openTunnel(through: proxy, to: origin, on: eventLoop)
        }
        // Reads start once the tunnel is joined (`ClientTunnel`): what a server sends first waits.
        return try await self.connectTCP(to: origin, for: origin, on: eventLoop) { channel in
            try channel.syncOptions?.setOption(.autoRead, value: false)
        }
    }

    /// Attempts at CONNECT per tunnel at most: a 407, its answer, a stale nonce, and one more.
    static let maxTunnelAttempts = 4

    /// Opens a tunnel to `origin` through the HTTP proxy (RFC 9110 §9.3.6) and returns its channel
    /// with an empty pipeline, ready for TLS. A 407 is answered from stored passwords (or the
    /// client's own `Proxy-Authorization`) as `HTTPAuthenticator` allows, each try on a new
    /// connection.
    ///
    /// - Throws: `BrokerError`: the proxy unreachable, its refusal (with `next-hop`), or a 407 no
    ///   stored password answers (carrying the proxy's Basic and Digest challenges for the client).
    private func openTunnel(
        through proxy: CanonicalOrigin, to origin: CanonicalOrigin, on eventLoop: (any EventLoop)?
    ) async throws -> any Channel {
        let context = UpstreamConnectContext.current
        let target = origin.authorityForm
        var auth = RequestAuthState(proxyAuthorization: context?.clientProxyAuthorization)
        // A trial of the proxy's password this tunnel still holds when it opens or fails ends here.
        defer { self.proxyAuthenticator?.requestEnded(auth) }
        self.proxyAuthenticator?.authorizePreemptively(
            origin: proxy, method: .CONNECT, uri: target, isProxy: true, requester: { context?.requester }, state: &auth
        )
        // A tunnel is a new connection: a proxy that took a Kerberos token before wants one on it.
        await self.proxyAuthenticator?.negotiatePreemptively(
            proxy, isProxy: true, uri: target, requester: context?.requester, state: &auth
        )
        for attempt in 1...Self.maxTunnelAttempts {
            let responsePromise = self.group.next().makePromise(of: HTTPResponseHead.self)
            let channel: any Channel
            do {
                channel = try await self.connectTCP(to: proxy, for: origin, on: eventLoop) { channel in
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(HTTPRequestEncoder(), name: "proxy-encoder")
                    // As on every upstream connection: an ISO-8859-1 realm in the proxy's 407 is
                    // read as ISO-8859-1, whitespace after values dropped, a bare CR refused.
                    try sync.addHandler(
                        HeadNormalizer(.responses, maxHeadBytes: self.settings.limits.maxResponseHeadBytes), name: "proxy-normalizer"
                    )
                    try sync.addHandler(
                        ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes)), name: "proxy-decoder"
                    )
                    try sync.addHandler(ProxyConnectHandler(promise: responsePromise), name: "proxy-connect")
                }
            } catch {
                responsePromise.fail(error)
                throw error
            }
            var headers = HTTPHeaders()
            headers.add(name: "Host", value: target)
            if let authorization = auth.authorization ?? context?.clientProxyAuthorization {
                headers.add(name: "Proxy-Authorization", value: authorization)
            }
            let head = HTTPRequestHead(version: .http1_1, method: .CONNECT, uri: target, headers: headers)
            let answer: HTTPResponseHead
            do {
                // The head alone: a CONNECT has no body (RFC 9110 §9.3.6), so no `.end` is encoded.
                channel.write(HTTPClientRequestPart.head(head), promise: nil)
                try await channel.writeAndFlush(HTTPClientRequestPart.end(nil)).get()
                let timeout = channel.eventLoop.scheduleTask(in: self.settings.upstream.responseHeadTimeout) {
                    responsePromise.fail(ProxyTunnelError.closed)
                }
                defer { timeout.cancel() }
                answer = try await responsePromise.futureResult.get()
            } catch {
                channel.close(promise: nil)
                var reason = "it closed the connection first"
                if case ProxyTunnelError.protocolError(let underlying) = error { reason = "\(underlying)" }
                throw BrokerError.proxyTunnelFailed(proxy: proxy, origin: origin, reason: reason)
            }
            if (200..<300).contains(answer.status.code) {
                if let failure = await self.proxyAuthenticator?.negotiateAccepted(
                    answer, challenger: proxy, isProxy: true, uri: target, state: auth
                ) {
                    channel.close(promise: nil)
                    throw BrokerError.kerberos(failure, challenger: proxy, isProxy: true, origin: origin)
                }
                self.proxyAuthenticator?.responseAccepted(answer, origin: proxy, uri: target, state: auth)
                do {
                    for name in ["proxy-connect", "proxy-decoder", "proxy-normalizer", "proxy-encoder"] {
                        try await channel.pipeline.removeHandler(name: name).get()
                    }
                } catch {
                    channel.close(promise: nil)
                    throw BrokerError.proxyTunnelFailed(proxy: proxy, origin: origin, reason: "the tunnel closed as it opened")
                }
                return channel
            }
            channel.close(promise: nil)
            guard answer.status == .proxyAuthenticationRequired else {
                throw BrokerError.proxyRefusedTunnel(proxy: proxy, origin: origin, status: answer.status)
            }
            var answered = false
            if attempt < Self.maxTunnelAttempts, let authenticator = self.proxyAuthenticator {
                answered = await authenticator.answerChallenge(
                    answer, origin: proxy, method: .CONNECT, uri: target, resendableBody: .bytes([]), isProxy: true,
                    agentWait: context?.agentWait, requester: context?.requester, state: &auth
                )
            }
            if !answered {
                let visible = ChallengeSelection.forClient(fieldValues: answer.headers["Proxy-Authenticate"]).values
                if let failure = auth.negotiateFailure, visible.isEmpty {
                    throw BrokerError.kerberos(failure, challenger: proxy, isProxy: true, origin: origin)
                }
                throw BrokerError.proxyAuthenticationRequired(proxy: proxy, origin: origin, challenges: visible)
            }
        }
        throw BrokerError.proxyAuthenticationRequired(proxy: proxy, origin: origin, challenges: [])
    }

    private func configurePipeline(
        channel: any Channel, origin: CanonicalOrigin, tlsContext: NIOSSLContext,
        decisionBox: NIOLockedValueBox<TrustObservation?>, channelError: NIOLockedValueBox<(any Error & Sendable)?>,
        handshake: EventLoopPromise<Void>, onClose: @escaping @Sendable () -> Void
    ) throws {
        let sync = channel.pipeline.syncOperations
        if origin.scheme == .https {
            let trust = self.trust
            let host = origin.host
            let logger = self.logger
            // SNI carries DNS names only (RFC 6066 §3); an IP target is checked against IP SANs.
            let sniName = origin.isIPAddress ? nil : origin.host
            let tlsHandler = try NIOSSLClientHandler(
                context: tlsContext, serverHostname: sniName,
                customVerificationCallback: { certificates, promise in
                    let chainDER: [[UInt8]]
                    do {
                        chainDER = try certificates.map { try $0.toDERBytes() }
                    } catch {
                        promise.succeed(.failed)
                        return
                    }
                    // Never block the event loop: the decision is made on a task and completes the promise.
                    Task {
                        let decision = await trust.evaluate(chainDER: chainDER, host: host, port: origin.port)
                        decisionBox.withLockedValue { $0 = TrustObservation(decision: decision, chainDER: chainDER) }
                        logger.debug(
                            "trust decision",
                            metadata: [
                                "host": "\(host)", "trusted": "\(decision.isTrusted)",
                                "cached": "\(decision.fromCache)",
                                "leaf_sha256": "\(decision.chain.first?.sha256 ?? "-")",
                            ]
                        )
                        promise.succeed(decision.isTrusted ? .certificateVerified : .failed)
                    }
                }
            )
            try sync.addHandler(tlsHandler)
            try sync.addHandler(HandshakeObserver(promise: handshake, errors: channelError))
        }
        try UpstreamExchangeHandler.addHTTPHandlers(
            to: sync, responseHeadTimeout: self.settings.upstream.responseHeadTimeout, idleTimeout: self.settings.upstream.idleTimeout,
            maxResponseHeadBytes: self.settings.limits.maxResponseHeadBytes, onClose: onClose
        )
    }
}

extension UpstreamExchangeHandler {
    /// An upstream connection's HTTP handlers, after its TLS when it has any: the one place
    /// that builds them (the daemon's connections and the tests' alike).
    @discardableResult
    package static func addHTTPHandlers(
        to sync: ChannelPipeline.SynchronousOperations, responseHeadTimeout: TimeAmount, idleTimeout: TimeAmount,
        maxResponseHeadBytes: Int, onClose: @escaping @Sendable () -> Void
    ) throws -> UpstreamExchangeHandler {
        var encoder = HTTPRequestEncoder.Configuration()
        encoder.automaticallySetFramingHeaders = false
        try sync.addHandler(HTTPRequestEncoder(configuration: encoder))
        // Every request's framing (codings kept): the one place, as on client connections.
        try sync.addHandler(RequestFramer())
        // Each head normalised before the decoder: non-UTF-8 lines (an ISO-8859-1 realm) read as
        // ISO-8859-1, not lossily; whitespace after values, which the decoder misreads, dropped.
        let normalizer = HeadNormalizer(.responses, maxHeadBytes: maxResponseHeadBytes, announcesRequests: true)
        try sync.addHandler(normalizer)
        // The decoder's own limits enforce max_response_head_bytes while the head is still
        // arriving (an endless header line must not be buffered until a timeout).
        try sync.addHandler(
            ByteToMessageHandler(
                HTTPResponseDecoder(
                    leftOverBytesStrategy: .dropBytes, informationalResponseStrategy: .forward,
                    limitConfiguration: .heads(upTo: maxResponseHeadBytes)
                )
            )
        )
        let handler = UpstreamExchangeHandler(
            responseHeadTimeout: responseHeadTimeout, idleTimeout: idleTimeout, maxResponseHeadBytes: maxResponseHeadBytes,
            headNormalizer: normalizer, onClose: onClose
        )
        try sync.addHandler(handler)
        return handler
    }
}

/// The chain a server presented and the verdict on it.
struct TrustObservation: Sendable {
    var decision: TrustDecision
    var chainDER: [[UInt8]]
}

/// Completes a promise when the TLS handshake finishes, or fails it when the channel errors
/// or closes first.
private final class HandshakeObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = NIOAny
    private let promise: EventLoopPromise<Void>
    private let errors: NIOLockedValueBox<(any Error & Sendable)?>

    init(promise: EventLoopPromise<Void>, errors: NIOLockedValueBox<(any Error & Sendable)?>) {
        self.promise = promise
        self.errors = errors
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let tlsEvent = event as? TLSUserEvent, case .handshakeCompleted = tlsEvent {
            self.promise.succeed(())
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // Kept only when it explains a close better than "closed": an alert about our client
        // certificate. (An unclean shutdown of an idle keep-alive connection is routine.)
        if ClientCertificateAlert(error) != nil {
            if let tlsError = error as? NIOSSLError {
                self.errors.withLockedValue { $0 = $0 ?? tlsError }
            } else if let tlsError = error as? BoringSSLError {
                self.errors.withLockedValue { $0 = $0 ?? tlsError }
            }
        }
        self.promise.fail(error)
        context.fireErrorCaught(error)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.promise.fail(ChannelError.ioOnClosedChannel)
        context.fireChannelInactive()
    }
}
