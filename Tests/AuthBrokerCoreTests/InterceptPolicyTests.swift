import AuthBrokerCore
import Testing

/// Which CONNECTs are intercepted: the user's holdings, the `intercept` rule, and `tunnel` over both.
struct InterceptPolicyTests {
    static func patterns(_ texts: String...) throws -> [HostPattern] {
        try texts.map { try HostPattern(parsing: $0) }
    }

    @Test func defaultInterceptsOnlyWhereTheUserHoldsSomething() {
        let policy = InterceptPolicy()
        #expect(policy.ruleDecision(host: "example.com") == nil)
        #expect(policy.decide(host: "example.com", holdings: []) == .tunnel(.nothingToAdd))
        #expect(policy.decide(host: "example.com", holdings: [.password, .pin]) == .intercept(.holds([.password, .pin])))
        #expect(InterceptHoldings([.anchor, .identity, .password]).names == ["anchor", "identity", "password"])
    }

    @Test func interceptRuleNamesHostsWithNothingHeld() throws {
        let policy = InterceptPolicy(intercept: .patterns(try Self.patterns("*.corp.example", "10.0.0.5")))
        #expect(policy.decide(host: "git.corp.example", holdings: []) == .intercept(.interceptRule))
        #expect(policy.decide(host: "corp.example", holdings: []) == .tunnel(.nothingToAdd))
        #expect(policy.decide(host: "10.0.0.5", holdings: []) == .intercept(.interceptRule))
        #expect(policy.decide(host: "GIT.CORP.EXAMPLE", holdings: []) == .intercept(.interceptRule))
    }

    @Test func tunnelRuleWinsOverEverything() throws {
        let all = InterceptPolicy(intercept: .all, tunnel: try Self.patterns("pinned.example", "*.bank.example"))
        #expect(all.decide(host: "pinned.example", holdings: [.password, .anchor]) == .tunnel(.tunnelRule))
        #expect(all.ruleDecision(host: "www.bank.example") == .tunnel(.tunnelRule))
        #expect(all.decide(host: "other.example", holdings: []) == .intercept(.interceptAll))
        let named = InterceptPolicy(intercept: .patterns(try Self.patterns("pinned.example")), tunnel: try Self.patterns("pinned.example"))
        #expect(named.decide(host: "pinned.example", holdings: [.identity]) == .tunnel(.tunnelRule))
    }
}
