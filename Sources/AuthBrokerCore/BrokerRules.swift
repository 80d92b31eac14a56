/// The parts of config.toml that a reload (`SIGHUP`, `POST /v1/reload`) replaces while the daemon
/// runs: `[[route]]`, `[[respond]]`, `[[rewrite]]`, and `[proxy] intercept` and `tunnel`. Everything else
/// takes effect at the next start.
package struct BrokerRules: Sendable, Equatable {
    package var routes: [UnixRoute] = []
    package var responses: [CannedResponse] = []
    package var rewrites: [RewriteRule] = []
    package var interception = InterceptPolicy()

    package init() {}

    package init(_ settings: BrokerSettings) {
        self.routes = settings.upstream.routes
        self.responses = settings.responses
        self.rewrites = settings.rewrites
        self.interception = settings.proxy.interception
    }

    /// The Unix socket `host` is routed to, if a `[[route]]` names it (the first that does).
    package func unixRoute(for host: String) -> UnixRoute? {
        self.routes.first { $0.host.matches(host) }
    }

    /// What chooses the address a connection goes to: the `[[route]]` rules and the `connect_to`
    /// ones, in their order, without their lines. A reload that changes it ends the reuse of
    /// pooled connections; one that changes only responses, headers or comments does not.
    package var addressing: [AddressRule] {
        self.routes.map { AddressRule(host: $0.host, destination: "unix:" + $0.socketPath) }
            + self.rewrites.compactMap { rule in
                guard case .connectTo(let host, let port)? = rule.target else { return nil }
                return AddressRule(host: rule.match.host, destination: "\(host):\(port)")
            }
    }

    package struct AddressRule: Sendable, Equatable {
        package var host: HostPattern
        package var destination: String
    }

    /// Whether `old` and `new` differ in anything a reload does not apply.
    package static func differBesideRules(_ old: BrokerSettings, _ new: BrokerSettings) -> Bool {
        var old = old
        var new = new
        old.upstream.routes = []
        new.upstream.routes = []
        old.responses = []
        new.responses = []
        old.rewrites = []
        new.rewrites = []
        old.proxy.interception = InterceptPolicy()
        new.proxy.interception = InterceptPolicy()
        return old != new
    }
}
