import Foundation
import NIOCore

/// A log level as the configuration names it; the raw value is the word in the file.
///
/// The same seven levels as swift-log's `Logger.Level`, so the daemon maps them one to one.
package enum LogLevelName: String, Sendable, Equatable, CaseIterable {
    case trace, debug, info, notice, warning, error, critical
}

/// Every setting of `authbrokerd`, read from `config.toml` (see `etc/authbroker/config.toml`).
///
/// Missing settings keep their defaults, so an empty or absent file is a valid configuration.
/// Parsing is strict: an unknown table or key, a wrong type or an out-of-range number is a
/// `ConfigError` naming the line, rather than a silently ignored typo.
package struct BrokerSettings: Sendable, Equatable {
    /// `[daemon]`: the process itself.
    package struct Daemon: Sendable, Equatable {
        /// `socket_path`: where to listen; nil means the XDG default (`BrokerPaths.socketPath`).
        package var socketPath: String? = nil
        /// `log_level`.
        package var logLevel: LogLevelName = .info
        /// `shutdown_grace_seconds`: how long in-flight requests may run after SIGTERM.
        package var shutdownGraceSeconds: Double = 10
        /// `state_dir`: where state lives; nil means the XDG default (`BrokerPaths.stateDirectory`).
        package var stateDirectory: String? = nil
        /// `io_threads`: event loop threads for client and upstream sockets; 0 means one per CPU
        /// core. One by default: a per-user daemon serves one user's apps, and on one loop every
        /// request can reuse every pooled upstream connection (the pool keeps connections loop-local)
        /// and the daemon wakes less often.
        package var ioThreads: Int = 1

        package init() {}

        /// `ioThreads` with 0 resolved to the number of CPU cores.
        package var ioThreadCount: Int { ioThreads > 0 ? ioThreads : System.coreCount }

        /// `shutdownGraceSeconds` as a `Duration`, for the service group's shutdown bound.
        package var shutdownGrace: Duration { .milliseconds(Int64((shutdownGraceSeconds * 1000).rounded())) }
    }

    /// `[trust]`: server-trust evaluation.
    package struct Trust: Sendable, Equatable {
        /// `system_anchors`: the PEM bundle of system trust anchors.
        package var systemAnchorsPath: String = "/etc/ssl/certs/ca-certificates.crt"
        /// `decision_cache_size`: trust decisions kept per (chain, host); 0 disables the cache.
        package var decisionCacheSize: Int = 1024
        /// `decision_cache_seconds`: how long a cached decision stays valid.
        package var decisionCacheSeconds: Int = 300
        /// `public_suffix_list`: the Public Suffix List; wildcard host patterns that cover a
        /// public suffix (`*.co.uk`) are refused for anchors, identities and exceptions.
        package var publicSuffixListPath: String = PublicSuffixList.debianPath

        package init() {}
    }

    /// `[upstream]`: connections to origin servers.
    package struct Upstream: Sendable, Equatable {
        /// `connect_timeout_ms`: TCP connect, per address tried.
        package var connectTimeoutMilliseconds: Int = 10_000
        /// `tls_handshake_timeout_ms`: the TLS handshake, including the trust decision.
        package var tlsHandshakeTimeoutMilliseconds: Int = 10_000
        /// `response_head_timeout_ms`: from the end of the request to the response head.
        package var responseHeadTimeoutMilliseconds: Int = 60_000
        /// `idle_timeout_ms`: an active exchange with no bytes either way for this long fails.
        package var idleTimeoutMilliseconds: Int = 60_000
        /// `pool_idle_timeout_ms`: a kept-alive connection unused for this long is closed.
        package var poolIdleTimeoutMilliseconds: Int = 30_000
        /// `max_connections_per_origin`. 32: at 32 concurrent requests to one origin, 8 (the old
        /// default) left most requests waiting for a connection, off the direct relay, at about
        /// twice the CPU per request (bench-results/NOTES.md).
        package var maxConnectionsPerOrigin: Int = 32
        /// `max_idle_connections_per_origin`: at most `maxConnectionsPerOrigin`; 0 disables reuse.
        /// Unset, it follows `maxConnectionsPerOrigin`: the pool keeps what recent demand opened,
        /// and `pool_idle_timeout_ms` closes what demand no longer uses.
        package var maxIdleConnectionsPerOrigin: Int = 32
        /// `max_pending_requests_per_origin`: requests waiting for a connection; more fail at once.
        package var maxPendingRequestsPerOrigin: Int = 256
        /// `resolve`: curl `--resolve` style pins of host:port to an address.
        package var resolve: [ResolveOverride] = []
        /// `proxy`: the HTTP proxy upstream connections go through (`http://host:port`); nil: direct.
        package var proxy: CanonicalOrigin? = nil
        /// `no_proxy`: hosts reached directly even when `proxy` is set.
        package var noProxy: [HostPattern] = []

        package init() {}

        /// `[[route]]`: hosts reached over a Unix socket instead of TCP (never through `proxy`).
        /// The daemon reads them from `BrokerRules`, which a reload replaces.
        package var routes: [UnixRoute] = []

        /// The proxy a connection to `origin` goes through: `proxy`, unless a `no_proxy` pattern
        /// names the origin's host.
        package func proxy(for origin: CanonicalOrigin) -> CanonicalOrigin? {
            guard let proxy, !noProxy.contains(where: { $0.matches(origin.host) }) else { return nil }
            return proxy
        }

        package var connectTimeout: TimeAmount { .milliseconds(Int64(connectTimeoutMilliseconds)) }
        package var tlsHandshakeTimeout: TimeAmount { .milliseconds(Int64(tlsHandshakeTimeoutMilliseconds)) }
        package var responseHeadTimeout: TimeAmount { .milliseconds(Int64(responseHeadTimeoutMilliseconds)) }
        package var idleTimeout: TimeAmount { .milliseconds(Int64(idleTimeoutMilliseconds)) }
        package var poolIdleTimeout: TimeAmount { .milliseconds(Int64(poolIdleTimeoutMilliseconds)) }

        /// The pinned address for `host:port`, if a `resolve` entry names it (first match wins).
        package func resolveOverride(host: String, port: Int) -> ResolveOverride? {
            resolve.first { $0.matches(host: host, port: port) }
        }
    }

    /// `[limits]`: bounds on what one peer can make the daemon hold.
    package struct Limits: Sendable, Equatable {
        /// `max_request_head_bytes`: request line plus header fields from a client.
        package var maxRequestHeadBytes: Int = 65_536
        /// `max_response_head_bytes`: status line plus header fields from an origin.
        package var maxResponseHeadBytes: Int = 65_536
        /// `request_body_buffer_bytes`: bound on buffering a request body to replay it after a
        /// 401; a longer body streams and its 401 goes to the app.
        package var requestBodyBufferBytes: Int = 1_048_576
        /// `max_client_connections`: open connections on the daemon's socket.
        package var maxClientConnections: Int = 256
        /// `reserved_control_connections`: connections accepted beyond `max_client_connections`
        /// for `/v1/` control requests only, so `authbrokerctl` answers while apps hold the rest.
        package var reservedControlConnections: Int = 8
        /// `request_head_timeout_ms`: from a request's first byte until its head is complete.
        package var requestHeadTimeoutMilliseconds: Int = 20_000
        /// `client_idle_timeout_ms`: how long a client connection may wait between requests.
        package var clientIdleTimeoutMilliseconds: Int = 120_000
        /// `tunnel_idle_timeout_ms`: a CONNECT tunnel with no byte either way for this long is
        /// closed. Longer than between requests: a tunnel idles inside a program's own
        /// keep-alive (Squid's `read_timeout` is the same 15 minutes).
        package var tunnelIdleTimeoutMilliseconds: Int = 900_000
        /// `max_auth_spaces`: protection spaces (origin, realm, scheme) the daemon remembers for
        /// preemptive answers and Digest sessions, per table; the least recently used go first.
        package var maxAuthSpaces: Int = 4096
        /// `agent_event_buffer`: events queued for an agent that is not reading; past it the
        /// agent is detached as if it had gone away, and must reattach.
        package var agentEventBuffer: Int = 1024

        package init() {}
    }

    /// `[security]`: re-authentication before a secret is revealed.
    package struct Security: Sendable, Equatable {
        /// `reauth_grant_seconds`: how long a process may reveal secrets after the user's password.
        package var reauthGrantSeconds: Int = 300
        /// `pam_service`: the PAM service (`/etc/pam.d/<name>`).
        package var pamService: String = "authbroker"
        /// `pam_config_dir`: read the PAM service from this directory instead of `/etc/pam.d`
        /// (for tests; it can only weaken the check of the user's own secrets).
        package var pamConfigDirectory: String? = nil

        package init() {}
    }

    /// `[proxy]`: the loopback proxy port, for programs that honour `http_proxy`.
    package struct Proxy: Sendable, Equatable {
        /// `listen`: the addresses of the proxy port. nil (unset): 127.0.0.1 at the user's own
        /// port (`ProxyListenAddress.userDefault`), or any free port when that one is taken;
        /// empty: no proxy port.
        package var listen: [ProxyListenAddress]? = nil
        /// `intercept` and `tunnel`: which CONNECTs are intercepted beyond the hosts the user
        /// holds something for, and which never are.
        package var interception = InterceptPolicy()

        package init() {}
    }

    /// `[debug]`: aids for looking at the broker's own traffic.
    package struct Debug: Sendable, Equatable {
        /// `tls_key_log`: a file the keys of every upstream TLS connection are appended to, in
        /// the NSS key log format Wireshark reads; nil (the default): none.
        package var tlsKeyLogPath: String? = nil
        /// `tls_key_log_scope`: whose keys: every upstream connection's (`all`), or only those of
        /// requests sent with `Authbroker-Debug: keylog` (`marked`).
        package var tlsKeyLogScope: KeyLogScope = .all

        package enum KeyLogScope: String, Sendable, Equatable {
            case all, marked
        }

        package init() {}
    }

    /// `[flows]`: the flow log `authbrokerctl flows` shows.
    package struct Flows: Sendable, Equatable {
        /// `keep`: how many recent flows the daemon keeps in memory; 0 turns the flow log off.
        package var keep = 500
        /// `record`: from the daemon's start (`always`), or from the first time someone asks for
        /// the flows (`on_demand`): until then no request pays for being recorded, and no app's
        /// header values sit in the daemon's memory.
        package var record: Recording = .onDemand

        package enum Recording: String, Sendable, Equatable {
            case always
            case onDemand = "on_demand"
        }
        /// `bodies`: keep request and response bodies too (their first `max_body_bytes`).
        package var bodies = false
        /// `max_body_bytes`: how much of each body is kept when `bodies` is on.
        package var maxBodyBytes = 64 * 1024
        /// `mask_headers`: header fields masked besides Authorization, Proxy-Authorization,
        /// Cookie and Set-Cookie (which always are).
        package var maskHeaders: [String] = []

        /// The most all kept flows may hold (headers, URLs, bodies); the oldest go first.
        package static let maxHeldBytes = 64 << 20

        package init() {}
    }

    /// `[cache]`: the HTTP cache (RFC 9111) every app of the user shares.
    package struct Cache: Sendable, Equatable {
        /// `enabled`: off by default. A cache changes what apps see (a stored response instead
        /// of the origin's latest), and it keeps the user's responses on disk; both are the
        /// user's choice to make.
        package var enabled = false
        /// `max_size_mb`: the most the stored responses may take on disk, in MiB; the least
        /// recently used go first.
        package var maxSizeMegabytes = 1024
        /// `hosts`: the origins cached (host patterns as for anchors); empty: all.
        package var hosts: [HostPattern] = []
        /// `directory`: where entries live; nil: `BrokerPaths.cacheDirectory`.
        package var directory: String? = nil

        package var maxBytes: Int64 { Int64(self.maxSizeMegabytes) << 20 }

        /// What the storage policy needs of these settings. One response may fill the cache.
        package var policy: CachePolicy.Settings {
            var policy = CachePolicy.Settings()
            policy.enabled = self.enabled
            policy.hosts = self.hosts
            policy.maxObjectBytes = Int(clamping: self.maxBytes)
            return policy
        }

        package init() {}
    }

    /// `[kerberos]`: where the broker answers Negotiate (SPNEGO, RFC 4559) with the user's
    /// Kerberos tickets. Nothing is sent anywhere until the user names hosts: a ticket proves
    /// who the user is to whoever receives it.
    package struct Kerberos: Sendable, Equatable {
        /// `hosts`: origins that get a service ticket (host patterns as for anchors); empty: none.
        package var hosts: [HostPattern] = []
        /// `proxy`: whether the configured upstream proxy gets one when it asks (407).
        package var proxy = false
        /// `delegate_hosts`: origins that also get the user's forwardable ticket (delegation);
        /// empty: none. Only hosts that get a ticket at all.
        package var delegateHosts: [HostPattern] = []
        /// `cname_lookup`: the service name uses the host's canonical name from a forward DNS
        /// look-up, as browsers do by default; never a reverse look-up.
        package var cnameLookup = true
        /// `kdc_timeout_ms`: how long a request waits for the KDC (a service ticket) at most.
        package var kdcTimeoutMilliseconds = 10_000

        package var kdcTimeout: Duration { .milliseconds(self.kdcTimeoutMilliseconds) }

        package init() {}
    }

    package var daemon = Daemon()
    package var cache = Cache()
    package var kerberos = Kerberos()
    package var proxy = Proxy()
    package var debug = Debug()
    package var flows = Flows()
    package var trust = Trust()
    package var upstream = Upstream()
    package var limits = Limits()
    package var security = Security()
    package var secrets = Secrets()
    /// `[[respond]]` rules, in file order.
    package var responses: [CannedResponse] = []
    /// `[[rewrite]]` rules, in file order.
    package var rewrites: [RewriteRule] = []

    /// `[secrets]`: where passwords and identity keys are kept.
    package struct Secrets: Sendable, Equatable {
        /// `store`: "auto" (the Secret Service when one answers on the session bus, else the
        /// encrypted file), "secret-service" or "file".
        package var store: String = "auto"

        package init() {}
    }

    /// Every setting at its default.
    package init() {}

    /// Every setting at its default: what an absent or empty file means.
    package static let defaults = BrokerSettings()

    /// The tables and keys the file may contain, in the order the sample documents them.
    package static let knownKeys: KeyValuePairs<String, [String]> = [
        "daemon": ["socket_path", "log_level", "shutdown_grace_seconds", "state_dir", "io_threads"],
        "trust": ["system_anchors", "decision_cache_size", "decision_cache_seconds", "public_suffix_list"],
        "upstream": [
            "connect_timeout_ms", "tls_handshake_timeout_ms", "response_head_timeout_ms", "idle_timeout_ms",
            "pool_idle_timeout_ms", "max_connections_per_origin", "max_idle_connections_per_origin",
            "max_pending_requests_per_origin", "resolve", "proxy", "no_proxy",
        ],
        "limits": [
            "max_request_head_bytes", "max_response_head_bytes", "request_body_buffer_bytes", "max_client_connections",
            "reserved_control_connections", "request_head_timeout_ms", "client_idle_timeout_ms", "tunnel_idle_timeout_ms",
            "max_auth_spaces",
            "agent_event_buffer",
        ],
        "proxy": ["listen", "intercept", "tunnel"],
        "security": ["reauth_grant_seconds", "pam_service", "pam_config_dir"],
        "secrets": ["store"],
        "debug": ["tls_key_log", "tls_key_log_scope"],
        "flows": ["keep", "record", "bodies", "max_body_bytes", "mask_headers"],
        "cache": ["enabled", "max_size_mb", "hosts", "directory"],
        "kerberos": ["hosts", "proxy", "delegate_hosts", "cname_lookup", "kdc_timeout_ms"],
    ]

    /// The arrays of tables the file may contain (`[[route]]`), and their keys.
    package static let knownArrayTables: KeyValuePairs<String, [String]> = [
        "route": ["host", "unix"],
        "respond": ["method", "scheme", "host", "path", "status", "headers", "body", "file"],
        "rewrite": [
            "method", "scheme", "host", "path", "to", "connect_to", "set_request_headers", "remove_request_headers",
            "set_response_headers", "remove_response_headers",
        ],
    ]

    /// The longest Unix socket path Linux accepts: `sun_path` is 108 bytes with the NUL.
    package static let maxSocketPathBytes = 107

    // MARK: Parsing

    /// Reads settings from the text of a configuration file.
    ///
    /// - Parameter file: the file's path, used only in error messages.
    /// - Throws: the first problem in line order: syntax, then unknown or misplaced tables and
    ///   keys (with the nearest known name), then wrong types and out-of-range values.
    package static func parse(_ text: String, file: String) throws(ConfigError) -> BrokerSettings {
        let document: TOMLDocument
        do {
            document = try TOMLSubset.parse(text)
        } catch {
            throw ConfigError(
                error.code == .inputTooLarge ? .tooLarge : .syntax,
                file: file, line: error.line, message: error.message
            )
        }
        try checkNames(document, file: file)

        var settings = BrokerSettings()
        let hour = 3_600_000
        let milliseconds = ValueUnit(expected: "an integer number of milliseconds", plural: "milliseconds")
        let seconds = ValueUnit(expected: "an integer number of seconds", plural: "seconds")
        let count = ValueUnit(expected: "an integer count", plural: "")
        let bytes = ValueUnit(expected: "an integer number of bytes", plural: "bytes")

        let daemon = TableReader(file: file, table: "daemon", document: document)
        if let value = try daemon.path("socket_path", maxBytes: maxSocketPathBytes) { settings.daemon.socketPath = value }
        if let value = try daemon.logLevel("log_level") { settings.daemon.logLevel = value }
        if let value = try daemon.seconds("shutdown_grace_seconds", in: 0...3600) {
            settings.daemon.shutdownGraceSeconds = value
        }
        if let value = try daemon.path("state_dir") { settings.daemon.stateDirectory = value }
        if let value = try daemon.integer("io_threads", in: 0...64, unit: count, note: " (0 means one per CPU core)") {
            settings.daemon.ioThreads = value
        }

        let trust = TableReader(file: file, table: "trust", document: document)
        if let value = try trust.path("system_anchors") { settings.trust.systemAnchorsPath = value }
        if let value = try trust.path("public_suffix_list") { settings.trust.publicSuffixListPath = value }
        if let value = try trust.integer("decision_cache_size", in: 0...1_000_000, unit: count, note: " (0 disables the cache)") {
            settings.trust.decisionCacheSize = value
        }
        if let value = try trust.integer(
            "decision_cache_seconds", in: 1...86_400, unit: seconds,
            note: " (up to one day; set decision_cache_size = 0 to disable caching)"
        ) {
            settings.trust.decisionCacheSeconds = value
        }

        let upstream = TableReader(file: file, table: "upstream", document: document)
        let timeoutNote = " (1 ms to 1 hour)"
        if let value = try upstream.integer("connect_timeout_ms", in: 1...hour, unit: milliseconds, note: timeoutNote) {
            settings.upstream.connectTimeoutMilliseconds = value
        }
        if let value = try upstream.integer("tls_handshake_timeout_ms", in: 1...hour, unit: milliseconds, note: timeoutNote) {
            settings.upstream.tlsHandshakeTimeoutMilliseconds = value
        }
        if let value = try upstream.integer("response_head_timeout_ms", in: 1...hour, unit: milliseconds, note: timeoutNote) {
            settings.upstream.responseHeadTimeoutMilliseconds = value
        }
        if let value = try upstream.integer("idle_timeout_ms", in: 1...hour, unit: milliseconds, note: timeoutNote) {
            settings.upstream.idleTimeoutMilliseconds = value
        }
        if let value = try upstream.integer("pool_idle_timeout_ms", in: 1...hour, unit: milliseconds, note: timeoutNote) {
            settings.upstream.poolIdleTimeoutMilliseconds = value
        }
        if let value = try upstream.integer("max_connections_per_origin", in: 1...1024, unit: count) {
            settings.upstream.maxConnectionsPerOrigin = value
        }
        if let value = try upstream.integer(
            "max_idle_connections_per_origin", in: 0...1024, unit: count, note: " (0 closes each connection after use)"
        ) {
            settings.upstream.maxIdleConnectionsPerOrigin = value
        } else {
            settings.upstream.maxIdleConnectionsPerOrigin = settings.upstream.maxConnectionsPerOrigin
        }
        if let value = try upstream.integer("max_pending_requests_per_origin", in: 1...65_536, unit: count) {
            settings.upstream.maxPendingRequestsPerOrigin = value
        }
        if let value = try upstream.resolveOverrides("resolve") { settings.upstream.resolve = value }
        if let value = try upstream.proxyOrigin("proxy") { settings.upstream.proxy = value }
        if let value = try upstream.hostPatterns("no_proxy") { settings.upstream.noProxy = value }
        if settings.upstream.maxIdleConnectionsPerOrigin > settings.upstream.maxConnectionsPerOrigin {
            let key =
                document.line(of: "max_idle_connections_per_origin", in: "upstream") != nil
                ? "max_idle_connections_per_origin" : "max_connections_per_origin"
            throw upstream.error(
                key, .outOfRange,
                "max_idle_connections_per_origin (\(settings.upstream.maxIdleConnectionsPerOrigin)) must not exceed "
                    + "max_connections_per_origin (\(settings.upstream.maxConnectionsPerOrigin)); "
                    + "lower the first or raise the second"
            )
        }

        let limits = TableReader(file: file, table: "limits", document: document)
        if let value = try limits.integer("max_request_head_bytes", in: 1024...1_048_576, unit: bytes, note: " (1 KiB to 1 MiB)") {
            settings.limits.maxRequestHeadBytes = value
        }
        if let value = try limits.integer("max_response_head_bytes", in: 1024...1_048_576, unit: bytes, note: " (1 KiB to 1 MiB)") {
            settings.limits.maxResponseHeadBytes = value
        }
        if let value = try limits.integer(
            "request_body_buffer_bytes", in: 1...268_435_456, unit: bytes, note: " (up to 256 MiB)"
        ) {
            settings.limits.requestBodyBufferBytes = value
        }
        if let value = try limits.integer("max_client_connections", in: 1...65_536, unit: count) {
            settings.limits.maxClientConnections = value
        }
        if let value = try limits.integer("reserved_control_connections", in: 0...1024, unit: count) {
            settings.limits.reservedControlConnections = value
        }
        if let value = try limits.integer("request_head_timeout_ms", in: 1...hour, unit: milliseconds, note: timeoutNote) {
            settings.limits.requestHeadTimeoutMilliseconds = value
        }
        if let value = try limits.integer("client_idle_timeout_ms", in: 1...(24 * hour), unit: milliseconds, note: " (1 ms to 24 hours)") {
            settings.limits.clientIdleTimeoutMilliseconds = value
        }
        if let value = try limits.integer("tunnel_idle_timeout_ms", in: 1...(24 * hour), unit: milliseconds, note: " (1 ms to 24 hours)") {
            settings.limits.tunnelIdleTimeoutMilliseconds = value
        }
        if let value = try limits.integer("max_auth_spaces", in: 16...1_048_576, unit: count) {
            settings.limits.maxAuthSpaces = value
        }
        if let value = try limits.integer("agent_event_buffer", in: 16...1_048_576, unit: count) {
            settings.limits.agentEventBuffer = value
        }

        let debug = TableReader(file: file, table: "debug", document: document)
        if let value = try debug.path("tls_key_log") { settings.debug.tlsKeyLogPath = value }
        if let value = try debug.string("tls_key_log_scope", expected: "\"all\" or \"marked\"") {
            guard let scope = Debug.KeyLogScope(rawValue: value) else {
                throw debug.error(
                    "tls_key_log_scope", .invalidValue,
                    "use \"all\" (every upstream connection) or \"marked\" (requests sent with Authbroker-Debug: keylog), not \"\(TOMLValue.escapedForMessage(value))\""
                )
            }
            settings.debug.tlsKeyLogScope = scope
        }

        let cache = TableReader(file: file, table: "cache", document: document)
        if let value = try cache.boolean("enabled") { settings.cache.enabled = value }
        if let value = try cache.integer(
            "max_size_mb", in: 1...(1 << 24), unit: ValueUnit(expected: "an integer number of MiB", plural: "MiB")
        ) {
            settings.cache.maxSizeMegabytes = value
        }
        if let value = try cache.hostPatterns("hosts") { settings.cache.hosts = value }
        if let value = try cache.path("directory") { settings.cache.directory = value }

        let kerberos = TableReader(file: file, table: "kerberos", document: document)
        if let value = try kerberos.hostPatterns("hosts") { settings.kerberos.hosts = value }
        if let value = try kerberos.boolean("proxy") { settings.kerberos.proxy = value }
        if let value = try kerberos.hostPatterns("delegate_hosts") { settings.kerberos.delegateHosts = value }
        if let value = try kerberos.boolean("cname_lookup") { settings.kerberos.cnameLookup = value }
        if let value = try kerberos.integer("kdc_timeout_ms", in: 100...120_000, unit: milliseconds) {
            settings.kerberos.kdcTimeoutMilliseconds = value
        }

        let flows = TableReader(file: file, table: "flows", document: document)
        if let value = try flows.integer("keep", in: 0...100_000, unit: count, note: " (0 turns the flow log off)") {
            settings.flows.keep = value
        }
        if let value = try flows.string("record", expected: "\"on_demand\" or \"always\"") {
            guard let recording = Flows.Recording(rawValue: value) else {
                throw flows.error(
                    "record", .invalidValue,
                    "use \"on_demand\" (from the first `authbrokerctl flows`) or \"always\" (from the daemon's start), not \"\(TOMLValue.escapedForMessage(value))\""
                )
            }
            settings.flows.record = recording
        }
        if let value = try flows.boolean("bodies") { settings.flows.bodies = value }
        if let value = try flows.integer(
            "max_body_bytes", in: 1...(16 << 20), unit: ValueUnit(expected: "an integer number of bytes", plural: "bytes")
        ) {
            settings.flows.maxBodyBytes = value
        }
        settings.flows.maskHeaders = try flows.stringArray("mask_headers", expected: "an array of header field names, like [\"X-Api-Key\"]")
        for (offset, name) in settings.flows.maskHeaders.enumerated() where name.isEmpty || !name.utf8.allSatisfy(HTTPSyntax.isTChar) {
            throw flows.error(
                "mask_headers", .invalidValue,
                "entry \(offset + 1): \"\(TOMLValue.escapedForMessage(String(name.prefix(60))))\" is not a header field name; write names like \"X-Api-Key\""
            )
        }

        let proxy = TableReader(file: file, table: "proxy", document: document)
        if let value = try proxy.listenAddresses("listen") { settings.proxy.listen = value }
        if let value = try proxy.interceptHosts("intercept") { settings.proxy.interception.intercept = value }
        if let value = try proxy.hostPatterns("tunnel") { settings.proxy.interception.tunnel = value }

        for entry in document.arrayTables["route"] ?? [] {
            let route = TableReader(file: file, table: "route", values: entry.values, lines: entry.keyLines)
            guard let host = try route.hostPattern("host") else {
                throw ConfigError(.invalidValue, file: file, line: entry.headerLine, message: "this [[route]] has no host; write host = \"docker.local\" under it")
            }
            guard let path = try route.path("unix", maxBytes: maxSocketPathBytes) else {
                throw ConfigError(
                    .invalidValue, file: file, line: entry.headerLine,
                    message: "this [[route]] has no unix socket; write unix = \"/run/docker.sock\" under it"
                )
            }
            if let earlier = settings.upstream.routes.first(where: { $0.host == host }) {
                throw route.error("host", .invalidValue, "\(host) is already routed to \(earlier.socketPath); keep one [[route]] per host")
            }
            settings.upstream.routes.append(UnixRoute(host: host, socketPath: path))
        }

        for entry in document.arrayTables["respond"] ?? [] {
            settings.responses.append(try Self.cannedResponse(entry, file: file))
        }
        for entry in document.arrayTables["rewrite"] ?? [] {
            settings.rewrites.append(try Self.rewriteRule(entry, file: file))
        }

        let security = TableReader(file: file, table: "security", document: document)
        if let value = try security.integer("reauth_grant_seconds", in: 1...86_400, unit: seconds, note: " (1 to 86400)") {
            settings.security.reauthGrantSeconds = value
        }
        if let value = try security.string("pam_service", expected: "a PAM service name, like \"authbroker\"") {
            guard !value.isEmpty, value.count <= 64, !value.contains("/") else {
                throw security.error("pam_service", .invalidValue, "a PAM service name is a file name in /etc/pam.d: no '/', 1 to 64 characters")
            }
            settings.security.pamService = value
        }
        if let value = try security.path("pam_config_dir") { settings.security.pamConfigDirectory = value }

        let secrets = TableReader(file: file, table: "secrets", document: document)
        if let value = try secrets.string("store", expected: "\"auto\", \"secret-service\" or \"file\"") {
            guard ["auto", "secret-service", "file"].contains(value) else {
                throw secrets.error("store", .invalidValue, "use \"auto\", \"secret-service\" or \"file\", not \"\(TOMLValue.escapedForMessage(value))\"")
            }
            settings.secrets.store = value
        }
        return settings
    }

    /// The request match of a `[[respond]]` or `[[rewrite]]` entry.
    private static func requestMatch(_ rule: TableReader, headerLine: Int, file: String) throws(ConfigError) -> RequestMatch {
        guard let host = try rule.hostPattern("host") else {
            throw ConfigError(
                .invalidValue, file: file, line: headerLine, message: "this [[\(rule.table)]] has no host; write host = \"api.example.test\" under it"
            )
        }
        var match = RequestMatch(host: host)
        if let method = try rule.string("method", expected: "a method as a quoted string, like \"GET\"") {
            guard !method.isEmpty, method.utf8.allSatisfy(HTTPSyntax.isTChar) else {
                throw rule.error("method", .invalidValue, "\"\(TOMLValue.escapedForMessage(method))\" is not a method; write one like \"GET\" (case matters)")
            }
            match.method = method
        }
        if let scheme = try rule.string("scheme", expected: "\"http\" or \"https\"") {
            guard let parsed = UpstreamScheme(rawValue: scheme) else {
                throw rule.error("scheme", .invalidValue, "write \"http\" or \"https\", or leave it out for both")
            }
            match.scheme = parsed
        }
        if let path = try rule.string("path", expected: "a path prefix as a quoted string, like \"/v1/\"") {
            match.pathPrefix = try Self.pathPrefix(path, rule: rule, key: "path")
        }
        return match
    }

    private static func pathPrefix(_ path: String, rule: TableReader, key: String) throws(ConfigError) -> String {
        guard path.hasPrefix("/"), !path.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7F }) else {
            throw rule.error(key, .invalidValue, "a path prefix starts with / and has no spaces or control characters, like \"/v1/status\"")
        }
        return path
    }

    /// "Name: value" entries.
    private static func fields(_ rule: TableReader, _ key: String) throws(ConfigError) -> [CannedResponse.Field] {
        var fields: [CannedResponse.Field] = []
        for (offset, text) in try rule.stringArray(key, expected: "an array of \"Name: value\" strings").enumerated() {
            switch CannedResponse.parseField(text) {
            case .success(let field): fields.append(field)
            case .failure(let error): throw rule.error(key, .invalidValue, "entry \(offset + 1): \(error.message)")
            }
        }
        return fields
    }

    /// One `[[rewrite]]` entry.
    private static func rewriteRule(_ entry: TOMLDocument.ArrayTableEntry, file: String) throws(ConfigError) -> RewriteRule {
        let reader = TableReader(file: file, table: "rewrite", values: entry.values, lines: entry.keyLines)
        var rule = RewriteRule(match: try Self.requestMatch(reader, headerLine: entry.headerLine, file: file), line: entry.headerLine)
        let to = try reader.string("to", expected: "a URL as a quoted string, like \"https://staging.example.test/v2/\"")
        let connectTo = try reader.string("connect_to", expected: "a host:port as a quoted string, like \"10.0.0.7:8443\"")
        switch (to, connectTo) {
        case (_?, _?):
            throw reader.error("connect_to", .invalidValue, "a [[rewrite]] takes to or connect_to, not both; keep one")
        case (let url?, nil):
            guard case .success(.absolute(let origin, let path)) = RequestTarget.parse(method: "GET", uri: url) else {
                throw reader.error("to", .invalidValue, "\"\(TOMLValue.escapedForMessage(url))\" is not an http:// or https:// URL; write one like \"https://staging.example.test/v2/\"")
            }
            rule.target = .url(origin, path: path)
        case (nil, let authority?):
            guard case .success(.authority(let host, let port)) = RequestTarget.parse(method: "CONNECT", uri: authority) else {
                throw reader.error("connect_to", .invalidValue, "\"\(TOMLValue.escapedForMessage(authority))\" is not host:port; write one like \"10.0.0.7:8443\" or \"[::1]:8443\"")
            }
            guard rule.match.isHostOnly else {
                throw reader.error("connect_to", .invalidValue, "connect_to changes where a host's connections go, so its [[rewrite]] may name no method or path; use to for one path")
            }
            rule.target = .connectTo(host: host, port: port)
        case (nil, nil):
            break
        }
        rule.setRequestHeaders = try Self.fields(reader, "set_request_headers")
        rule.setResponseHeaders = try Self.fields(reader, "set_response_headers")
        for key in ["remove_request_headers", "remove_response_headers"] {
            var names: [String] = []
            for (offset, text) in try reader.stringArray(key, expected: "an array of header names, like [\"Cookie\"]").enumerated() {
                switch RewriteRule.removableName(text) {
                case .success(let name): names.append(name)
                case .failure(let error): throw reader.error(key, .invalidValue, "entry \(offset + 1): \(error.message)")
                }
            }
            if key == "remove_request_headers" { rule.removeRequestHeaders = names } else { rule.removeResponseHeaders = names }
        }
        return rule
    }

    /// One `[[respond]]` entry.
    private static func cannedResponse(_ entry: TOMLDocument.ArrayTableEntry, file: String) throws(ConfigError) -> CannedResponse {
        let rule = TableReader(file: file, table: "respond", values: entry.values, lines: entry.keyLines)
        var response = CannedResponse(match: try Self.requestMatch(rule, headerLine: entry.headerLine, file: file), line: entry.headerLine)
        if let status = try rule.integer("status", in: 200...599, unit: ValueUnit(expected: "an HTTP status code", plural: ""), note: " (a final status)") {
            response.status = status
        }
        response.headers = try Self.fields(rule, "headers")
        let inline = try rule.string("body", expected: "the body as a quoted string")
        let bodyFile = try rule.path("file")
        switch (inline, bodyFile) {
        case (_?, _?):
            throw rule.error("file", .invalidValue, "a [[respond]] takes body or file, not both; keep one")
        case (let text?, nil):
            guard text.utf8.count <= CannedResponse.maxBodyBytes else {
                throw rule.error("body", .outOfRange, "the body is \(text.utf8.count) bytes; at most \(CannedResponse.maxBodyBytes), or use file")
            }
            response.body = .inline(Array(text.utf8))
        case (nil, let path?):
            response.body = .file(path)
        case (nil, nil):
            break
        }
        return response
    }

    /// Rejects unknown tables, unknown keys and keys in the wrong place, earliest line first,
    /// suggesting the nearest known name.
    private static func checkNames(_ document: TOMLDocument, file: String) throws(ConfigError) {
        let known = Dictionary(uniqueKeysWithValues: knownKeys.map { ($0.key, $0.value) })
        let tableNames = knownKeys.map(\.key)
        let allKeys = knownKeys.flatMap(\.value)
        func homeTable(of key: String) -> String? { knownKeys.first { $0.value.contains(key) }?.key }
        /// The nearest key of any table, qualified: `upstream.resolve`.
        func nearestQualified(_ key: String) -> String? {
            guard let suggestion = nearest(key, in: allKeys), let table = homeTable(of: suggestion) else { return nil }
            return "\(table).\(suggestion)"
        }

        for (name, entries) in document.arrayTables {
            let line = entries.first?.headerLine
            guard let keys = knownArrayTables.first(where: { $0.key == name })?.value else {
                let hint = known[name] != nil ? "[\(name)] is a single table; write [\(name)]" : "the arrays of tables are " + knownArrayTables.map { "[[\($0.key)]]" }.joined(separator: ", ")
                throw ConfigError(.unknownTable, file: file, line: line, message: "unknown array of tables [[\(name)]]; \(hint)")
            }
            for entry in entries {
                for (key, keyLine) in entry.keyLines.sorted(by: { $0.value < $1.value }) where !keys.contains(key) {
                    var message = "unknown setting in [[\(name)]]"
                    if let suggestion = nearest(key, in: keys) {
                        message += "; did you mean \(suggestion)?"
                    } else {
                        message += "; [[\(name)]] accepts " + keys.joined(separator: ", ")
                    }
                    throw ConfigError(.unknownKey, file: file, line: keyLine, key: "\(name).\(key)", message: message)
                }
            }
        }
        if let (name, line) = document.tableLines.first(where: { table in knownArrayTables.contains { $0.key == table.key } }) {
            throw ConfigError(
                .unknownTable, file: file, line: line,
                message: "[\(name)] is an array of tables (there may be several); write [[\(name)]]"
            )
        }

        var entries: [(line: Int, table: String, key: String?)] = []
        for (table, line) in document.tableLines { entries.append((line, table, nil)) }
        for (table, lines) in document.keyLines {
            for (key, line) in lines { entries.append((line, table, key)) }
        }
        entries.sort { $0.line < $1.line }

        for entry in entries {
            guard let key = entry.key else {
                guard known[entry.table] == nil else { continue }
                var message = "unknown table [\(entry.table)]"
                if let suggestion = nearest(entry.table, in: tableNames) {
                    message += "; did you mean [\(suggestion)]?"
                } else {
                    message += "; the tables are " + tableNames.map { "[\($0)]" }.joined(separator: ", ")
                }
                throw ConfigError(.unknownTable, file: file, line: entry.line, message: message)
            }
            if entry.table.isEmpty {
                if let home = homeTable(of: key) {
                    throw ConfigError(
                        .misplacedKey, file: file, line: entry.line, key: key,
                        message: "settings must be inside a table; put this line under [\(home)]"
                    )
                }
                var message = "unknown setting outside any table"
                if let suggestion = nearestQualified(key) {
                    message += "; did you mean \(suggestion) (under [\(suggestion.prefix { $0 != "." })])?"
                } else {
                    message += "; settings go under " + tableNames.map { "[\($0)]" }.joined(separator: ", ")
                }
                throw ConfigError(.unknownKey, file: file, line: entry.line, key: key, message: message)
            }
            // Keys of unknown tables are reported through their table header, which comes first.
            guard let keys = known[entry.table], !keys.contains(key) else { continue }
            let qualified = "\(entry.table).\(key)"
            if let home = homeTable(of: key) {
                throw ConfigError(
                    .misplacedKey, file: file, line: entry.line, key: qualified,
                    message: "this setting belongs in [\(home)], not [\(entry.table)]; move it there"
                )
            }
            var message = "unknown setting"
            if let suggestion = nearest(key, in: keys) {
                message += "; did you mean \(suggestion)?"
            } else if let suggestion = nearestQualified(key) {
                message += "; did you mean \(suggestion)?"
            } else {
                message += "; [\(entry.table)] accepts " + keys.joined(separator: ", ")
            }
            throw ConfigError(.unknownKey, file: file, line: entry.line, key: qualified, message: message)
        }
    }

    /// The candidate closest to `name` by edit distance, if it is close enough to be a typo
    /// (at most a third of its length, and at least 2, edits away); failing that, a candidate
    /// that `name` (of 4 or more characters) abbreviates, like `warn` for `warning`.
    package static func nearest(_ name: String, in candidates: [String]) -> String? {
        let lowered = name.lowercased()
        let target = Array(lowered.unicodeScalars)
        var best: (candidate: String, distance: Int)?
        for candidate in candidates {
            let other = Array(candidate.unicodeScalars)
            let limit = max(2, other.count / 3)
            guard abs(other.count - target.count) <= limit else { continue }
            let distance = editDistance(target, other)
            if distance <= limit, distance < (best?.distance ?? .max) { best = (candidate, distance) }
        }
        if let best { return best.candidate }
        guard target.count >= 4 else { return nil }
        return candidates.first { $0.hasPrefix(lowered) }
    }

    /// Levenshtein distance; callers bound the lengths, so the quadratic table stays small.
    private static func editDistance(_ a: [Unicode.Scalar], _ b: [Unicode.Scalar]) -> Int {
        if a.isEmpty { return b.count }
        if b.isEmpty { return a.count }
        var previous = Array(0...b.count)
        var current = [Int](repeating: 0, count: b.count + 1)
        for i in 1...a.count {
            current[0] = i
            for j in 1...b.count {
                let substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)
                current[j] = min(previous[j] + 1, current[j - 1] + 1, substitution)
            }
            swap(&previous, &current)
        }
        return previous[b.count]
    }

    // MARK: Loading

    /// Reads and parses the file at `path`.
    ///
    /// - Returns: nil when no file exists there (the defaults then apply).
    /// - Throws: `ConfigError` when the file exists but is a directory, cannot be read, is larger
    ///   than `TOMLSubset.maxInputBytes`, is not UTF-8, or does not parse.
    package static func load(path: String) throws(ConfigError) -> BrokerSettings? {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { return nil }
        if isDirectory.boolValue {
            throw ConfigError(.unreadable, file: path, message: "this is a directory; the configuration must be a TOML file")
        }
        let data: Data
        let fd: CInt
        do {
            // nil: removed between the check and the open, same as absent.
            guard let opened = try PrivateFiles.openConfigurationFile(path) else { return nil }
            fd = opened
        } catch {
            throw ConfigError(.unreadable, file: path, message: error.description)
        }
        do {
            let handle = FileHandle(fileDescriptor: fd, closeOnDealloc: true)
            defer { try? handle.close() }
            // One byte more than the limit tells "too large" apart without reading a huge file.
            data = try handle.read(upToCount: TOMLSubset.maxInputBytes + 1) ?? Data()
        } catch {
            throw ConfigError(
                .unreadable, file: path,
                message: "cannot read the file (\(error.localizedDescription)); check that it is a regular file readable by this user"
            )
        }
        guard data.count <= TOMLSubset.maxInputBytes else {
            throw ConfigError(
                .tooLarge, file: path,
                message: "the file is larger than \(TOMLSubset.maxInputBytes) bytes; check that this is the right file"
            )
        }
        guard let text = String(validating: data, as: UTF8.self) else {
            // 0x0A never occurs inside a multi-byte UTF-8 sequence, so lines can be checked alone.
            let line = data.split(separator: 0x0A, omittingEmptySubsequences: false)
                .firstIndex { String(validating: $0, as: UTF8.self) == nil }
                .map { $0 + 1 }
            throw ConfigError(.notUTF8, file: path, line: line, message: "the file is not valid UTF-8 text; save it as UTF-8")
        }
        return try parse(text, file: path)
    }
}

