import AuthBrokerCore
import Logging
import NIOConcurrencyHelpers
import Synchronization

/// The running `BrokerRules`, replaced whole by a reload and read where they apply: the
/// connector (routes), the relay and the connection server (canned responses), interception.
package final class LiveRules: Sendable {
    private let box: NIOLockedValueBox<BrokerRules>
    /// Whether any `[[respond]]` or `[[rewrite]]` exists: the direct relay asks for every
    /// request, and without such rules (the usual case) the answer needs no lock.
    private let hasRequestRules: Synchronization.Atomic<Bool>
    /// `[upstream] proxy` and `no_proxy`, which a reload does not change.
    private let upstream: BrokerSettings.Upstream
    /// Counts reloads that changed where connections go (`BrokerRules.addressing`): a pooled
    /// connection made before one is not reused (`ConnectionGeneration`), so a moved `[[route]]`
    /// or `connect_to` applies at once.
    private let changes = Synchronization.Atomic<UInt64>(0)

    package init(_ settings: BrokerSettings) {
        let rules = BrokerRules(settings)
        self.box = NIOLockedValueBox(rules)
        self.hasRequestRules = Synchronization.Atomic(!rules.responses.isEmpty || !rules.rewrites.isEmpty)
        self.upstream = settings.upstream
    }

    package var current: BrokerRules { self.box.withLockedValue { $0 } }

    /// Which rules are in place (`changes`).
    package var generation: UInt64 { self.changes.load(ordering: .acquiring) }

    func replace(_ rules: BrokerRules) {
        let changed = self.box.withLockedValue { current in
            defer { current = rules }
            return current.addressing != rules.addressing
        }
        if changed { self.changes.add(1, ordering: .releasing) }
        self.hasRequestRules.store(!rules.responses.isEmpty || !rules.rewrites.isEmpty, ordering: .relaxed)
    }

    package func unixRoute(for host: String) -> UnixRoute? {
        self.box.withLockedValue { $0.unixRoute(for: host) }
    }

    /// The upstream proxy a connection to `origin` goes through: none for a routed host.
    package func proxy(for origin: CanonicalOrigin) -> CanonicalOrigin? {
        guard let proxy = self.upstream.proxy(for: origin), self.unixRoute(for: origin.host) == nil else { return nil }
        return proxy
    }

    /// Whether a `[[respond]]` or `[[rewrite]]` rule could apply to a request to `host`.
    package func cover(host: String) -> Bool {
        guard self.hasRequestRules.load(ordering: .relaxed) else { return false }
        return self.box.withLockedValue { $0.cover(host: host) }
    }

    /// Where connections to `host` go instead (`connect_to`).
    package func connectTarget(for host: String) -> (host: String, port: Int)? {
        guard self.hasRequestRules.load(ordering: .relaxed) else { return nil }
        return self.box.withLockedValue { $0.connectTarget(for: host) }
    }
}

/// Reads config.toml again and puts its rules in place (`SIGHUP`, `POST /v1/reload`): checked
/// whole first, so a file with an error changes nothing and the error names its line.
package struct RulesReloader: Sendable {
    package let configFile: String
    package let rules: LiveRules
    /// What the daemon started with: changes outside the rules need a restart, and are said so.
    package let started: BrokerSettings
    package let logger: Logger

    /// What a reload did.
    package struct Report: Sendable, Equatable {
        package var routes: Int
        package var responses: Int
        package var rewrites: Int
        /// Settings other than the rules changed too; they apply at the next start.
        package var restartNeeded: Bool
    }

    package func reload() throws(ConfigError) -> Report {
        let loaded: BrokerSettings
        do {
            loaded = try BrokerSettings.load(path: self.configFile) ?? .defaults
        } catch {
            self.logger.error("the config file was not reloaded; the rules in use stay", metadata: ["error": "\(error)"])
            throw error
        }
        let new = BrokerRules(loaded)
        self.rules.replace(new)
        let report = Report(
            routes: new.routes.count, responses: new.responses.count, rewrites: new.rewrites.count,
            restartNeeded: BrokerRules.differBesideRules(self.started, loaded)
        )
        self.logger.notice(
            "reloaded the rules of the config file",
            metadata: [
                "file": "\(self.configFile)", "routes": "\(report.routes)", "responses": "\(report.responses)",
                "rewrites": "\(report.rewrites)",
            ]
        )
        if report.restartNeeded {
            self.logger.warning("settings other than the rules changed in the config file; they take effect when the daemon restarts")
        }
        return report
    }
}
