import AuthBrokerCore
import AuthBrokerTrust
import NIOSSL
import TestSupport
import Testing
import X509

@Suite("TestPKI")
struct TestPKITests {
    @Test("leaves and CAs carry the extensions a TLS server and the verifier expect")
    func extensions() throws {
        let root = try TestPKI.makeCA(commonName: "Root")
        let intermediate = try TestPKI.makeCA(commonName: "Intermediate", issuer: root)
        let leaf = try TestPKI.makeLeaf(dnsNames: ["a.test"], ipAddresses: ["127.0.0.1", "::1"], issuer: intermediate)

        #expect(try root.certificate.extensions.basicConstraints == .isCertificateAuthority(maxPathLength: nil))
        #expect(try leaf.certificate.extensions.basicConstraints == .notCertificateAuthority)
        #expect(try leaf.certificate.extensions.extendedKeyUsage?.contains(.serverAuth) == true)
        #expect(
            try leaf.certificate.extensions.authorityKeyIdentifier?.keyIdentifier
                == intermediate.certificate.extensions.subjectKeyIdentifier?.keyIdentifier
        )
        let info = CertificateInfo(leaf.certificate)
        #expect(info.dnsNames == ["a.test"])
        #expect(info.ipAddresses == ["127.0.0.1", "::1"])
        #expect(info.sha256 == leaf.sha256Fingerprint)
        #expect(info.spkiSHA256 == leaf.spkiSHA256)
        #expect(!info.isCA && !info.isSelfSigned)
        #expect(CertificateInfo(root.certificate).isSelfSigned)
        #expect(throws: (any Error).self) { try TestPKI.makeLeaf(ipAddresses: ["not-an-ip"], issuer: nil) }
    }

    @Test("a NIOSSL server context accepts the certificate and key")
    func nioSSL() throws {
        let ca = try TestPKI.makeCA(commonName: "CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["localhost"], issuer: ca)
        let configuration = TLSConfiguration.makeServerConfiguration(
            certificateChain: [.certificate(try leaf.nioCertificate()), .certificate(try ca.nioCertificate())],
            privateKey: .privateKey(try leaf.nioPrivateKey())
        )
        _ = try NIOSSLContext(configuration: configuration)
    }
}
