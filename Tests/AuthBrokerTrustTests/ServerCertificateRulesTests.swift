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
    typealias Made = MadeCertificate

    /// A certificate with `extensions` plus its key identifiers (unless `keyIDs` is false),
    /// signed by `issuer` (nil: self-signed).
    static func make(
        commonName: String?, issuer: Made?, notBefore: Date = .now - 3600, emptySubject: Bool = false, keyIDs: Bool = true,
        extensions: Certificate.Extensions
    ) throws -> Made {
        let key = P256.Signing.PrivateKey()
        let subject = emptySubject ? DistinguishedName() : try DistinguishedName {
            OrganizationName("AuthBroker Rules Test")
            if let commonName { CommonName(commonName) }
        }
        var extensions = extensions
        if keyIDs {
            try extensions.append(Certificate.Extension(SubjectKeyIdentifier(keyIdentifier: Made.keyID(key)), critical: false))
            if let issuer {
                try extensions.append(Certificate.Extension(AuthorityKeyIdentifier(keyIdentifier: issuer.keyID), critical: false))
            }
        }
        return try Made.sign(
            subject: subject, issuer: issuer, key: key, notBefore: notBefore, notAfter: .now + 86400, extensions: extensions
        )
    }

    static func makeCA(
        _ name: String, issuer: Made? = nil, usage: [ExtendedKeyUsage.Usage]? = nil, keyIDs: Bool = true,
        criticalBasicConstraints: Bool = true, emptySubject: Bool = false, constraints: NameConstraints? = nil
    ) throws -> Made {
        try make(
            commonName: name, issuer: issuer, emptySubject: emptySubject, keyIDs: keyIDs,
            extensions: try Certificate.Extensions {
                if criticalBasicConstraints {
                    Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                } else {
                    BasicConstraints.isCertificateAuthority(maxPathLength: nil)
                }
                Critical(KeyUsage(keyCertSign: true, cRLSign: true))
                if let usage { try ExtendedKeyUsage(usage) }
                if let constraints { Critical(constraints) }
            }
        )
    }

    static func sans(_ names: [String]) -> SubjectAlternativeNames {
        SubjectAlternativeNames(names.map { GeneralName.dnsName($0) })
    }

    /// The usual leaf extensions with `usage`, `names`, and the CA bits as given.
    static func leaf(
        _ commonName: String?, names: [String]?, issuer: Made, usage: [ExtendedKeyUsage.Usage]? = [.serverAuth],
        isCA: Bool = false, keyCertSign: Bool = false, notBefore: Date = .now - 3600, keyIDs: Bool = true,
        emptySubject: Bool = false, criticalNames: Bool = false, constraints: NameConstraints? = nil,
        rawBasicConstraints: [UInt8]? = nil
    ) throws -> Made {
        try make(
            commonName: commonName, issuer: issuer, notBefore: notBefore, emptySubject: emptySubject, keyIDs: keyIDs,
            extensions: try Certificate.Extensions {
                if let rawBasicConstraints {
                    Certificate.Extension(oid: .X509ExtensionID.basicConstraints, critical: true, value: ArraySlice(rawBasicConstraints))
                } else if isCA {
                    Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                } else {
                    Critical(BasicConstraints.notCertificateAuthority)
                }
                Critical(KeyUsage(digitalSignature: true, keyCertSign: keyCertSign))
                if let usage { try ExtendedKeyUsage(usage) }
                if let names {
                    if criticalNames { Critical(Self.sans(names)) } else { Self.sans(names) }
                }
                if let constraints { Critical(constraints) }
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
        case leafWithoutAuthorityKeyID, intermediateWithoutSubjectKeyID, anchorBasicConstraintsNotCritical
        case intermediateWithEmptySubject, leafWithNameConstraints, wildcardCoversExcludedName
        case constraintWithLeadingPeriod, constraintsWithNoSubtrees, emptySubjectNonCriticalNames, malformedExtension

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
            expected = ("unfit_for_server", "'ww*.rules.test', which is not a host name")
        case .bareWildcard:
            host = "rules"
            chain = [try Self.leaf(nil, names: ["*"], issuer: root)]
            expected = ("unfit_for_server", "'*', which is not a host name")
        case .wildcardOverOneLabel:
            host = "rules.test"
            chain = [try Self.leaf(nil, names: ["*.test"], issuer: root)]
            expected = ("unfit_for_server", "public suffix 'test'")
        case .intermediateForClientsOnly:
            let intermediate = try Self.makeCA("Clients Only Intermediate", issuer: root, usage: [.clientAuth])
            chain = [try Self.leaf(host, names: [host], issuer: intermediate), intermediate]
            expected = ("unfit_for_server", "restricted to other uses")
        case .leafWithoutAuthorityKeyID:
            chain = [try Self.leaf(host, names: [host], issuer: root, keyIDs: false)]
            expected = ("unfit_for_server", "no authority key identifier")
        case .intermediateWithoutSubjectKeyID:
            let intermediate = try Self.makeCA("No Key ID Intermediate", issuer: root, keyIDs: false)
            chain = [try Self.leaf(host, names: [host], issuer: intermediate), intermediate]
            expected = ("unfit_for_server", "no subject key identifier")
        case .anchorBasicConstraintsNotCritical:
            let anchor = try Self.makeCA("Lax Root", criticalBasicConstraints: false)
            let decision = try await Self.evaluate([try Self.leaf(host, names: [host], issuer: anchor)], root: anchor, host: host)
            #expect(!decision.isTrusted)
            #expect(decision.reasons.contains { $0.contains("basicConstraints is not critical") }, "\(decision.reasons)")
            return
        case .intermediateWithEmptySubject:
            let intermediate = try Self.makeCA("", issuer: root, emptySubject: true)
            chain = [try Self.leaf(host, names: [host], issuer: intermediate), intermediate]
            expected = ("unfit_for_server", "empty subject")
        case .leafWithNameConstraints:
            chain = [try Self.leaf(host, names: [host], issuer: root, constraints: NameConstraints(permittedDNSDomains: ["rules.test"]))]
            expected = ("unfit_for_server", "name constraints")
        case .wildcardCoversExcludedName:
            let intermediate = try Self.makeCA(
                "Constrained Intermediate", issuer: root, constraints: NameConstraints(excludedDNSDomains: ["secret.rules.test"])
            )
            chain = [try Self.leaf(nil, names: ["*.rules.test"], issuer: intermediate), intermediate]
            expected = ("unfit_for_server", "covers 'secret.rules.test'")
        case .constraintWithLeadingPeriod:
            let intermediate = try Self.makeCA(
                "Period Intermediate", issuer: root, constraints: NameConstraints(permittedDNSDomains: [".rules.test"])
            )
            chain = [try Self.leaf(host, names: [host], issuer: intermediate), intermediate]
            expected = ("unfit_for_server", "starts with a period")
        case .constraintsWithNoSubtrees:
            let intermediate = try Self.makeCA("Empty Constraints Intermediate", issuer: root, constraints: NameConstraints())
            chain = [try Self.leaf(host, names: [host], issuer: intermediate), intermediate]
            // swift-certificates already refuses to decode an empty NameConstraints; either way it
            // is refused, and the reason names the extension.
            expected = ("unfit_for_server", "nameConstraints extension is not valid DER")
        case .emptySubjectNonCriticalNames:
            chain = [try Self.leaf(nil, names: [host], issuer: root, emptySubject: true)]
            expected = ("unfit_for_server", "must be critical")
        case .malformedExtension:
            // basicConstraints with cA TRUE encoded as 0x01: BER, not DER (which requires 0xFF).
            chain = [try Self.leaf(host, names: [host], issuer: root, rawBasicConstraints: [0x30, 0x03, 0x01, 0x01, 0x01])]
            expected = ("unfit_for_server", "not valid DER")
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
        let noUsage = try Self.leaf("WWW.Rules.Test", names: ["WWW.Rules.Test"], issuer: root, usage: nil)
        #expect(try await Self.evaluate([noUsage], root: root, host: "www.rules.test.").isTrusted)
    }

    @Test("a self-signed server certificate marked CA:TRUE (openssl req -x509) is refused as self-signed only: anchoring it cures it")
    func selfSignedCAServerCertificate() async throws {
        let host = "nas.rules.test"
        let server = try Self.make(
            commonName: host, issuer: nil,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Self.sans([host])
            }
        )
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let refused = await fixture.evaluator.evaluate(chainDER: [server.der], host: host)
        #expect(refused.failures.map(\.code) == ["self_signed"], "\(refused.reasons)")
        #expect(refused.failures.allSatisfy { $0.isAboutTheIssuer })
        // Anchored for another of its names first: out of scope, and the fix is the anchor's hosts.
        let other = "nas.other.test"
        let twoNames = try Self.make(
            commonName: host, issuer: nil,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Self.sans([host, other])
            }
        )
        try fixture.store.addAnchors(pem: try twoNames.certificate.serializeAsPEM().pemString, hosts: [try HostPattern(parsing: other)])
        let outOfScope = await fixture.evaluator.evaluate(chainDER: [twoNames.der], host: host)
        #expect(outOfScope.failures.map(\.code) == ["anchor_out_of_scope"], "\(outOfScope.reasons)")
        try fixture.store.addAnchors(pem: try server.certificate.serializeAsPEM().pemString, hosts: [try HostPattern(parsing: host)])
        let anchored = await fixture.evaluator.evaluate(chainDER: [server.der], host: host)
        #expect(anchored.isTrusted, "\(anchored.reasons)")
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

    @Test("a chain crafted to need millions of name-constraint comparisons is refused at once, not evaluated")
    func nameConstraintWorkIsBounded() async throws {
        let root = try Self.makeCA("Rules Root")
        let excluded = (0..<400).map { "excluded\($0).rules.test" }
        let intermediate = try Self.makeCA("Many Constraints", issuer: root, constraints: NameConstraints(excludedDNSDomains: excluded))
        let names = (0..<400).map { "name\($0).rules.test" }
        let leaf = try Self.leaf("name0.rules.test", names: names, issuer: intermediate)
        let decision = try await Self.evaluate([leaf, intermediate], root: root, host: "name0.rules.test")
        #expect(!decision.isTrusted)
        #expect(decision.reasons.contains { $0.contains("name-constraint comparisons") }, "\(decision.reasons)")
    }
}
