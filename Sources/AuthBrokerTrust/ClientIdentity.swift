import AuthBrokerCore
import Foundation
import SwiftASN1
import X509

/// A client certificate chain the broker presents to servers that ask for one (mTLS).
///
/// The private key is not here: it lives in the secret store under the identity's `name`, and
/// never leaves the daemon. What is here is public: the chain and where to present it.
package struct ClientIdentity: Codable, Sendable, Hashable {
    /// Letters, digits, `.`, `_` and `-`; 1 to 64 characters (it is also the secret store's key).
    package var name: String
    /// DER certificates, leaf first.
    package var chainDER: [[UInt8]]
    /// Hosts it is presented to without being named. Empty: only when a request names it.
    package var hosts: [HostPattern]
    package var addedAt: Date
    /// The leaf certificate.
    package var certificate: CertificateInfo

    /// The chain in PEM, leaf first, one block per certificate: what a PEM export writes
    /// before the key, so the file is a whole identity again.
    package var chainPEM: String {
        self.chainDER.map { PEMDocument(type: "CERTIFICATE", derBytes: $0).pemString + "\n" }.joined()
    }

    /// An identity for `chainDER` (leaf first); checks the name and parses the leaf.
    package init(name: String, chainDER: [[UInt8]], hosts: [HostPattern], addedAt: Date) throws(TrustStoreError) {
        try Self.validate(name: name)
        guard let leafDER = chainDER.first else {
            throw TrustStoreError(.invalidIdentity, "The identity has no certificate. Give the client certificate (and its chain) with the key.")
        }
        let leaf: Certificate
        do {
            leaf = try Certificate(derEncoded: leafDER)
        } catch {
            throw TrustStoreError(.invalidIdentity, "The client certificate is not valid X.509 (\(error)).")
        }
        self.name = name
        self.chainDER = chainDER
        self.hosts = hosts
        self.addedAt = addedAt
        self.certificate = CertificateInfo(leaf, der: leafDER)
    }

    package static let maxNameLength = 64

    /// Names are keys in the secret store and appear in headers and commands: keep them plain.
    package static func validate(name: String) throws(TrustStoreError) {
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-")
        }
        guard !name.isEmpty, name.utf8.count <= Self.maxNameLength, allowed else {
            throw TrustStoreError(
                .invalidIdentityName,
                "'\(name.prefix(80))' is not a usable identity name: use 1 to \(Self.maxNameLength) letters, digits, '.', '_' or '-' (for example 'work-laptop')."
            )
        }
    }

    package func isExpired(at now: Date) -> Bool { now > self.certificate.notAfter || now < self.certificate.notBefore }

    /// The first instant after `now` at which one of `identities` becomes valid or stops being
    /// valid, so `choose` may answer differently; nil when none ever will. (Valid through
    /// `notAfter` inclusive, so the change comes just after it: `notAfter` itself is earlier, which
    /// only makes a cache that keys on this give up its answer a moment early.)
    package static func nextValidityChange(in identities: [ClientIdentity], after now: Date) -> Date? {
        var next: Date?
        for identity in identities {
            for boundary in [identity.certificate.notBefore, identity.certificate.notAfter] where boundary > now {
                next = min(next ?? boundary, boundary)
            }
        }
        return next
    }

    /// Whether it expires within `interval` of `now` (for `status` warnings).
    package func expires(within interval: TimeInterval, of now: Date) -> Bool {
        self.certificate.notAfter.timeIntervalSince(now) < interval
    }

    /// The identity to present to `host`, or nil for none.
    ///
    /// With `requested` (the `Authbroker-Identity` header), that identity, if it exists, may be
    /// presented there (no host patterns, or one matching) and has not expired; anything else is
    /// an error, since the client asked for something specific. Without, the unexpired identity
    /// whose matching pattern is most specific, the newest on a tie; none matching is no identity.
    ///
    /// Fails closed: an expired or out-of-scope identity is never presented.
    package static func choose(
        from identities: [ClientIdentity], host: String, requested: String?, now: Date
    ) throws(TrustStoreError) -> ClientIdentity? {
        if let requested {
            guard let identity = identities.first(where: { $0.name == requested }) else {
                throw TrustStoreError(
                    .unknownIdentity,
                    "The request names the client identity '\(requested.prefix(80))', which does not exist. `authbrokerctl identities list` shows the ones there are."
                )
            }
            guard identity.hosts.isEmpty || identity.hosts.contains(where: { $0.matches(host) }) else {
                let scope = identity.hosts.map(\.description).joined(separator: ", ")
                throw TrustStoreError(
                    .identityNotForHost,
                    "The client identity '\(identity.name)' is for \(scope), not \(host). Import it again with --hosts that include \(host) if it belongs there."
                )
            }
            guard !identity.isExpired(at: now) else {
                throw TrustStoreError(
                    .identityExpired,
                    "The client identity '\(identity.name)' is not valid now (valid \(identity.certificate.notBefore) to \(identity.certificate.notAfter)). Import a renewed certificate."
                )
            }
            return identity
        }
        return Self.chooseAutomatically(from: identities, host: host, now: now)
    }

    /// `choose` without a requested name: the unexpired identity whose matching pattern is most
    /// specific, the newest on a tie, or nil. Nothing to refuse, so it cannot fail.
    package static func chooseAutomatically(from identities: [ClientIdentity], host: String, now: Date) -> ClientIdentity? {
        var best: (identity: ClientIdentity, specificity: Int)?
        for identity in identities where !identity.isExpired(at: now) {
            guard let specificity = identity.hosts.filter({ $0.matches(host) }).map(\.specificity).max() else { continue }
            if let current = best,
                current.specificity > specificity
                    || (current.specificity == specificity && current.identity.addedAt >= identity.addedAt)
            {
                continue
            }
            best = (identity, specificity)
        }
        return best?.identity
    }
}
