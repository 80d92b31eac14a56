import AuthBrokerCore
import AuthBrokerTrust
import Crypto
import Foundation
import SwiftASN1
import TestSupport
import Testing
import X509

/// Chains a careful Web PKI verifier rejects for a TLS server (issue 18), made here with
/// swift-certificates: each must be refused with its own reason, and the controls beside them
/// trusted. The CA is the user's anchor for every host, which relaxes none of these rules.
@Suite("Server certificate rules")
struct ServerCertificateRulesTests {
    struct Made {
        var certificate: Certificate
        var key: P256.Signing.PrivateKey
        var der: [UInt8]
    }

    /// A certificate with exactly `extensions`, signed by `issuer` (nil: self-signed).
    static func make(
        commonName: String?, issuer: Made?, notBefore: Date = .now - 3600, extensions: Certificate.Extensions
    ) throws -> Made {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName {
            OrganizationName("AuthBroker Rules Test")
            if let commonName { CommonName(commonName) }
        }
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: notBefore, notValidAfter: .now + 86400, issuer: issuer?.certificate.subject ?? subject,
            subject: subject, signatureAlgorithm: .ecdsaWithSHA256, extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(issuer?.key ?? key)
        )
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return Made(certificate: certificate, key: key, der: serializer.serializedBytes)
    }

    static func makeCA(_ name: String, issuer: Made? = nil, usage: [ExtendedKeyUsage.Usage]? = nil) throws -> Made {
        try make(
            commonName: name, issuer: issuer,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                if let usage { try ExtendedKeyUsage(usage) }
            }
        )
    }

    static func sans(_ names: [String]) -> SubjectAlternativeNames {
        SubjectAlternativeNames(names.map { GeneralName.dnsName($0) })
    }

    /// The usual leaf extensions with `usage`, `names`, and the CA bits as given.
    static func leaf(
        _ commonName: String?, names: [String]?, issuer: Made, usage: [ExtendedKeyUsage.Usage]? = [.serverAuth],
        isCA: Bool = false, keyCertSign: Bool = false, notBefore: Date = .now - 3600
    ) throws -> Made {
        try make(
            commonName: commonName, issuer: issuer, notBefore: notBefore,
            extensions: try Certificate.Extensions {
                if isCA {
                    Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                } else {
                    Critical(BasicConstraints.notCertificateAuthority)
                }
                Critical(KeyUsage(digitalSignature: true, keyCertSign: keyCertSign))
                if let usage { try ExtendedKeyUsage(usage) }
                if let names { Self.sans(names) }
            }
        )
    }

    /// Evaluates `chain` (leaf first) for `host` with `root` as the user's anchor.
    static func evaluate(_ chain: [Made], root: Made, host: String, now: Date = .now) async throws -> TrustDecision {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        try fixture.store.addAnchors(pem: try root.certificate.serializeAsPEM().pemString, hosts: [])
        return await fixture.evaluator.evaluate(chainDER: chain.map(\.der), host: host, now: now)
    }

    enum Case: String, CaseIterable, CustomTestStringConvertible {
        case clientAuthOnly, emptyUsage, leafIsCA, leafSignsCertificates, noSubjectAltName, commonNameNotInSAN
        case partialLabelWildcard, bareWildcard, wildcardOverOneLabel, intermediateForClientsOnly

        var testDescription: String { rawValue }
    }

    @Test("each broken rule is refused, with its code and a reason naming it", arguments: Case.allCases)
    func refused(_ test: Case) async throws {
        let root = try Self.makeCA("Rules Root")
        var chain: [Made]
        var host = "www.rules.test"
        let expected: (code: String, words: String)
        switch test {
        case .clientAuthOnly:
            chain = [try Self.leaf(host, names: [host], issuer: root, usage: [.clientAuth])]
            expected = ("unfit_for_server", "client authentication only")
        case .emptyUsage:
            chain = [try Self.leaf(host, names: [host], issuer: root, usage: [])]
            expected = ("unfit_for_server", "extended key usage is empty")
        case .leafIsCA:
            chain = [try Self.leaf(host, names: [host], issuer: root, isCA: true)]
            expected = ("unfit_for_server", "CA certificate")
        case .leafSignsCertificates:
            chain = [try Self.leaf(host, names: [host], issuer: root, keyCertSign: true)]
            expected = ("unfit_for_server", "signing certificates")
        case .noSubjectAltName:
            chain = [try Self.leaf(host, names: nil, issuer: root)]
            expected = ("unfit_for_server", "no subjectAltName")
        case .commonNameNotInSAN:
            chain = [try Self.leaf("other.rules.test", names: [host], issuer: root)]
            expected = ("unfit_for_server", "subject CN 'other.rules.test'")
        case .partialLabelWildcard:
            chain = [try Self.leaf(nil, names: ["ww*.rules.test"], issuer: root)]
            expected = ("hostname_mismatch", host)
        case .bareWildcard:
            host = "rules"
            chain = [try Self.leaf(nil, names: ["*"], issuer: root)]
            expected = ("hostname_mismatch", host)
        case .wildcardOverOneLabel:
            host = "rules.test"
            chain = [try Self.leaf(nil, names: ["*.test"], issuer: root)]
            expected = ("hostname_mismatch", host)
        case .intermediateForClientsOnly:
            let intermediate = try Self.makeCA("Clients Only Intermediate", issuer: root, usage: [.clientAuth])
            chain = [try Self.leaf(host, names: [host], issuer: intermediate), intermediate]
            expected = ("unfit_for_server", "restricted to other uses")
        }
        let decision = try await Self.evaluate(chain, root: root, host: host)
        #expect(!decision.isTrusted, "\(test) was trusted")
        #expect(decision.failures.map(\.code).contains(expected.code), "\(decision.failures)")
        #expect(decision.reasons.contains { $0.contains(expected.words) }, "\(decision.reasons)")
    }

    @Test("controls: a plain leaf, a wildcard over its one label, anyExtendedKeyUsage, a leaf without extended key usage")
    func controlsAreTrusted() async throws {
        let root = try Self.makeCA("Rules Root")
        let plain = try Self.leaf("www.rules.test", names: ["www.rules.test"], issuer: root)
        #expect(try await Self.evaluate([plain], root: root, host: "www.rules.test").isTrusted)
        let wildcard = try Self.leaf(nil, names: ["*.rules.test"], issuer: root)
        #expect(try await Self.evaluate([wildcard], root: root, host: "a.rules.test").isTrusted)
        #expect(try await !Self.evaluate([wildcard], root: root, host: "a.b.rules.test").isTrusted, "one label only")
        #expect(try await !Self.evaluate([wildcard], root: root, host: "rules.test").isTrusted)
        let anyUse = try Self.leaf("www.rules.test", names: ["www.rules.test"], issuer: root, usage: [.any])
        #expect(try await Self.evaluate([anyUse], root: root, host: "www.rules.test").isTrusted)
        let noUsage = try Self.leaf("www.rules.test", names: ["WWW.Rules.Test"], issuer: root, usage: nil)
        #expect(try await Self.evaluate([noUsage], root: root, host: "www.rules.test.").isTrusted)
    }

    @Test("a chain checked a fraction of a second before its notBefore is not yet valid")
    func validityIsExact() async throws {
        let root = try Self.makeCA("Rules Root")
        let start = Date(timeIntervalSince1970: (Date.now.timeIntervalSince1970 + 10).rounded(.down))
        let leaf = try Self.leaf("www.rules.test", names: ["www.rules.test"], issuer: root, notBefore: start)
        let early = try await Self.evaluate([leaf], root: root, host: "www.rules.test", now: start - 0.3)
        #expect(!early.isTrusted)
        #expect(early.failures.map(\.code).contains("not_yet_valid"), "\(early.failures)")
        #expect(try await Self.evaluate([leaf], root: root, host: "www.rules.test", now: start + 0.3).isTrusted)
    }
}
