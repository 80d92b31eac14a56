import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import Testing
import SwiftASN1
import X509

/// The interception CA: its leaves pass the broker's own strict verifier for the host they were
/// minted for, and nothing else; a stored CA reads back only with its own key.
struct LocalCertificateAuthorityTests {
    static let leafKey = LocalCertificateAuthority.LeafKey()

    @Test func leavesVerifyForTheirHostOnlyUnderTheCA() async throws {
        let ca = try LocalCertificateAuthority.make(owner: "alice@laptop")
        #expect(ca.info.isCA && ca.info.isSelfSigned)
        #expect(ca.info.subject.contains("AuthBroker local CA for alice@laptop"))
        // The CA as a program's bundle holds it: the system anchors of a fresh evaluator.
        let fixture = try EvaluatorFixture(systemBundle: ca.pem)
        defer { fixture.directory.cleanUp() }
        for host in ["git.corp.example", "127.0.0.1", "::1", String(repeating: "a", count: 63) + "." + String(repeating: "b", count: 63) + ".example"] {
            let leaf = try ca.mintLeaf(for: host, key: Self.leafKey)
            let der = try DERBytes.of(leaf)
            let decision = await fixture.evaluator.evaluate(chainDER: [der], host: host)
            #expect(decision.isTrusted, "\(host): \(decision.failures)")
            let elsewhere = await fixture.evaluator.evaluate(chainDER: [der], host: "other.example")
            #expect(!elsewhere.isTrusted)
            #expect(leaf.notValidAfter.timeIntervalSince(leaf.notValidBefore) <= LocalCertificateAuthority.leafLifetime + 3_600)
        }
        // Another user's (or a rotated) CA vouches for none of them.
        let other = try LocalCertificateAuthority.make(owner: "mallory@laptop")
        let foreign = try DERBytes.of(try other.mintLeaf(for: "git.corp.example", key: Self.leafKey))
        #expect(!(await fixture.evaluator.evaluate(chainDER: [foreign], host: "git.corp.example")).isTrusted)
    }

    @Test func aLeafNeverOutlivesItsCA() throws {
        let made = Date(timeIntervalSinceNow: -LocalCertificateAuthority.lifetime + 3_600)
        let ca = try LocalCertificateAuthority.make(owner: "alice@laptop", now: made)
        let leaf = try ca.mintLeaf(for: "example.com", key: Self.leafKey)
        #expect(leaf.notValidAfter == ca.certificate.notValidAfter)
    }

    @Test func storedCAReadsBackOnlyWithItsOwnKey() throws {
        let ca = try LocalCertificateAuthority.make(owner: "alice@laptop")
        let back = try LocalCertificateAuthority(certificatePEM: ca.pem, keyMaterial: ca.keyMaterial)
        #expect(back.der == ca.der)
        let other = try LocalCertificateAuthority.make(owner: "alice@laptop")
        let mixed = #expect(throws: LocalCAError.self) { try LocalCertificateAuthority(certificatePEM: ca.pem, keyMaterial: other.keyMaterial) }
        #expect(mixed?.description.contains("not the key of its certificate") == true)
        #expect(throws: LocalCAError.self) { try LocalCertificateAuthority(certificatePEM: "garbage", keyMaterial: ca.keyMaterial) }
        #expect(throws: LocalCAError.self) { try LocalCertificateAuthority(certificatePEM: ca.pem, keyMaterial: [0x30, 0x03, 0x02, 0x01]) }
        #expect(throws: LocalCAError.self) { try LocalCertificateAuthority(certificatePEM: ca.pem, keyMaterial: []) }
    }
}

enum DERBytes {
    static func of(_ certificate: Certificate) throws -> [UInt8] {
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return serializer.serializedBytes
    }
}