// MARK: - Reading typed values out of a table

private struct ValueUnit {
    /// "an integer number of milliseconds"
    var expected: String
    /// "milliseconds", or "" for plain counts.
    var plural: String
}

private struct TableReader {
    let file: String
    let table: String
    let values: [String: TOMLValue]
    let lines: [String: Int]

    init(file: String, table: String, document: TOMLDocument) {
        self.init(file: file, table: table, values: document.tables[table] ?? [:], lines: document.keyLines[table] ?? [:])
    }

    /// One `[[table]]` entry's values.
    init(file: String, table: String, values: [String: TOMLValue], lines: [String: Int]) {
        self.file = file
        self.table = table
        self.values = values
        self.lines = lines
    }

    /// An array of strings (empty when the key is absent).
    func stringArray(_ key: String, expected: String) throws(ConfigError) -> [String] {
        try self.entries(key, expected: expected) { text throws(EntryError) in text } ?? []
    }

    /// One host pattern, as a quoted string.
    func hostPattern(_ key: String) throws(ConfigError) -> HostPattern? {
        guard let text = try string(key, expected: "a host pattern as a quoted string, like \"docker.local\"") else { return nil }
        do throws(HostPatternError) {
            return try HostPattern(parsing: text)
        } catch {
            throw self.error(key, .invalidValue, error.message)
        }
    }

