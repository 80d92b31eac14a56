import AuthBrokerCore
import Crypto
import Foundation
import NIOSSL
import SwiftASN1
import X509

/// A certificate made at run time together with its private key, in every form a test needs.
package struct TestIdentity: Sendable {
    package var certificate: Certificate
    package var privateKey: P256.Signing.PrivateKey
    package var der: [UInt8]
    package var pem: String
    package var privateKeyPEM: String
    /// SHA-256 of the DER, upper-case hex pairs joined by colons (as `CertificateInfo.sha256`).
    package var sha256Fingerprint: String
    /// Base64 SHA-256 of the DER SubjectPublicKeyInfo (as `CertificateInfo.spkiSHA256`).
    package var spkiSHA256: String

    init(certificate: Certificate, privateKey: P256.Signing.PrivateKey) throws {
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        self.certificate = certificate
        self.privateKey = privateKey
        self.der = serializer.serializedBytes
        self.pem = try certificate.serializeAsPEM().pemString
        self.privateKeyPEM = privateKey.pemRepresentation
        self.sha256Fingerprint = SHA256.hash(data: self.der).map { byte in
            let hex = String(byte, radix: 16, uppercase: true)
            return byte < 0x10 ? "0" + hex : hex
        }.joined(separator: ":")
        self.spkiSHA256 = Data(SHA256.hash(data: privateKey.publicKey.derRepresentation)).base64EncodedString()
    }

    /// The certificate for a NIOSSL `TLSConfiguration`.
    package func nioCertificate() throws -> NIOSSLCertificate {
        try NIOSSLCertificate(bytes: self.der, format: .der)
    }

    /// The private key for a NIOSSL `TLSConfiguration`.
    package func nioPrivateKey() throws -> NIOSSLPrivateKey {
        try NIOSSLPrivateKey(bytes: Array(self.privateKeyPEM.utf8), format: .pem)
    }
}

/// Why a test PKI request could not be met.
package struct TestPKIError: Error, CustomStringConvertible {
    package var description: String
}

/// Makes CAs, intermediates and leaves with P-256 keys at run time, so tests never ship keys
/// and can place validity windows wherever they need (expired, not yet valid).
package enum TestPKI {
    /// A root CA (`issuer == nil`, self-signed) or an intermediate CA signed by `issuer`.
    package static func makeCA(
        commonName: String,
        notBefore: Date = .now - 3600,
        notAfter: Date = .now + 86400 * 30,
        issuer: TestIdentity? = nil,
        excludedDNSDomains: [String] = []
    ) throws -> TestIdentity {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName {
            OrganizationName("AuthBroker Test PKI")
            CommonName(commonName)
        }
        let ski = SubjectKeyIdentifier(keyIdentifier: Self.keyIdentifier(key.publicKey))
        let authorityKeyID = issuer.map { Self.keyIdentifier($0.privateKey.publicKey) }
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
            Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            ski
            if let authorityKeyID {
                AuthorityKeyIdentifier(keyIdentifier: authorityKeyID)
            }
            if !excludedDNSDomains.isEmpty {
                Critical(NameConstraints(excludedDNSDomains: excludedDNSDomains))
            }
        }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: notBefore,
            notValidAfter: notAfter,
            issuer: issuer?.certificate.subject ?? subject,
            subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(issuer?.privateKey ?? key)
        )
        return try TestIdentity(certificate: certificate, privateKey: key)
    }

    /// A server certificate for `dnsNames` and `ipAddresses`, signed by `issuer` (nil: self-signed).
    ///
    /// The common name defaults to the first name given; matching uses the SAN only when it
    /// is present (RFC 6125 §6.4.4), which it is whenever a name or address is given.
    package static func makeLeaf(
        dnsNames: [String] = [],
        ipAddresses: [String] = [],
        issuer: TestIdentity?,
        commonName: String? = nil,
        notBefore: Date = .now - 3600,
        notAfter: Date = .now + 86400 * 30,
        clientAuthenticationOnly: Bool = false
    ) throws -> TestIdentity {
        let key = P256.Signing.PrivateKey()
        let name = commonName ?? dnsNames.first ?? ipAddresses.first ?? "AuthBroker test leaf"
        let subject = try DistinguishedName {
            OrganizationName("AuthBroker Test PKI")
            CommonName(name)
        }
        var generalNames: [GeneralName] = dnsNames.map { .dnsName($0) }
        for address in ipAddresses {
            guard let bytes = HostPattern.ipAddressBytes(address) else {
                throw TestPKIError(description: "'\(address)' is not an IP address; give e.g. 127.0.0.1 or ::1")
            }
            generalNames.append(.ipAddress(ASN1OctetString(contentBytes: ArraySlice(bytes))))
        }
        let authorityKeyID = issuer.map { Self.keyIdentifier($0.privateKey.publicKey) }
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.notCertificateAuthority)
            Critical(KeyUsage(digitalSignature: true))
            try ExtendedKeyUsage(clientAuthenticationOnly ? [.clientAuth] : [.serverAuth])
            SubjectKeyIdentifier(keyIdentifier: Self.keyIdentifier(key.publicKey))
            if let authorityKeyID {
                AuthorityKeyIdentifier(keyIdentifier: authorityKeyID)
            }
            if !generalNames.isEmpty {
                SubjectAlternativeNames(generalNames)
            }
        }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: notBefore,
            notValidAfter: notAfter,
            issuer: issuer?.certificate.subject ?? subject,
            subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(issuer?.privateKey ?? key)
        )
        return try TestIdentity(certificate: certificate, privateKey: key)
    }

    /// A client certificate (extended key usage clientAuth) for mTLS, signed by `issuer`.
    package static func makeClient(
        commonName: String,
        issuer: TestIdentity,
        notBefore: Date = .now - 3600,
        notAfter: Date = .now + 86400 * 30
    ) throws -> TestIdentity {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName {
            OrganizationName("AuthBroker Test PKI")
            CommonName(commonName)
        }
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.notCertificateAuthority)
            Critical(KeyUsage(digitalSignature: true))
            try ExtendedKeyUsage([.clientAuth])
            SubjectKeyIdentifier(keyIdentifier: Self.keyIdentifier(key.publicKey))
            AuthorityKeyIdentifier(keyIdentifier: Self.keyIdentifier(issuer.privateKey.publicKey))
        }
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: notBefore,
            notValidAfter: notAfter,
            issuer: issuer.certificate.subject,
            subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(issuer.privateKey)
        )
        return try TestIdentity(certificate: certificate, privateKey: key)
    }

    /// RFC 5280 §4.2.1.2 method (1): SHA-1 of the subject public key bits.
    private static func keyIdentifier(_ key: P256.Signing.PublicKey) -> ArraySlice<UInt8> {
        ArraySlice(Insecure.SHA1.hash(data: key.x963Representation))
    }
}
