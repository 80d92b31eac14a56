import AuthBrokerCore

/// Where a credential applies (RFC 9110 §11.5): the canonical origin, the realm, and the
/// authentication scheme, like URLProtectionSpace.
///
/// Keyed on `CanonicalOrigin`, so `HTTPS://Example.COM:443` and `https://example.com` share one
/// space; the realm is compared exactly (it is case-sensitive, RFC 9110 §11.5). A proxy's space
/// (from a 407) is kept apart from a server's at the same address, since the two may ask for
/// different credentials.
package struct ProtectionSpace: Hashable, Sendable, Codable, CustomStringConvertible {
    package let origin: CanonicalOrigin
    package let realm: String
    /// Lower-case: `basic` or `digest`.
    package let authScheme: String
    /// A proxy's space (407, `Proxy-Authenticate`) rather than an origin server's.
    package let isProxy: Bool

    package init(origin: CanonicalOrigin, realm: String, authScheme: String, isProxy: Bool = false) {
        self.origin = origin
        self.realm = realm
        self.authScheme = AuthListSyntax.lowercasedASCII(authScheme)
        self.isProxy = isProxy
    }

    /// The space a challenge names: its scheme and realm (empty when the server gave none).
    package init(origin: CanonicalOrigin, challenge: AuthChallenge, isProxy: Bool = false) {
        self.init(origin: origin, realm: challenge.realm ?? "", authScheme: challenge.scheme, isProxy: isProxy)
    }

    /// Where this space's challenges arrive: `Proxy-Authenticate` for a proxy (407),
    /// `WWW-Authenticate` otherwise (RFC 9110 §11.6.1, §11.7.1).
    package var challengeFieldName: String { isProxy ? "Proxy-Authenticate" : "WWW-Authenticate" }
    /// Where the answer goes (RFC 9110 §11.6.2, §11.7.2).
    package var authorizationFieldName: String { isProxy ? "Proxy-Authorization" : "Authorization" }
    /// Where `nextnonce` and `rspauth` come back (RFC 7615 §3, §4).
    package var authenticationInfoFieldName: String { isProxy ? "Proxy-Authentication-Info" : "Authentication-Info" }

    package var scheme: UpstreamScheme { origin.scheme }
    package var host: String { origin.host }
    package var port: Int { origin.port }

    package var description: String {
        "\(isProxy ? "proxy " : "")\(origin) \(authScheme) realm=\(AuthListSyntax.quoted(realm) ?? "<unprintable>")"
    }

    private enum CodingKeys: String, CodingKey {
        case scheme, host, port, realm, authScheme, isProxy
    }

    /// Decoding re-validates the origin, so a tampered store cannot produce a space no request
    /// could have produced.
    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let schemeText = try container.decode(String.self, forKey: .scheme)
        guard let scheme = UpstreamScheme(rawValue: schemeText) else {
            throw DecodingError.dataCorruptedError(forKey: .scheme, in: container, debugDescription: "scheme must be http or https")
        }
        let host = try container.decode(String.self, forKey: .host)
        let port = try container.decode(Int.self, forKey: .port)
        let origin: CanonicalOrigin
        do {
            origin = try CanonicalOrigin(scheme: scheme, host: host, port: port)
        } catch {
            throw DecodingError.dataCorruptedError(forKey: .host, in: container, debugDescription: error.message)
        }
        self.init(
            origin: origin, realm: try container.decode(String.self, forKey: .realm),
            authScheme: try container.decode(String.self, forKey: .authScheme),
            isProxy: try container.decodeIfPresent(Bool.self, forKey: .isProxy) ?? false
        )
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(origin.scheme.rawValue, forKey: .scheme)
        try container.encode(origin.host, forKey: .host)
        try container.encode(origin.port, forKey: .port)
        try container.encode(realm, forKey: .realm)
        try container.encode(authScheme, forKey: .authScheme)
        try container.encode(isProxy, forKey: .isProxy)
    }
}
