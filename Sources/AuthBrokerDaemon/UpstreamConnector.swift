import AuthBrokerCore
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
    private let identities: (any ClientIdentitySource)?
    /// TLS contexts that present an identity, by name and version (making one parses the key).
    private let identityContexts = NIOLockedValueBox<[String: (version: String, context: NIOSSLContext)]>([:])
    private let logger: Logger

    package var trustGeneration: UInt64 { self.trust.storeGeneration }

    package init(
        group: any EventLoopGroup, settings: BrokerSettings, trust: TrustEvaluator,
        identities: (any ClientIdentitySource)? = nil, logger: Logger
    ) throws {
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
        self.tlsConfiguration = tls
        self.tlsContext = try NIOSSLContext(configuration: tls)
    }

    /// The TLS context for `route`: the shared one, or one presenting its client identity.
    private func tlsContext(for route: UpstreamRoute) async throws -> NIOSSLContext {
        guard let name = route.clientIdentity else { return self.tlsContext }
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
        if let cached = self.identityContexts.withLockedValue({ $0[name] }), cached.version == material.version {
            return cached.context
        }
        var configuration = self.tlsConfiguration
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
        self.identityContexts.withLockedValue { $0[name] = (material.version, context) }
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
            let connection = try await self.open(
                route: UpstreamRoute(origin), id: -1, on: nil, onClose: {}, observation: observation
            )
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
        let trustGeneration = self.trust.storeGeneration
        // The TLS error that closed the channel, if any: in TLS 1.3 a server's verdict on our
        // client certificate arrives just after the handshake completed.
        let channelError = NIOLockedValueBox<(any Error & Sendable)?>(nil)
        let channel: any Channel
        do {
            let bootstrap = ClientBootstrap(group: eventLoop ?? self.group)
                .connectTimeout(.milliseconds(Int64(settings.upstream.connectTimeoutMilliseconds)))
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { [self] channel in
                    channel.eventLoop.makeCompletedFuture {
                        try self.configurePipeline(
                            channel: channel, origin: origin, tlsContext: tlsContext, decisionBox: decisionBox,
                            channelError: channelError,
                            handshake: handshake, onClose: onClose
                        )
                    }
                }
            if let override = settings.upstream.resolve.first(where: { $0.matches(host: origin.host, port: origin.port) }) {
                let address = try SocketAddress(ipAddress: override.address, port: origin.port)
                channel = try await bootstrap.connect(to: address).get()
            } else {
                channel = try await bootstrap.connect(host: origin.host, port: origin.port).get()
            }
        } catch {
            handshake.fail(error)
            throw BrokerError.fromConnectError(error, origin: origin, settings: settings)
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
                    throw BrokerError.untrustedServer(origin: origin, decision: seen.decision)
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
            id: id, route: route, channel: channel, trustGeneration: trustGeneration, handler: handler, tlsError: channelError
        )
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
                        let decision = await trust.evaluate(chainDER: chainDER, host: host)
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
        try sync.addHandler(HTTPRequestEncoder())
        try sync.addHandler(
            ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .dropBytes, informationalResponseStrategy: .forward))
        )
        let idle = TimeAmount.milliseconds(Int64(self.settings.upstream.idleTimeoutMilliseconds))
        try sync.addHandler(IdleStateHandler(allTimeout: idle))
        try sync.addHandler(
            UpstreamExchangeHandler(
                responseHeadTimeout: .milliseconds(Int64(self.settings.upstream.responseHeadTimeoutMilliseconds)),
                maxResponseHeadBytes: self.settings.limits.maxResponseHeadBytes,
                onClose: onClose
            )
        )
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