    func error(_ key: String, _ code: ConfigError.Code, _ message: String) -> ConfigError {
        ConfigError(code, file: file, line: lines[key], key: "\(table).\(key)", message: message)
    }

    func integer(_ key: String, in range: ClosedRange<Int>, unit: ValueUnit, note: String = "") throws(ConfigError) -> Int? {
        guard let value = values[key] else { return nil }
        guard case .integer(let number) = value else {
            throw error(key, .wrongType, "expected \(unit.expected), got \(value.messageDescription)")
        }
        guard range.contains(number) else {
            let unitText = unit.plural.isEmpty ? "" : " \(unit.plural)"
            throw error(
                key, .outOfRange,
                "\(number) is out of range; use \(range.lowerBound) to \(range.upperBound)\(unitText)\(note)"
            )
        }
        return number
    }

    /// An integer or a float, as a number of seconds.
    func seconds(_ key: String, in range: ClosedRange<Double>) throws(ConfigError) -> Double? {
        guard let value = values[key] else { return nil }
        let number: Double
        switch value {
        case .integer(let integer): number = Double(integer)
        case .float(let float): number = float
        default: throw error(key, .wrongType, "expected a number of seconds, got \(value.messageDescription)")
        }
        guard range.contains(number) else {
            throw error(
                key, .outOfRange,
                "\(number) is out of range; use \(Int(range.lowerBound)) to \(Int(range.upperBound)) seconds"
            )
        }
        return number
    }

