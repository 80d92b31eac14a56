import AuthBrokerCore
import Foundation

/// Who gets a Kerberos service ticket (HTTP Negotiate, RFC 4559), and how: the user's
/// `[kerberos]` settings applied to one challenger. A ticket proves who the user is to whoever
/// receives it, so nothing is sent until the user names a host.
package struct NegotiatePolicy: Sendable, Equatable {
    package enum Decision: Sendable, Equatable {
        /// Answer with a ticket; `delegate`: with the user's forwardable ticket too.
        case answer(delegate: Bool)
        case refuse(Refusal)
    }

    package enum Refusal: String, Sendable, Equatable {
        /// The origin matches no `[kerberos] hosts` pattern.
        case hostNotListed = "host_not_listed"
        /// The upstream proxy asked, and `[kerberos] proxy` is off.
        case proxyNotEnabled = "proxy_not_enabled"
        /// An origin over plain http: anyone on the path could take the token to the real server.
        case cleartextOrigin = "cleartext_origin"
    }

    package var hosts: [HostPattern]
    package var proxy: Bool
    package var delegateHosts: [HostPattern]

    package init(hosts: [HostPattern] = [], proxy: Bool = false, delegateHosts: [HostPattern] = []) {
        self.hosts = hosts
        self.proxy = proxy
        self.delegateHosts = delegateHosts
    }

    package init(_ settings: BrokerSettings.Kerberos) {
        self.init(hosts: settings.hosts, proxy: settings.proxy, delegateHosts: settings.delegateHosts)
    }

    /// Whether anything at all may get a ticket.
    package var isEnabled: Bool { !hosts.isEmpty || proxy }

    /// The decision for a challenge from `challenger`: an origin's 401, or with `isProxy` the
    /// configured upstream proxy's 407 (over http too: the proxy is the user's own setting).
    package func decide(_ challenger: CanonicalOrigin, isProxy: Bool) -> Decision {
        if isProxy { return proxy ? .answer(delegate: false) : .refuse(.proxyNotEnabled) }
        guard hosts.contains(where: { $0.matches(challenger.host) }) else { return .refuse(.hostNotListed) }
        guard challenger.scheme == .https else { return .refuse(.cleartextOrigin) }
        return .answer(delegate: delegateHosts.contains { $0.matches(challenger.host) })
    }

    /// The host a ticket is asked for, given the URL's host (lower-cased) and its canonical name
    /// from DNS: the canonical name only when `hosts` allows it too (a CNAME names the service
    /// whose ticket the server gets, and whoever runs a listed host's DNS could point it at any
    /// service of the realm), else the URL's; delegation only when `delegate` (the decision for
    /// the URL's host) holds and `delegateHosts` lists the host used.
    package func serviceHost(urlHost: String, canonical: String, delegate: Bool) -> (host: String, delegate: Bool) {
        let host = canonical == urlHost || hosts.contains(where: { $0.matches(canonical) }) ? canonical : urlHost
        return (host, delegate && delegateHosts.contains { $0.matches(host) })
    }

    /// The Negotiate challenge among `challenges`, and the server's token in it (base64-decoded;
    /// nil for a bare `Negotiate`). nil when there is none, or its token is not valid base64.
    package static func offer(in challenges: [AuthChallenge]) -> NegotiateOffer? {
        guard let challenge = challenges.first(where: { $0.lowercasedScheme == "negotiate" }) else { return nil }
        guard let token = challenge.token68 else {
            return challenge.parameters.isEmpty ? NegotiateOffer(serverToken: nil) : nil
        }
        guard let bytes = Data(base64Encoded: token) else { return nil }
        return NegotiateOffer(serverToken: Array(bytes))
    }

    /// `Negotiate <base64>`, the value of `Authorization` (or `Proxy-Authorization`).
    package static func authorization(token: [UInt8]) -> String {
        "Negotiate " + Data(token).base64EncodedString()
    }
}

/// A server's Negotiate challenge: bare (start a context) or with a token (continue one).
package struct NegotiateOffer: Sendable, Equatable {
    package var serverToken: [UInt8]?

    package init(serverToken: [UInt8]?) {
        self.serverToken = serverToken
    }
}
