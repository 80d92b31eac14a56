import AuthBrokerCore
import Crypto
import Foundation
import SwiftASN1
import X509

extension CertificateInfo {
    /// What the broker shows about `certificate` (re-encoded to DER for the fingerprint).
    ///
    /// Prefer `init(_:der:)` when the bytes the server sent are at hand: the fingerprint must
    /// be of those exact bytes.
    package init(_ certificate: Certificate) {
        self.init(certificate, der: CertificateDigests.derBytes(certificate))
    }

    /// What the broker shows about `certificate`, whose DER encoding is `der`.
    package init(_ certificate: Certificate, der: [UInt8]) {
        var dnsNames: [String] = []
        var ipAddresses: [String] = []
        if let names = try? certificate.extensions.subjectAlternativeNames {
            for name in names {
                switch name {
                case .dnsName(let dnsName):
                    dnsNames.append(dnsName)
                case .ipAddress(let octets):
                    ipAddresses.append(
                        HostPattern.ipAddressText(octets.bytes) ?? "invalid address of \(octets.bytes.count) bytes"
                    )
                default:
                    continue
                }
            }
        }
        let isCA: Bool
        switch try? certificate.extensions.basicConstraints {
        case .some(.isCertificateAuthority): isCA = true
        default: isCA = false
        }
        self.init(
            subject: certificate.subject.description,
            issuer: certificate.issuer.description,
            notBefore: certificate.notValidBefore,
            notAfter: certificate.notValidAfter,
            sha256: CertificateDigests.colonHex(SHA256.hash(data: der)),
            spkiSHA256: CertificateDigests.spkiSHA256(certificate),
            dnsNames: dnsNames,
            ipAddresses: ipAddresses,
            isSelfSigned: CertificateDigests.isSelfSigned(certificate),
            isCA: isCA
        )
    }
}

/// Fingerprints and encodings shared by the store, the evaluator and `CertificateInfo`.
package enum CertificateDigests {
    /// The DER encoding of a certificate; empty only if re-encoding fails, which a parsed
    /// certificate does not.
    package static func derBytes(_ certificate: Certificate) -> [UInt8] {
        var serializer = DER.Serializer()
        do {
            try serializer.serialize(certificate)
        } catch {
            return []
        }
        return serializer.serializedBytes
    }

    /// Upper-case hex pairs joined by colons, as `openssl x509 -fingerprint -sha256` prints.
    static func colonHex(_ digest: some Sequence<UInt8>) -> String {
        digest.map(Self.hexByte(uppercase: true)).joined(separator: ":")
    }

    /// Lower-case hex without separators: the form anchor ids take.
    static func lowerHex(_ digest: some Sequence<UInt8>) -> String {
        digest.map(Self.hexByte(uppercase: false)).joined()
    }

    private static func hexByte(uppercase: Bool) -> (UInt8) -> String {
        { byte in
            let hex = String(byte, radix: 16, uppercase: uppercase)
            return byte < 0x10 ? "0" + hex : hex
        }
    }

    /// The anchor id of a DER certificate: lower-case hex SHA-256.
    static func id(der: [UInt8]) -> String {
        lowerHex(SHA256.hash(data: der))
    }

    /// Base64 SHA-256 of the certificate's SubjectPublicKeyInfo, as curl's `--pinnedpubkey` and
    /// HPKP (RFC 7469 §2.4) compute it.
    static func spkiSHA256(_ certificate: Certificate) -> String {
        Data(SHA256.hash(data: spkiDER(certificate))).base64EncodedString()
    }

    /// The SubjectPublicKeyInfo exactly as encoded in the certificate.
    ///
    /// Read from the TBSCertificate (RFC 5280 §4.1) rather than re-encoded, so that a pin
    /// matches the bytes other tools hash even for unusual encodings.
    static func spkiDER(_ certificate: Certificate) -> [UInt8] {
        if let root = try? DER.parse(certificate.tbsCertificateBytes), case .constructed(let nodes) = root.content {
            var fields = Array(nodes)
            // Drop the optional [0] EXPLICIT version.
            if let first = fields.first, first.identifier.tagClass == .contextSpecific, first.identifier.tagNumber == 0
            {
                fields.removeFirst()
            }
            // serialNumber, signature, issuer, validity, subject, subjectPublicKeyInfo.
            if fields.count > 5 {
                return Array(fields[5].encodedBytes)
            }
        }
        var serializer = DER.Serializer()
        do {
            try serializer.serialize(certificate.publicKey)
        } catch {
            return []
        }
        return serializer.serializedBytes
    }

    /// Issued by itself: same name, and its own key verifies its signature.
    static func isSelfSigned(_ certificate: Certificate) -> Bool {
        certificate.subject == certificate.issuer
            && certificate.publicKey.isValidSignature(certificate.signature, for: certificate)
    }
}