    func boolean(_ key: String) throws(ConfigError) -> Bool? {
        guard let value = values[key] else { return nil }
        guard case .boolean(let flag) = value else {
            throw error(key, .wrongType, "expected true or false, got \(value.messageDescription)")
        }
        return flag
    }

    func string(_ key: String, expected: String) throws(ConfigError) -> String? {
        guard let value = values[key] else { return nil }
        guard case .string(let text) = value else {
            throw error(key, .wrongType, "expected \(expected), got \(value.messageDescription)")
        }
        return text
    }

    /// An absolute path with no control characters (paths with a newline or NUL are mistakes
    /// that would surface later, far from the line that caused them).
    func path(_ key: String, maxBytes: Int = 4095) throws(ConfigError) -> String? {
        guard let text = try string(key, expected: "a path as a quoted string") else { return nil }
        guard !text.isEmpty else {
            throw error(key, .invalidValue, "the path is empty; remove the line to use the default")
        }
        if text.hasPrefix("~") {
            throw error(key, .invalidValue, "\"~\" is not expanded here; write the full path, like /home/you/…")
        }
        guard text.hasPrefix("/") else {
            throw error(
                key, .invalidValue,
                "\"\(TOMLValue.escapedForMessage(text))\" is a relative path; write an absolute path starting with /"
            )
        }
        if text.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
            throw error(key, .invalidValue, "the path contains a control character; remove it")
        }
        guard text.utf8.count <= maxBytes else {
            throw error(key, .invalidValue, "the path is \(text.utf8.count) bytes long; the limit is \(maxBytes), so choose a shorter one")
        }
        return text
    }

    func logLevel(_ key: String) throws(ConfigError) -> LogLevelName? {
        let names = LogLevelName.allCases.map(\.rawValue)
        guard let text = try string(key, expected: "one of \(names.joined(separator: ", ")) as a quoted string") else {
            return nil
        }
        if let level = LogLevelName(rawValue: text) { return level }
        var message = "unknown log level \"\(TOMLValue.escapedForMessage(text))\""
        if let suggestion = BrokerSettings.nearest(text, in: names) { message += "; did you mean \"\(suggestion)\"?" }
        throw error(key, .invalidValue, message + (message.hasSuffix("?") ? " " : ". ") + "The levels are \(names.joined(separator: ", ")).")
    }

    /// `http://host:port` (port defaults to 80): an HTTP proxy's address, without credentials or path.
    func proxyOrigin(_ key: String) throws(ConfigError) -> CanonicalOrigin? {
        guard let text = try string(key, expected: "a proxy URL as a quoted string, like \"http://proxy.example:3128\"") else {
            return nil
        }
        let shown = TOMLValue.escapedForMessage(String(text.prefix(100)))
        let lower = text.lowercased()
        guard lower.hasPrefix("http://") else {
            let why = lower.hasPrefix("https://") ? "TLS to the proxy itself is not supported" : "the proxy URL must start with http://"
            throw error(key, .invalidValue, "\"\(shown)\": \(why); write http://host:port")
        }
        let authority = text.dropFirst("http://".count).prefix { $0 != "/" }
        if authority.contains("@") {
            throw error(
                key, .invalidValue,
                // The value itself is not shown: it holds a password.
                "a password does not belong in the config file; remove user:password@ and store it with `authbrokerctl passwords add http://\(authority.split(separator: "@").last ?? "") --user NAME`"
            )
        }
        let rest = text.dropFirst("http://".count + authority.count)
        guard rest.isEmpty || rest == "/" else {
            throw error(key, .invalidValue, "\"\(shown)\": a proxy URL has no path; write http://host:port")
        }
        do {
            return try CanonicalOrigin(parsing: "http://" + authority + "/")
        } catch {
            throw self.error(key, .invalidValue, "\"\(shown)\": \(error.message)")
        }
    }

    /// An array of host patterns (`HostPattern`): names, `*.domain` wildcards, IP addresses.
    func hostPatterns(_ key: String) throws(ConfigError) -> [HostPattern]? {
        try self.entries(key, expected: "an array of host patterns, like [\"localhost\", \"*.internal.example\", \"10.0.0.5\"]") {
            text throws(EntryError) in
            do throws(HostPatternError) {
                return try HostPattern(parsing: text)
            } catch {
                throw EntryError(message: error.message)
            }
        }
    }

    /// `"all"`, or an array of host patterns.
    func interceptHosts(_ key: String) throws(ConfigError) -> InterceptHosts? {
        if case .string(let text)? = values[key] {
            guard text == "all" else {
                throw error(
                    key, .invalidValue,
                    "\"\(TOMLValue.escapedForMessage(text))\": write \"all\", or an array of host patterns like [\"*.corp.example\"]"
                )
            }
            return .all
        }
        return try self.hostPatterns(key).map { .patterns($0) }
    }

    /// An array of loopback `address:port` strings; `[]` turns the proxy port off.
    func listenAddresses(_ key: String) throws(ConfigError) -> [ProxyListenAddress]? {
        let expected = "an array of loopback \"address:port\" strings, like [\"127.0.0.1:3128\"] ([] for no proxy port)"
        return try self.entries(key, expected: expected, sameAs: { $0.port != 0 && $0 == $1 }, duplicate: { "are both \($0)" }) {
            text throws(EntryError) in
            do throws(ProxyListenAddress.ParseError) {
                return try ProxyListenAddress(parsing: text)
            } catch {
                throw EntryError(message: error.description)
            }
        }
    }

    func resolveOverrides(_ key: String) throws(ConfigError) -> [ResolveOverride]? {
        try self.entries(
            key, expected: "an array of \"host:port:address\" strings, like [\"example.com:443:127.0.0.1\"]",
            sameAs: { $0.host == $1.host && $0.port == $1.port }, duplicate: { "both pin \($0.host):\($0.port)" }
        ) { text throws(EntryError) in
            do throws(ResolveOverride.ParseError) {
                return try ResolveOverride(parsing: text)
            } catch {
                throw EntryError(message: error.description)
            }
        }
    }

    /// Why one entry of an array was refused, in words.
    struct EntryError: Error {
        var message: String
    }

    /// An array of strings, each made into an entry by `parse` (whose error's message is used,
    /// after "entry N: "); with `sameAs`, two entries it calls the same are refused, their
    /// clash worded by `duplicate` ("entries 1 and 2 <duplicate>; keep one").
    private func entries<Entry>(
        _ key: String, expected: String, sameAs: ((Entry, Entry) -> Bool)? = nil, duplicate: (Entry) -> String = { _ in "" },
        parse: (String) throws(EntryError) -> Entry
    ) throws(ConfigError) -> [Entry]? {
        guard let value = values[key] else { return nil }
        guard case .array(let elements) = value else {
            throw error(key, .wrongType, "expected \(expected), got \(value.messageDescription)")
        }
        var result: [Entry] = []
        for (offset, element) in elements.enumerated() {
            guard case .string(let text) = element else {
                throw error(key, .wrongType, "entry \(offset + 1): expected \(expected), got \(element.messageDescription)")
            }
            let entry: Entry
            do {
                entry = try parse(text)
            } catch {
                throw self.error(key, .invalidValue, "entry \(offset + 1): \(error.message)")
            }
            if let sameAs, let earlier = result.firstIndex(where: { sameAs($0, entry) }) {
                throw self.error(key, .invalidValue, "entries \(earlier + 1) and \(offset + 1) \(duplicate(entry)); keep one")
            }
            result.append(entry)
        }
        return result
    }
}

