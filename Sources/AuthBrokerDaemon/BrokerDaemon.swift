import AuthBrokerCore
import AuthBrokerPAM
import AuthBrokerSecrets
import AuthBrokerTrust
import CAuthBrokerSystem
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import UnixSignals

/// What `authbrokerd`'s command line may override.
package struct DaemonOptions: Sendable {
    package var socketPath: String?
    package var configPath: String?
    package var logLevel: Logger.Level?

    package init(socketPath: String? = nil, configPath: String? = nil, logLevel: Logger.Level? = nil) {
        self.socketPath = socketPath
        self.configPath = configPath
        self.logLevel = logLevel
    }
}

/// A startup failure: printed as one line to stderr, exit status 78 (EX_CONFIG) or 1.
package struct StartupError: Error, CustomStringConvertible {
    package var description: String
    package var exitCode: Int32
}

/// Assembles the daemon: config, paths, trust, upstream pool, listener; runs until SIGTERM.
package enum BrokerDaemon {
    package static func run(_ options: DaemonOptions) async throws(StartupError) {
        // Memory will hold keys and passwords: no core dumps, no ptrace by other processes.
        _ = cab_disable_core_dumps()

        let environment = ProcessInfo.processInfo.environment
        let uid = getuid()
        let configFile = BrokerPaths.configFile(explicit: options.configPath, environment: environment)
        let loaded: BrokerSettings?
        do {
            loaded = try BrokerSettings.load(path: configFile)
        } catch {
            throw StartupError(description: "authbrokerd: bad config: \(error)", exitCode: 78)
        }
        if options.configPath != nil, loaded == nil {
            throw StartupError(description: "authbrokerd: the config file \(configFile) does not exist.", exitCode: 78)
        }
        let settings = loaded ?? .defaults

        let level = options.logLevel ?? Logger.Level(rawValue: settings.daemon.logLevel.rawValue) ?? .info
        let forJournal = environment["JOURNAL_STREAM"] != nil
        LoggingSystem.bootstrap { label in BrokerLogHandler(label: label, level: level, forJournal: forJournal) }
        let logger = Logger(label: "authbrokerd")

        let socketPath = BrokerPaths.socketPath(
            explicit: options.socketPath, configured: settings.daemon.socketPath, environment: environment, uid: uid
        )
        let stateDirectory = BrokerPaths.stateDirectory(
            configured: settings.daemon.stateDirectory, environment: environment, uid: uid
        )
        // Checked before anything in it is read: under the /tmp fallback another user could have
        // made the directory first, or planted a trust.json in it.
        do {
            try PrivateFiles.ensureDirectory(
                stateDirectory, what: "the state directory",
                fallbackRoot: BrokerPaths.fallbackDirectory(uid: uid, environment: environment)
            )
        } catch {
            throw StartupError(description: "authbrokerd: \(error)", exitCode: 1)
        }
        let store: TrustStore
        do {
            store = try TrustStore(path: (stateDirectory as NSString).appendingPathComponent("trust.json"))
        } catch {
            throw StartupError(description: "authbrokerd: \(error)", exitCode: 1)
        }
        let publicSuffixes = Self.loadPublicSuffixList(path: settings.trust.publicSuffixListPath, logger: logger)
        let evaluator = TrustEvaluator(
            systemAnchorsPath: settings.trust.systemAnchorsPath, store: store,
            cacheSize: settings.trust.decisionCacheSize,
            cacheTTL: .seconds(settings.trust.decisionCacheSeconds), publicSuffixes: publicSuffixes, logger: logger
        )

        let (listening, passedSockets) = ListeningSocket.choose(socketPath: socketPath, environment: environment)
        for ignored in passedSockets.ignored {
            logger.warning("systemd passed a socket that is not the daemon's; leaving it alone", metadata: ["fd": "\(ignored)"])
        }
        if case .path(let path) = listening {
            // Checked before anything is created: a relative path would name a directory of
            // whatever the working directory is, and one too long is refused only by bind.
            guard path.hasPrefix("/") else {
                throw StartupError(
                    description: "authbrokerd: the socket path \(path) is not absolute; give a full path, like $XDG_RUNTIME_DIR/authbroker/authbroker.sock",
                    exitCode: 1
                )
            }
            guard path.utf8.count < 108 else {
                throw StartupError(
                    description: "authbrokerd: the socket path is \(path.utf8.count) bytes, longer than a Unix socket address allows (107); choose a shorter one",
                    exitCode: 1
                )
            }
            do {
                try ListeningSocket.prepare(
                    path: path, privateDirectory: path == BrokerPaths.defaultSocketPath(environment: environment, uid: uid)
                )
            } catch {
                throw StartupError(description: "authbrokerd: \(error)", exitCode: 1)
            }
        }

        let counters = BrokerCounters()
        // The secret store: the Secret Service when asked for (or, with "auto", when it answers),
        // else the encrypted file. The probe may block for a moment, so it runs on the blocking pool.
        let secretsFile = (BrokerPaths.dataDirectory(environment: environment, uid: uid) as NSString).appendingPathComponent("secrets.bin")
        let secretsKey = ((configFile as NSString).deletingLastPathComponent as NSString).appendingPathComponent("secrets.key")
        let choice = SecretStoreChoice(rawValue: settings.secrets.store) ?? .auto
        let selected: SelectedSecretStore
        do {
            selected = try await NIOThreadPool.singleton.runIfActive {
                selectSecretStore(choice, filePath: secretsFile, keyFilePath: secretsKey, environment: environment, logger: logger)
            }
        } catch {
            throw StartupError(description: "authbrokerd: cannot choose a secret store: \(error)", exitCode: 1)
        }
        let identities = ClientIdentities(store: store, keys: SecretStoreIdentityKeys(store: selected.store))

        let vault = PasswordVault(
            permanent: SecretStorePasswords(store: selected.store),
            failuresPath: (stateDirectory as NSString).appendingPathComponent("password-failures.json"),
            digestOnlyPath: (stateDirectory as NSString).appendingPathComponent("password-digest-only.json"),
            logger: logger
        )
        let audit: AuditLog
        do {
            audit = try AuditLog(path: (stateDirectory as NSString).appendingPathComponent("audit.jsonl"), logger: logger)
        } catch let error as StartupError {
            throw error
        } catch {
            throw StartupError(description: "authbrokerd: \(error)", exitCode: 1)
        }
        // The HTTP cache, when enabled; one that cannot be opened leaves the daemon running
        // without it (nothing depends on it), and `status` says why.
        let (cache, cacheProblem): (ResponseCache?, String?)
        if settings.cache.enabled {
            let directory = BrokerPaths.cacheDirectory(configured: settings.cache.directory, environment: environment, uid: uid)
            do {
                cache = try await ResponseCache.open(
                    directory: directory, settings: settings.cache,
                    fallbackRoot: BrokerPaths.fallbackDirectory(uid: uid, environment: environment), logger: logger
                )
                cacheProblem = nil
            } catch {
                cache = nil
                cacheProblem = "The HTTP cache is off: \(error). Fix the directory (or [cache] directory in config.toml) and restart the daemon."
                logger.error("cannot open the HTTP cache", metadata: ["directory": "\(directory)", "error": "\(error)"])
            }
        } else {
            (cache, cacheProblem) = (nil, nil)
        }
        let challenges = AgentChallenges(
            vault: vault, store: store, evaluator: evaluator, agentEventBuffer: settings.limits.agentEventBuffer, logger: logger
        )
        let kerberos = KerberosNegotiator(settings: settings.kerberos, logger: logger)
        let authenticator = HTTPAuthenticator(
            vault: vault, challenges: challenges, audit: audit, kerberos: kerberos, maxAuthSpaces: settings.limits.maxAuthSpaces,
            logger: logger
        )
        // The daemon's own group, sized by `io_threads`, rather than NIO's singleton (one loop per
        // core): its size is a setting, and it is shut down with the daemon.
        let keyLog = try settings.debug.tlsKeyLogPath.map { path throws(StartupError) in try TLSKeyLog(path: path, logger: logger) }
        if let keyLog { logger.warning("the TLS key log is on", metadata: ["path": "\(keyLog.path)"]) }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: settings.daemon.ioThreadCount)
        // `[[route]]`, `[[respond]]` and interception: replaced by a reload (SIGHUP, /v1/reload).
        let rules = LiveRules(settings)
        let connector: UpstreamConnector
        do {
            connector = try UpstreamConnector(
                group: group, settings: settings, rules: rules, trust: evaluator, identities: identities, proxyAuthenticator: authenticator,
                keyLog: keyLog?.callback, keyLogAll: settings.debug.tlsKeyLogScope == .all, logger: logger
            )
        } catch {
            try? await group.shutdownGracefully()
            throw StartupError(description: "authbrokerd: cannot set up TLS: \(error)", exitCode: 1)
        }
        let poolBox = NIOLockedValueBox<UpstreamPool<UpstreamConnection>?>(nil)
        let pool = UpstreamPool<UpstreamConnection>(
            limits: .init(
                maxConnections: settings.upstream.maxConnectionsPerOrigin,
                maxIdleConnections: settings.upstream.maxIdleConnectionsPerOrigin,
                maxPendingRequests: settings.upstream.maxPendingRequestsPerOrigin
            ),
            idleTimeout: .milliseconds(Int64(settings.upstream.poolIdleTimeoutMilliseconds)),
            eventLoop: group.next(),
            connect: { route, id, eventLoop in
                // Counted open once the connection is made, and closed only if it was counted: a
                // channel that closes while connecting (a refused handshake, an untrusted server)
                // calls `onClose` too, and may do so before `connect` returns.
                let counted = NIOLockedValueBox<Bool?>(nil)  // nil: connecting; false: closed first
                let connection = try await connector.connect(route: route, id: id, on: eventLoop) {
                    let wasCounted = counted.withLockedValue { state in
                        defer { if state == nil { state = false } }
                        return state == true
                    }
                    if wasCounted { counters.upstreamConnectionsOpen.subtract(1) }
                    poolBox.withLockedValue { $0 }?.connectionClosed(route: route, id: id)
                }
                let open = counted.withLockedValue { state in
                    guard state == nil else { return false }
                    state = true
                    return true
                }
                if open { counters.upstreamConnectionsOpen.add(1) }
                return connection
            },
            close: { connection in connection.close() },
            eventLoopOf: { connection in connection.channel.eventLoop }
        )
        poolBox.withLockedValue { $0 = pool }

        let startedAt = Date()
        let proxyPort = ProxyPortAddresses()
        let boundPath: String = if case .path(let path) = listening { path } else { socketPath }
        let reauth = ReauthService(
            authenticator: PAMAuthenticator(
                configuration: .init(service: settings.security.pamService, configDirectory: settings.security.pamConfigDirectory),
                logger: logger
            ),
            policy: ReauthPolicy(grantTTL: .seconds(settings.security.reauthGrantSeconds)),
            logger: logger
        )
        let localCA = LocalCA(
            files: LocalCA.Files(stateDirectory: stateDirectory, systemAnchors: settings.trust.systemAnchorsPath),
            keys: SecretStoreIdentityKeys(store: selected.store), logger: logger
        )
        let interception = InterceptionScope(rules: rules, store: store, vault: vault, authority: localCA)
        let reloader = RulesReloader(configFile: configFile, rules: rules, started: settings, logger: logger)
        let flows = FlowLog(settings: settings.flows, limits: settings.limits)
        let control = ControlAPI(
            store: store, vault: vault, reauth: reauth, challenges: challenges, identities: identities, localCA: localCA,
            reloader: reloader, flows: flows, cache: cache, kerberos: kerberos, publicSuffixes: publicSuffixes,
            status: {
                StatusReport(
                    version: AuthBrokerVersion.current, pid: Int(getpid()), startedAt: startedAt,
                    uptimeSeconds: Date().timeIntervalSince(startedAt), socket: boundPath, proxyPort: proxyPort.addresses,
                    configFile: configFile, configLoaded: loaded != nil, stateDirectory: stateDirectory,
                    systemAnchors: .init(path: settings.trust.systemAnchorsPath, count: evaluator.systemAnchorCount),
                    userAnchors: store.anchors().count, pins: store.pins().count,
                    counters: counters.snapshot,
                    secretStore: .init(backend: selected.store.backendName, reason: selected.reason),
                    identities: store.identities().count,
                    warnings: StatusReport.warnings(identities: store.identities(), failedPasswords: vault.failedCount, now: Date())
                        + (keyLog.map { [$0.warning(scope: settings.debug.tlsKeyLogScope)] } ?? [])
                        + (cacheProblem.map { [$0] } ?? []) + (cache?.isOffline == true ? [StatusReport.offlineWarning] : []),
                    cache: cache?.counters
                )
            },
            inspect: { origin in try await connector.inspect(origin: origin) }
        )
        let registry = ClientConnectionRegistry()
        let server = ClientConnectionServer(
            interceptor: Interceptor(
                pool: pool, settings: settings, rules: rules, counters: counters, store: store,
                generation: { connector.generation }, authenticator: authenticator, audit: audit,
                challenges: challenges, flows: flows, cache: cache
            ),
            control: control, registry: registry, counters: counters, settings: settings, logger: logger,
            openTunnel: { origin, eventLoop in try await connector.openBlindTunnel(to: origin, on: eventLoop) },
            interception: interception
        )
        let service = BrokerService(
            listening: listening, displayPath: boundPath, server: server, registry: registry, pool: pool,
            group: group, settings: settings, counters: counters, trustStore: store, trustEvaluator: evaluator, proxyPort: proxyPort,
            passedProxySockets: passedSockets.proxy, reloader: reloader, logger: logger
        )
        var configuration = ServiceGroupConfiguration(
            services: [.init(service: service)],
            gracefulShutdownSignals: [.sigterm, .sigint],
            logger: logger
        )
        configuration.maximumGracefulShutdownDuration = settings.daemon.shutdownGrace + .seconds(5)
        let serviceGroup = ServiceGroup(configuration: configuration)
        logger.info(
            "starting",
            metadata: [
                "version": "\(AuthBrokerVersion.current)", "config": "\(configFile)",
                "config_loaded": "\(loaded != nil)", "state": "\(stateDirectory)",
                "system_anchors": "\(evaluator.systemAnchorCount)", "io_threads": "\(settings.daemon.ioThreadCount)",
            ]
        )
        let outcome: Result<Void, any Error>
        do {
            try await serviceGroup.run()
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        // The service has closed its listener, client connections and pool; this ends the threads.
        try? await group.shutdownGracefully()
        // Written in batches off the request threads: what is still queued goes to disk now.
        audit.flush()
        keyLog?.flush()
        vault.flushMarks()
        if case .failure(let error) = outcome {
            throw StartupError(description: "authbrokerd: \(error)", exitCode: 1)
        }
    }

    /// The Public Suffix List at `path`; without it (not installed, unreadable) only the list's
    /// default rule applies, and a warning says how to get the rest.
    static func loadPublicSuffixList(path: String, logger: Logger) -> PublicSuffixList {
        guard let handle = FileHandle(forReadingAtPath: path) else {
            logger.warning(
                "no Public Suffix List; only wildcards over a single label (*.com) are refused as trust scopes",
                metadata: ["path": "\(path)", "fix": "install Debian's publicsuffix package, or set [trust] public_suffix_list"]
            )
            return .defaultRuleOnly
        }
        defer { try? handle.close() }
        let data = (try? handle.read(upToCount: PublicSuffixList.maxBytes + 1)) ?? nil
        guard let data, data.count <= PublicSuffixList.maxBytes else {
            logger.warning("the Public Suffix List cannot be read, or is too large to be one; using its default rule only", metadata: ["path": "\(path)"])
            return .defaultRuleOnly
        }
        let list = PublicSuffixList(parsing: Substring(String(decoding: data, as: UTF8.self)))
        logger.debug("public suffix list loaded", metadata: ["path": "\(path)", "rules": "\(list.ruleCount)"])
        return list
    }
}

