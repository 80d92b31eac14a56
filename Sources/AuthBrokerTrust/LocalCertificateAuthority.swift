import AuthBrokerCore
import Crypto
import Foundation
import SwiftASN1
import X509

/// The user's own CA for interception: the proxy port ends a program's TLS with a leaf this CA
/// signs for the host the program asked for, and the program trusts it through the CA bundle
/// `authbrokerctl env` points it at.
///
/// ECDSA P-256. The key never leaves the daemon except into the secret store; leaves are minted
/// in memory, short-lived, under one key per daemon run (`LeafKey`).
package struct LocalCertificateAuthority: Sendable {
    package let certificate: Certificate
    package let der: [UInt8]
    private let key: P256.Signing.PrivateKey

    /// How long a CA lasts: `authbrokerctl ca rotate` makes a new one sooner.
    package static let lifetime: TimeInterval = 10 * 365 * 86_400
    /// How long a leaf lasts: short, as nothing revokes it; the daemon mints anew well before.
    package static let leafLifetime: TimeInterval = 2 * 86_400
    /// Leaves are valid from a little before they are made, for clocks slightly behind.
    static let backdating: TimeInterval = 3_600

    /// A new CA for `owner` (`alice@laptop`), its name saying whose it is and when it was made
    /// (rotated CAs are told apart in a program's list of trusted roots).
    package static func make(owner: String, now: Date = Date()) throws -> LocalCertificateAuthority {
        let key = P256.Signing.PrivateKey()
        let day = ISO8601DateFormatter.string(from: now, timeZone: TimeZone(identifier: "UTC") ?? .current, formatOptions: [.withFullDate])
        let subject = try DistinguishedName {
            OrganizationName("AuthBroker")
            OrganizationalUnitName("local interception CA, never shared")
            CommonName(String("AuthBroker local CA for \(owner) (\(day))".prefix(64)))
        }
        let keyID = Self.keyIdentifier(key.publicKey)
        let extensions = try Certificate.Extensions {
            // No intermediates below it: it signs leaves only.
            Critical(BasicConstraints.isCertificateAuthority(maxPathLength: 0))
            Critical(KeyUsage(keyCertSign: true, cRLSign: true))
            SubjectKeyIdentifier(keyIdentifier: keyID)
        }
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: now - Self.backdating, notValidAfter: now + Self.lifetime, issuer: subject, subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256, extensions: extensions, issuerPrivateKey: Certificate.PrivateKey(key)
        )
        return LocalCertificateAuthority(certificate: certificate, key: key)
    }

    private init(certificate: Certificate, key: P256.Signing.PrivateKey) {
        self.certificate = certificate
        self.der = CertificateDigests.derBytes(certificate)
        self.key = key
    }

    /// The CA as stored: its certificate (PEM) and its key (`keyMaterial`). Refused when the key
    /// is not the certificate's, or the certificate is not a CA.
    package init(certificatePEM: String, keyMaterial: [UInt8]) throws(LocalCAError) {
        let certificate: Certificate
        let key: P256.Signing.PrivateKey
        do {
            certificate = try Certificate(pemEncoded: certificatePEM)
        } catch {
            throw LocalCAError("the local CA's certificate cannot be read (\(error))")
        }
        do {
            key = try P256.Signing.PrivateKey(derRepresentation: keyMaterial)
        } catch {
            throw LocalCAError("the local CA's key in the secret store cannot be read (\(error))")
        }
        guard certificate.publicKey == Certificate.PublicKey(key.publicKey) else {
            throw LocalCAError("the local CA's key in the secret store is not the key of its certificate")
        }
        guard case .isCertificateAuthority? = try? certificate.extensions.basicConstraints else {
            throw LocalCAError("the local CA's certificate is not a CA certificate")
        }
        self.init(certificate: certificate, key: key)
    }

    /// The key as the secret store keeps it (PKCS#8 DER). A secret: only for the store.
    package var keyMaterial: [UInt8] { Array(self.key.derRepresentation) }

    package var pem: String { PEMDocument(type: "CERTIFICATE", derBytes: self.der).pemString }

    package var info: CertificateInfo { CertificateInfo(self.certificate, der: self.der) }

    /// The key every leaf of one daemon run carries: minting then costs a signature, not a key
    /// generation, and no leaf key is ever stored.
    package struct LeafKey: Sendable {
        package let key: P256.Signing.PrivateKey
        package init() { self.key = P256.Signing.PrivateKey() }
        /// PKCS#8 PEM, for the TLS stack.
        package var pemRepresentation: String { self.key.pemRepresentation }
    }

    /// A leaf for `host` (a DNS name or an IP address, canonical), as the server's certificate
    /// of an intercepted connection: the name in the subject alternative name (where matching
    /// looks), TLS server use only, valid for `leafLifetime` (never past the CA).
    package func mintLeaf(for host: String, key: LeafKey, now: Date = Date()) throws -> Certificate {
        let name: GeneralName
        if let address = HostPattern.ipAddressBytes(host) {
            name = .ipAddress(ASN1OctetString(contentBytes: ArraySlice(address)))
        } else {
            name = .dnsName(host)
        }
        let subject = try DistinguishedName {
            OrganizationName("AuthBroker interception")
            // X.520 bounds a common name at 64 characters; the SAN carries the name in any case.
            if host.count <= 64 { CommonName(host) }
        }
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.notCertificateAuthority)
            Critical(KeyUsage(digitalSignature: true))
            try ExtendedKeyUsage([.serverAuth])
            SubjectKeyIdentifier(keyIdentifier: Self.keyIdentifier(key.key.publicKey))
            AuthorityKeyIdentifier(keyIdentifier: Self.keyIdentifier(self.key.publicKey))
            SubjectAlternativeNames([name])
        }
        return try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(key.key.publicKey),
            notValidBefore: now - Self.backdating, notValidAfter: min(now + Self.leafLifetime, self.certificate.notValidAfter),
            issuer: self.certificate.subject, subject: subject, signatureAlgorithm: .ecdsaWithSHA256, extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(self.key)
        )
    }

    /// SHA-1 of the public key's bytes (RFC 5280 §4.2.1.2, method 1).
    static func keyIdentifier(_ key: P256.Signing.PublicKey) -> ArraySlice<UInt8> {
        ArraySlice(Insecure.SHA1.hash(data: key.x963Representation))
    }
}

/// The local CA cannot be made, read or used; says what to do.
package struct LocalCAError: Error, CustomStringConvertible, Sendable {
    package var description: String
    package init(_ description: String) { self.description = description }
}