// MARK: - Resolve overrides

/// `[[route]]`: a host reached over a Unix socket (a Docker-style API at `/run/docker.sock`), with
/// TLS over it when the URL is `https://`.
package struct UnixRoute: Sendable, Equatable {
    package var host: HostPattern
    package var socketPath: String

    package init(host: HostPattern, socketPath: String) {
        self.host = host
        self.socketPath = socketPath
    }
}

/// A pin of `host:port` to one address, written as curl's `--resolve` is:
/// `example.com:443:127.0.0.1` or `example.com:443:[::1]`.
///
/// It changes only where the connection goes; the request, SNI and the certificate check still
/// use the host name, exactly as curl does. Used for testing and split-horizon setups.
package struct ResolveOverride: Sendable, Hashable, CustomStringConvertible {
    /// Lower-cased, without a trailing dot.
    package var host: String
    package var port: Int
    /// A numeric IPv4 or IPv6 address, IPv6 without brackets.
    package var address: String

    package init(host: String, port: Int, address: String) {
        self.host = ResolveOverride.normalised(host)
        self.port = port
        self.address = address
    }

    /// Why an override string was refused.
    package struct ParseError: Error, Sendable, Equatable, CustomStringConvertible {
        package var input: String
        package var message: String

        package var description: String {
            "\"\(TOMLValue.escapedForMessage(input))\": \(message)"
        }
    }

    /// Parses `host:port:address`; the host is a DNS name or IPv4 address, the address is a
    /// numeric IPv4 address or a bracketed IPv6 address.
    package init(parsing text: String) throws(ParseError) {
        func failure(_ message: String) -> ParseError {
            ParseError(input: text, message: message + "; write host:port:address, like example.com:443:127.0.0.1")
        }
        let parts = text.split(separator: ":", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw failure("expected three parts separated by ':'") }
        let host = ResolveOverride.normalised(String(parts[0]))
        guard !host.isEmpty, host.utf8.count <= 253 else {
            throw failure("the host must be a name of 1 to 253 characters")
        }
        let hostCharacters = host.unicodeScalars.allSatisfy {
            ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "-" || $0 == "." || $0 == "_"
        }
        guard hostCharacters else {
            throw failure("the host may hold only letters, digits, '-', '_' and '.' (wildcards and IPv6 hosts are not supported)")
        }
        let portText = parts[1]
        guard !portText.isEmpty, portText.count <= 5, portText.allSatisfy({ $0.isASCII && $0.isNumber }),
            let port = Int(portText), (1...65_535).contains(port)
        else {
            throw failure("the port must be a number from 1 to 65535")
        }
        var address = String(parts[2])
        let bracketed = address.hasPrefix("[") && address.hasSuffix("]") && address.count >= 2
        if bracketed { address = String(address.dropFirst().dropLast()) }
        guard !address.isEmpty else { throw failure("the address is missing") }
        if address.contains(",") {
            throw failure("only one address per entry is supported")
        }
        // Checked before inet_pton, which would stop at an embedded NUL and accept the prefix.
        guard address.unicodeScalars.allSatisfy({ $0.properties.isASCIIHexDigit || $0 == "." || $0 == ":" }) else {
            throw failure("the address must be a numeric IPv4 or IPv6 address (no names, no zone ids)")
        }
        // NIOCore's parser is inet_pton: numeric addresses only, no names, no zone ids.
        guard let parsed = try? SocketAddress(ipAddress: address, port: port) else {
            throw failure(bracketed ? "[\(address)] is not an IPv6 address" : "\(address) is not a numeric IP address")
        }
        switch parsed {
        case .v4 where bracketed:
            throw failure("an IPv4 address must not be in brackets")
        case .v6 where !bracketed:
            throw failure("an IPv6 address must be in brackets, like [::1]")
        default:
            break
        }
        self.host = host
        self.port = port
        self.address = address
    }

    /// Whether this override applies to a connection to `host:port` (host compared
    /// case-insensitively, a trailing dot ignored).
    package func matches(host: String, port: Int) -> Bool {
        self.port == port && self.host == ResolveOverride.normalised(host)
    }

    /// `host:port:address`, with brackets around an IPv6 address: the form it was written in.
    package var description: String {
        address.contains(":") ? "\(host):\(port):[\(address)]" : "\(host):\(port):\(address)"
    }

    private static func normalised(_ host: String) -> String {
        let lower = host.lowercased()
        return lower.hasSuffix(".") ? String(lower.dropLast()) : lower
    }
}
