import AuthBrokerCore
import Crypto
import Foundation
import SwiftASN1
import X509

/// A certificate the user trusts as a root, optionally only for some hosts.
///
/// An anchor can be a CA (it then vouches for what it issues) or a server's own certificate
/// (trusted exactly as presented). Limiting an anchor to host patterns keeps a private CA from
/// vouching for public sites.
package struct TrustAnchor: Codable, Sendable, Hashable {
    /// Lower-case hex SHA-256 of the DER, no colons.
    package var id: String
    package var der: [UInt8]
    /// The hosts this anchor may vouch for; empty means any host.
    package var hosts: [HostPattern]
    package var addedAt: Date
    package var certificate: CertificateInfo

    /// The certificate as a PEM `CERTIFICATE` block.
    package var pem: String {
        PEMDocument(type: "CERTIFICATE", derBytes: self.der).pemString
    }

    /// An anchor for the DER certificate `der`.
    package init(der: [UInt8], hosts: [HostPattern], addedAt: Date) throws(TrustStoreError) {
        let parsed: Certificate
        do {
            parsed = try Certificate(derEncoded: der)
        } catch {
            throw TrustStoreError(
                .invalidCertificate,
                "The data is not a valid X.509 certificate (\(error)). Give the certificate in PEM form, starting with -----BEGIN CERTIFICATE-----."
            )
        }
        self.init(certificate: parsed, der: der, hosts: hosts, addedAt: addedAt)
    }

    init(certificate: Certificate, der: [UInt8], hosts: [HostPattern], addedAt: Date) {
        self.id = CertificateDigests.id(der: der)
        self.der = der
        self.hosts = hosts
        self.addedAt = addedAt
        self.certificate = CertificateInfo(certificate, der: der)
    }

    /// Whether this anchor may vouch for `host` (canonical form).
    package func applies(to host: String) -> Bool {
        self.hosts.isEmpty || self.hosts.contains { $0.matches(host) }
    }

    enum CodingKeys: String, CodingKey {
        case id, pem, hosts, certificate
        case addedAt = "added_at"
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        let pem = try container.decode(String.self, forKey: .pem)
        let document: PEMDocument
        do {
            document = try PEMDocument(pemString: pem)
        } catch {
            throw DecodingError.dataCorruptedError(
                forKey: .pem,
                in: container,
                debugDescription: "not a PEM document: \(error)"
            )
        }
        guard document.discriminator == "CERTIFICATE" else {
            throw DecodingError.dataCorruptedError(
                forKey: .pem,
                in: container,
                debugDescription: "a \(document.discriminator) block, not a CERTIFICATE"
            )
        }
        let der = document.derBytes
        let id = try container.decode(String.self, forKey: .id)
        guard id == CertificateDigests.id(der: der) else {
            throw DecodingError.dataCorruptedError(
                forKey: .id,
                in: container,
                debugDescription: "id \(id) is not the SHA-256 of the certificate"
            )
        }
        self.id = id
        self.der = der
        self.hosts = try container.decode([HostPattern].self, forKey: .hosts)
        self.addedAt = try container.decode(Date.self, forKey: .addedAt)
        self.certificate = try container.decode(CertificateInfo.self, forKey: .certificate)
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(self.id, forKey: .id)
        try container.encode(self.pem, forKey: .pem)
        try container.encode(self.hosts, forKey: .hosts)
        try container.encode(self.addedAt, forKey: .addedAt)
        try container.encode(self.certificate, forKey: .certificate)
    }
}

/// A restriction: connections to matching hosts must have one of the pinned public keys
/// somewhere in their validated chain (the idea of RFC 7469 §2.6, configured locally).
///
/// A pin never makes an otherwise untrusted chain trusted.
package struct SPKIPin: Codable, Sendable, Hashable {
    package var host: HostPattern
    /// Base64 SHA-256 of a DER SubjectPublicKeyInfo (32 bytes).
    package var spkiSHA256: String
    package var addedAt: Date

    /// A pin, checking that `spkiSHA256` is the base64 of 32 bytes.
    ///
    /// curl's `sha256//` prefix is accepted and dropped, so a value copied from
    /// `--pinnedpubkey` works as is.
    package init(host: HostPattern, spkiSHA256: String, addedAt: Date) throws(TrustStoreError) {
        self.host = host
        self.spkiSHA256 = try Self.canonicalDigest(spkiSHA256)
        self.addedAt = addedAt
    }

    /// The canonical base64 form of a user-written SPKI SHA-256, or an `invalid_pin` error.
    static func canonicalDigest(_ text: String) throws(TrustStoreError) -> String {
        var value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        if value.lowercased().hasPrefix("sha256//") {
            value.removeFirst("sha256//".count)
        }
        guard value.utf8.count <= 64, let bytes = Data(base64Encoded: value), bytes.count == 32 else {
            throw TrustStoreError(
                .invalidPin,
                "'\(text.prefix(80))' is not a base64 SHA-256 public-key hash (44 characters ending in '='). Copy the spki_sha256 value the broker shows for the certificate."
            )
        }
        return bytes.base64EncodedString()
    }

    enum CodingKeys: String, CodingKey {
        case host
        case spkiSHA256 = "spki_sha256"
        case addedAt = "added_at"
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.host = try container.decode(HostPattern.self, forKey: .host)
        let digest = try container.decode(String.self, forKey: .spkiSHA256)
        do {
            self.spkiSHA256 = try Self.canonicalDigest(digest)
        } catch {
            throw DecodingError.dataCorruptedError(forKey: .spkiSHA256, in: container, debugDescription: error.message)
        }
        self.addedAt = try container.decode(Date.self, forKey: .addedAt)
    }
}
