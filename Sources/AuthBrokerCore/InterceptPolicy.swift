/// Which hosts `[proxy] intercept` names beyond those the user holds something for.
package enum InterceptHosts: Sendable, Equatable {
    /// `intercept = "all"`: every CONNECT is intercepted (except `tunnel` hosts).
    case all
    /// `intercept = ["*.corp.example"]`; empty (the default): only hosts the user holds something for.
    case patterns([HostPattern])
}

/// What the user holds for a host: each is something the broker adds to a connection that a
/// blind tunnel would leave out.
package struct InterceptHoldings: OptionSet, Sendable, Hashable {
    package let rawValue: UInt8
    package init(rawValue: UInt8) { self.rawValue = rawValue }

    /// A trust anchor that may vouch for the host.
    package static let anchor = InterceptHoldings(rawValue: 1 << 0)
    package static let pin = InterceptHoldings(rawValue: 1 << 1)
    package static let exception = InterceptHoldings(rawValue: 1 << 2)
    /// A client identity presented to the host without being named.
    package static let identity = InterceptHoldings(rawValue: 1 << 3)
    /// A stored password for the host's `https://` origin.
    package static let password = InterceptHoldings(rawValue: 1 << 4)
    /// A `[[respond]]` rule for the host.
    package static let rule = InterceptHoldings(rawValue: 1 << 5)

    /// `anchor, password`: for the log.
    package var names: [String] {
        [(Self.anchor, "anchor"), (.pin, "pin"), (.exception, "exception"), (.identity, "identity"), (.password, "password"), (.rule, "rule")]
            .filter { self.contains($0.0) }.map(\.1)
    }
}

/// Whether a client's `CONNECT host:port` is intercepted (TLS terminated with a certificate from
/// the user's local CA, its requests then going through the whole broker) or tunnelled blind.
///
/// Intercepted: hosts the user holds something for (anchors, pins, exceptions, identities,
/// passwords), which a blind tunnel would leave unused, and hosts `[proxy] intercept` names.
/// `[proxy] tunnel` wins over both: it is how a program that pins its server's key keeps working.
package struct InterceptPolicy: Sendable, Equatable {
    package var intercept: InterceptHosts
    package var tunnel: [HostPattern]

    package init(intercept: InterceptHosts = .patterns([]), tunnel: [HostPattern] = []) {
        self.intercept = intercept
        self.tunnel = tunnel
    }

    package enum Decision: Sendable, Equatable {
        case intercept(Reason)
        case tunnel(Reason)
    }

    package enum Reason: Sendable, Equatable {
        /// A `[proxy] tunnel` pattern names the host.
        case tunnelRule
        /// `[proxy] intercept = "all"`.
        case interceptAll
        /// A `[proxy] intercept` pattern names the host.
        case interceptRule
        /// The user holds these for the host.
        case holds(InterceptHoldings)
        /// Nothing of the user's applies: the broker has nothing to add.
        case nothingToAdd

        /// `holds anchor, password`: for the log.
        package var logDescription: String {
            switch self {
            case .tunnelRule: "[proxy] tunnel names the host"
            case .interceptAll: "[proxy] intercept = \"all\""
            case .interceptRule: "[proxy] intercept names the host"
            case .holds(let holdings): "holds \(holdings.names.joined(separator: ", "))"
            case .nothingToAdd: "nothing held for the host"
            }
        }
    }

    /// The decision the rules alone make (nil: it depends on what the user holds), so that the
    /// stores are asked only when it matters. `host`: canonical (lower-case, no brackets).
    package func ruleDecision(host: String) -> Decision? {
        if self.tunnel.contains(where: { $0.matches(host) }) { return .tunnel(.tunnelRule) }
        switch self.intercept {
        case .all: return .intercept(.interceptAll)
        case .patterns(let patterns) where patterns.contains(where: { $0.matches(host) }): return .intercept(.interceptRule)
        case .patterns: return nil
        }
    }

    /// The whole decision for `host`, given what the user holds for it.
    package func decide(host: String, holdings: InterceptHoldings) -> Decision {
        if let decided = self.ruleDecision(host: host) { return decided }
        return holdings.isEmpty ? .tunnel(.nothingToAdd) : .intercept(.holds(holdings))
    }
}