/// The listener as a lifecycle service: accepts connections until graceful shutdown, then lets
/// in-flight requests finish for up to `shutdown_grace_seconds`.
struct BrokerService: Service, CustomStringConvertible {
    var description: String { "BrokerService(\(self.displayPath))" }

    let listening: ListeningSocket
    let displayPath: String
    let server: ClientConnectionServer
    let registry: ClientConnectionRegistry
    let pool: UpstreamPool<UpstreamConnection>
    let group: any EventLoopGroup
    let settings: BrokerSettings
    let counters: BrokerCounters
    let trustStore: TrustStore
    /// Reads the system bundle again when it changes (`TrustStoreWatch`).
    let trustEvaluator: TrustEvaluator
    /// Where the proxy port listens, once bound, for `status`.
    let proxyPort: ProxyPortAddresses
    /// The proxy port's sockets from systemd (`authbroker-proxy.socket`); they replace `[proxy] listen`.
    let passedProxySockets: [CInt]
    /// Run on `SIGHUP`.
    let reloader: RulesReloader
    let logger: Logger

    func run() async throws {
        let ownUID = getuid()
        let logger = self.logger
        let counters = self.counters
        let limits = self.settings.limits
        let maxConnections = limits.maxClientConnections
        let reservedConnections = limits.reservedControlConnections
        let registry = self.registry
        let bootstrap = ServerBootstrap(group: self.group)
            .serverChannelOption(.backlog, value: 256)
        // Shared by every connection's direct relay (the one place that knows challenged origins).
        let relay = DirectRelay(interceptor: self.server.interceptor, registry: self.registry, logger: self.logger)
        // Every listener's connections, each when its full path is first needed (or as it closes),
        // to be served in the task group below (`AcceptedClientConnection.configure`).
        let (toServe, toServeSink) = AsyncStream<AcceptedClientConnection>.makeStream()
        let serve: @Sendable (AcceptedClientConnection) -> Void = { connection in
            if case .terminated = toServeSink.yield(connection) {
                // Shutdown has stopped serving (the grace period is over, or the service was
                // cancelled): served all the same, outside the group, so that its async channel
                // is finished (NIO traps otherwise) and an exchange the relay handed over is
                // given back to the pool, whose shutdown waits for it.
                Task { [server = self.server] in await server.serve(connection) }
            }
        }
        /// A connection of the user's own: past the connection limit, or set up and registered.
        let admit: @Sendable (any Channel, ConnectionPeer, Bool) throws -> AcceptedClientConnection = { channel, peer, servesControlAPI in
            let credentials = peer.credentials
            // Past the limit, a few more are let in for /v1/ requests only (ClientConnectionTerms),
            // on the socket that serves them.
            let open = registry.count
            guard open < maxConnections + (servesControlAPI ? reservedConnections : 0) else {
                counters.clientConnectionsRefused.add(1)
                logger.warning(
                    "refused a connection: too many open client connections",
                    metadata: ["limit": "\(maxConnections)", "reserved": "\(reservedConnections)", "peer_pid": "\(credentials.pid)"]
                )
                throw PeerRejected(credentials: credentials)
            }
            counters.clientConnectionsAccepted.add(1)
            let terms = ClientConnectionTerms(limits: limits, controlOnly: open >= maxConnections)
            let pid = credentials.pid
            return try AcceptedClientConnection.configure(
                channel, relay: relay, peer: peer, terms: terms, servesControlAPI: servesControlAPI, serve: serve
            ) { deadline in
                counters.clientConnectionsTimedOut.add(1)
                if deadline == .head {
                    logger.notice("closed a client connection: request head not complete in time", metadata: ["peer_pid": "\(pid)"])
                } else {
                    logger.debug("closed an idle client connection", metadata: ["peer_pid": "\(pid)"])
                }
            }
        }
        let initializer: @Sendable (any Channel) -> EventLoopFuture<AcceptedClientConnection> = { channel in
            // The peer's uid is checked before a single byte is read (SO_PEERCRED).
            channel.peerCredentials().flatMapThrowing { credentials in
                guard credentials.uid == ownUID else {
                    counters.clientConnectionsRefused.add(1)
                    logger.warning(
                        "refused a connection from another user",
                        metadata: ["peer_pid": "\(credentials.pid)", "peer_uid": "\(credentials.uid)"]
                    )
                    throw PeerRejected(credentials: credentials)
                }
                return try admit(channel, ConnectionPeer(credentials: credentials), true)
            }.closingOnFailure(channel)
        }

        // The proxy port first: a start-up that fails there has accepted nothing on the socket
        // (a connection accepted but never served traps in NIO's async channel).
        let proxyChannels = try await ProxyPort.bind(
            self.settings.proxy.listen, passed: self.passedProxySockets, uid: UInt32(ownUID), group: self.group, admit: admit,
            counters: counters, logger: logger
        )
        let serverChannel: NIOAsyncChannel<AcceptedClientConnection, Never>
        do {
            switch self.listening {
            case .systemd(let fd):
                serverChannel = try await bootstrap.bind(fd, childChannelInitializer: initializer)
            case .path(let path):
                let oldMask = umask(0o177)  // the socket file is created 0600
                defer { umask(oldMask) }
                do {
                    serverChannel = try await bootstrap.bind(unixDomainSocketPath: path, childChannelInitializer: initializer)
                } catch {
                    throw ListenerError(description: "cannot listen on \(path): \(ListenerError.reason(error)).")
                }
                chmod(path, 0o600)
            }
        } catch {
            for proxyChannel in proxyChannels { await proxyChannel.closeUnserved() }
            throw error
        }
        self.proxyPort.set(proxyChannels.compactMap { $0.channel.localAddress.flatMap(ProxyPort.describe) })

        let source: String = if case .systemd = self.listening { "systemd" } else { "bound" }
        let proxyAddresses = self.proxyPort.addresses
        let proxyDescription = proxyAddresses.isEmpty ? "off" : proxyAddresses.joined(separator: " ")
        logger.info("listening", metadata: ["socket": "\(self.displayPath)", "source": "\(source)", "proxy_port": "\(proxyDescription)"])
        _ = cab_sd_notify("READY=1\nSTATUS=Listening on \(self.displayPath), proxy port \(proxyDescription)")

        let graceSeconds = self.settings.daemon.shutdownGraceSeconds
        let executors = EventLoopTaskExecutor.executors(for: self.group)
        try await withGracefulShutdownHandler {
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask(executorPreference: globalConcurrentExecutor) {
                    await MemoryTrimmer.run { counters.requestsTotal.current + counters.clientConnectionsAccepted.current }
                }
                group.addTask(executorPreference: globalConcurrentExecutor) { [reloader = self.reloader] in
                    // SIGHUP: the rules of the config file again (a bad file changes nothing; the log says why).
                    for await _ in await UnixSignalsSequence(trapping: .sighup) {
                        _ = try? reloader.reload()
                    }
                }
                group.addTask(executorPreference: globalConcurrentExecutor) { [trustStore, trustEvaluator] in
                    await TrustStoreWatch.run(trustStore, evaluator: trustEvaluator, logger: logger)
                }
                let listeners = [serverChannel] + proxyChannels
                let listening = NIOLockedValueBox(listeners.count)
                for listener in listeners {
                    group.addTask {
                        // An accepted connection reaches `serve` itself, when it needs to.
                        try? await listener.executeThenClose { connections in
                            for try await _ in connections {}
                        }
                        guard listening.withLockedValue({ count in
                            count -= 1
                            return count == 0
                        }) else { return }
                        // Every listener closed: the remaining connections finish their current
                        // request. (Draining began already on SIGTERM; not when the listeners failed.)
                        registry.beginDraining()
                        let deadline = ContinuousClock.now + .milliseconds(Int64(graceSeconds * 1000))
                        await Self.waitForNoConnections(registry, until: deadline)
                        if registry.count > 0 {
                            logger.warning("grace period over; closing remaining client connections", metadata: ["open": "\(registry.count)"])
                            registry.closeAll()
                            // A closing connection hands itself to `serve` before it unregisters.
                            await Self.waitForNoConnections(registry, until: .now + .seconds(1))
                        }
                        toServeSink.finish()
                    }
                }
                for await connection in toServe {
                    // The connection's task runs on its channel's event loop (no thread hops).
                    if let executor = executors.executor(for: connection.connection.channel.eventLoop) {
                        group.addTask(executorPreference: executor) { await self.server.serve(connection) }
                    } else {
                        group.addTask { await self.server.serve(connection) }
                    }
                }
                group.cancelAll()
            }
        } onGracefulShutdown: {
            logger.info("stopping: no new connections; in-flight requests may finish", metadata: ["grace_seconds": "\(graceSeconds)"])
            _ = cab_sd_notify("STOPPING=1\nSTATUS=Stopping")
            registry.beginDraining()
            serverChannel.channel.close(promise: nil)
            for proxyChannel in proxyChannels { proxyChannel.channel.close(promise: nil) }
        }
        await self.pool.shutdown()
        if case .path(let path) = self.listening {
            unlink(path)
        }
        logger.info("stopped")
    }

    private static func waitForNoConnections(_ registry: ClientConnectionRegistry, until deadline: ContinuousClock.Instant) async {
        while registry.count > 0, ContinuousClock.now < deadline, !Task.isCancelled {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}
