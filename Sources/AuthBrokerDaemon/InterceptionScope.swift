import AuthBrokerCore
import AuthBrokerTrust
import Foundation

/// For each CONNECT: intercept or tunnel (`InterceptPolicy`), with what the user holds for the
/// host read from the trust store and the password vault; and the local CA an interception uses.
package struct InterceptionScope: Sendable {
    /// `[proxy] intercept` and `tunnel`, and `[[respond]]` and `[[rewrite]]` (a host a rule covers
    /// is intercepted, so the rule can apply), as a reload last left them.
    package let rules: LiveRules
    package let store: TrustStore
    package let vault: PasswordVault
    package let authority: LocalCA

    package init(rules: LiveRules, store: TrustStore, vault: PasswordVault, authority: LocalCA) {
        self.rules = rules
        self.store = store
        self.vault = vault
        self.authority = authority
    }

    func decide(_ origin: CanonicalOrigin, now: Date = Date()) async -> InterceptPolicy.Decision {
        let host = origin.host
        let rules = self.rules.current
        if let decided = rules.interception.ruleDecision(host: host) { return decided }
        var holdings: InterceptHoldings = []
        if self.store.anchors().contains(where: { $0.applies(to: host) }) { holdings.insert(.anchor) }
        if self.store.pins().contains(where: { $0.host.matches(host) }) { holdings.insert(.pin) }
        let exceptions = self.store.exceptions()
        if (exceptions.saved + exceptions.session).contains(where: {
            !$0.isExpired(at: now) && $0.names(host: host, port: origin.port)
        }) {
            holdings.insert(.exception)
        }
        if self.store.automaticClientIdentity(for: host, now: now).identity != nil { holdings.insert(.identity) }
        if rules.cover(host: host) { holdings.insert(.rule) }
        // Asked last and only when nothing else decided: it may wait on the keyring.
        if holdings.isEmpty, await self.vault.hasPassword(for: origin) { holdings.insert(.password) }
        return rules.interception.decide(host: host, holdings: holdings)
    }
}
