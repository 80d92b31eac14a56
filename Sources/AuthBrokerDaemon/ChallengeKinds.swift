import AuthBrokerCore
import AuthBrokerHTTPAuth

/// What a challenge asks about. Both kinds go through the one `ChallengeBroker`, so agents see
/// them on one stream and `GET /v1/challenges` lists them together.
package enum ChallengeSpace: Hashable, Sendable {
    /// An origin's Basic or Digest 401: which user and password?
    case http(ProtectionSpace)
    /// A server whose certificate chain did not verify: trust it?
    case serverTrust(ServerTrustSpace)
}

/// How a challenge was answered, by the store or an agent.
package enum ChallengeAnswer: Equatable, Sendable {
    case credential(StoredAnswer)
    /// The server is trusted now (an agent added an exception or an anchor, or the store already
    /// trusts the chain): the request connects again.
    case serverTrusted
}

/// "Trust what this server presents?": coalesced per (host, port, leaf fingerprint), so many
/// requests to one server that presents one certificate make one question.
///
/// Equality and hashing use that key only; the rest says what the agent is shown and what an
/// "anchor" answer adds.
package struct ServerTrustSpace: Hashable, Sendable {
    package var host: String
    package var port: Int
    /// SHA-256 of the leaf's DER, as `CertificateInfo.sha256`.
    package var leafSHA256: String
    /// Stable codes of why the chain was not trusted (`TrustFailure.code`), most important first.
    package var failureCodes: [String]
    /// One sentence per failure, for a person.
    package var reasons: [String]
    /// The chain as presented, leaf first.
    package var chain: [CertificateInfo]
    /// The same, DER, leaf first.
    package var chainDER: [[UInt8]]

    package init(
        host: String, port: Int, leafSHA256: String, failureCodes: [String], reasons: [String], chain: [CertificateInfo],
        chainDER: [[UInt8]]
    ) {
        self.host = host
        self.port = port
        self.leafSHA256 = leafSHA256
        self.failureCodes = failureCodes
        self.reasons = reasons
        self.chain = chain
        self.chainDER = chainDER
    }

    package static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.host == rhs.host && lhs.port == rhs.port && lhs.leafSHA256 == rhs.leafSHA256
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(self.host)
        hasher.combine(self.port)
        hasher.combine(self.leafSHA256)
    }
}

/// How an agent answers a server-trust challenge (a refusal is a decline).
package enum ServerTrustReply: Equatable, Sendable {
    /// Trust this leaf from this host and port until the daemon stops.
    case once
    /// Save an exception for this leaf from this host and port.
    case alwaysException
    /// Save the chain's topmost certificate (its root, or the self-signed leaf) as an anchor for this host.
    case alwaysAnchor
}
