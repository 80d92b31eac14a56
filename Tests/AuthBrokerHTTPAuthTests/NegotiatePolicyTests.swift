import AuthBrokerCore
import AuthBrokerHTTPAuth
import Foundation
import Testing

@Suite("Negotiate: who gets a Kerberos ticket ([kerberos], RFC 4559)")
struct NegotiatePolicyTests {
    private static func origin(_ text: String) throws -> CanonicalOrigin {
        let url = try #require(URLComponents(string: text))
        let scheme = try #require(UpstreamScheme(rawValue: url.scheme ?? ""))
        return try CanonicalOrigin(scheme: scheme, host: try #require(url.host), port: url.port)
    }

    private static let policy: NegotiatePolicy = {
        // Patterns that parse; a failure here is a broken test, not a product bug.
        let patterns = { (texts: [String]) in texts.compactMap { try? HostPattern(parsing: $0) } }
        return NegotiatePolicy(hosts: patterns(["*.corp.example", "intranet.example"]), proxy: false, delegateHosts: patterns(["files.corp.example"]))
    }()

    @Test(
        "origins: listed https hosts only, delegation only where named",
        arguments: [
            ("https://wiki.corp.example", NegotiatePolicy.Decision.answer(delegate: false)),
            ("https://WIKI.Corp.Example:8443", .answer(delegate: false)),
            ("https://files.corp.example", .answer(delegate: true)),
            ("https://intranet.example", .answer(delegate: false)),
            // A wildcard covers subdomains, not the domain itself (as anchors' patterns).
            ("https://corp.example", .refuse(.hostNotListed)),
            ("https://evil.example", .refuse(.hostNotListed)),
            ("https://corp.example.evil.example", .refuse(.hostNotListed)),
            // Listed, but anyone on the path could carry a cleartext token to the real server.
            ("http://wiki.corp.example", .refuse(.cleartextOrigin)),
            ("http://evil.example", .refuse(.hostNotListed)),
        ]
    )
    func origins(url: String, expected: NegotiatePolicy.Decision) throws {
        #expect(Self.policy.decide(try Self.origin(url), isProxy: false) == expected)
    }

    @Test("the upstream proxy gets a ticket only with [kerberos] proxy = true, over http too, never delegated")
    func proxy() throws {
        let proxy = try Self.origin("http://proxy.corp.example:3128")
        #expect(Self.policy.decide(proxy, isProxy: true) == .refuse(.proxyNotEnabled))
        var enabled = Self.policy
        enabled.proxy = true
        enabled.delegateHosts = [try HostPattern(parsing: "proxy.corp.example")]
        #expect(enabled.decide(proxy, isProxy: true) == .answer(delegate: false))
    }

    @Test(
        "a CNAME is followed only to a name the user listed too; delegation follows the name used",
        arguments: [
            // No CNAME.
            ("wiki.corp.example", "wiki.corp.example", true, "wiki.corp.example", false),
            ("files.corp.example", "files.corp.example", true, "files.corp.example", true),
            // A CNAME inside the list: followed, as browsers do.
            ("wiki.corp.example", "web01.corp.example", true, "web01.corp.example", false),
            ("files.corp.example", "web01.corp.example", true, "web01.corp.example", false),
            // A CNAME out of the list (DNS pointing a listed name at another service): not followed.
            ("wiki.corp.example", "payroll.other.example", true, "wiki.corp.example", false),
            ("files.corp.example", "payroll.other.example", true, "files.corp.example", true),
            // The policy said no delegation for the URL's host: none whatever the name.
            ("files.corp.example", "files.corp.example", false, "files.corp.example", false),
        ]
    )
    func canonicalNames(urlHost: String, canonical: String, delegate: Bool, host: String, delegated: Bool) {
        let chosen = Self.policy.serviceHost(urlHost: urlHost, canonical: canonical, delegate: delegate)
        #expect(chosen.host == host)
        #expect(chosen.delegate == delegated)
    }

    @Test("nothing is sent anywhere by default")
    func defaults() throws {
        let policy = NegotiatePolicy(BrokerSettings().kerberos)
        #expect(!policy.isEnabled)
        #expect(policy.decide(try Self.origin("https://wiki.corp.example"), isProxy: false) == .refuse(.hostNotListed))
        #expect(policy.decide(try Self.origin("http://proxy:3128"), isProxy: true) == .refuse(.proxyNotEnabled))
    }

    @Test(
        "the server's Negotiate challenge and token are read; anything else is not a Negotiate offer",
        arguments: [
            (["Negotiate"], NegotiateOffer?.some(NegotiateOffer(serverToken: nil))),
            (["negotiate"], NegotiateOffer(serverToken: nil)),
            (["Basic realm=\"x\", Negotiate"], NegotiateOffer(serverToken: nil)),
            (["Negotiate oRQwEqADCgEAoQsGCSqGSIb3EgECAg=="], NegotiateOffer(serverToken: Array(Data(base64Encoded: "oRQwEqADCgEAoQsGCSqGSIb3EgECAg==") ?? Data()))),
            // A token that is not base64, and parameters where a token belongs: no offer.
            (["Negotiate !!!!"], nil),
            (["Negotiate realm=\"x\""], nil),
            (["NTLM"], nil),
            (["Basic realm=\"x\""], nil),
            ([""], nil),
            (["Negotiate \u{0}"], nil),
        ]
    )
    func offers(fields: [String], expected: NegotiateOffer?) {
        #expect(NegotiatePolicy.offer(in: AuthChallenge.parse(fieldValues: fields)) == expected)
    }

    @Test("the answer is `Negotiate <base64>`, and client-visible challenges never include Negotiate")
    func answerAndVisibility() {
        #expect(NegotiatePolicy.authorization(token: [0x60, 0x82, 0x01]) == "Negotiate YIIB")
        let challenges = AuthChallenge.parse(fieldValues: ["Negotiate", "Basic realm=\"x\""])
        #expect(ChallengeSelection.clientVisible(challenges).map(\.lowercasedScheme) == ["basic"])
    }
}
