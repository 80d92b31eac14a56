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
