import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import TestSupport
import Testing

/// Chains signed with SHA-1 or MD5 are refused by default, with the reason (issue: hardening).
/// The certificates come from the openssl command line, since swift-certificates signs with
/// strong algorithms only.
@Suite("Weak signature algorithms")
struct WeakSignatureTests {
    /// A CA (RSA, SHA-256) and a leaf for `weak.internal.test` signed with `digest`.
    static func makeChain(digest: String, leafKeyBits: Int = 2048, in directory: TemporaryDirectory) throws -> (caPEM: String, leafDER: [UInt8]) {
        let openssl = "/usr/bin/openssl"
        func run(_ arguments: [String]) throws {
            let result = try ExternalCommand.run(openssl, arguments)
            guard result.status == 0 else { throw TestSupportError("openssl \(arguments.first ?? ""): \(result.stderr)") }
        }
        let ca = directory.file("ca.pem")
        let caKey = directory.file("ca.key")
        try run([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", caKey, "-out", ca, "-days", "30", "-subj", "/CN=Weak Test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign",
        ])
        try run([
            "req", "-newkey", "rsa:\(leafKeyBits)", "-nodes", "-keyout", directory.file("leaf.key"), "-out", directory.file("leaf.csr"),
            "-subj", "/CN=weak.internal.test",
        ])
        try "subjectAltName=DNS:weak.internal.test\n".write(toFile: directory.file("ext"), atomically: true, encoding: .utf8)
        try run([
            "x509", "-req", "-in", directory.file("leaf.csr"), "-CA", ca, "-CAkey", caKey, "-CAcreateserial",
            "-out", directory.file("leaf.der"), "-outform", "DER", "-days", "10", "-\(digest)", "-extfile", directory.file("ext"),
        ])
        let der = try Data(contentsOf: URL(fileURLWithPath: directory.file("leaf.der")))
        return (try String(contentsOfFile: ca, encoding: .utf8), Array(der))
    }

    @Test(
        "a leaf signed with a weak digest is refused with weak_signature naming it; SHA-256 from the same CA is trusted",
        arguments: [("sha1", "SHA-1 with RSA"), ("md5", "MD5 with RSA"), ("sha256", nil)] as [(String, String?)]
    )
    func weakDigestRefused(digest: String, algorithm: String?) async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let chain = try Self.makeChain(digest: digest, in: fixture.directory)
        try fixture.store.addAnchors(pem: chain.caPEM, hosts: [])
        let decision = await fixture.evaluator.evaluate(chainDER: [chain.leafDER], host: "weak.internal.test")
        guard let algorithm else {
            #expect(decision.isTrusted, "\(decision.failures)")
            return
        }
        #expect(!decision.isTrusted)
        #expect(decision.failures.first?.code == "weak_signature", "\(decision.failures)")
        #expect(decision.failures.first?.summary.contains(algorithm) == true)
        #expect(decision.failures.first?.summary.contains("can be forged") == true)
    }

    @Test("an RSA key whose modulus is not a whole number of bytes (2055 bits) is refused, saying so")
    func oddModulusRefused() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let chain = try Self.makeChain(digest: "sha256", leafKeyBits: 2055, in: fixture.directory)
        try fixture.store.addAnchors(pem: chain.caPEM, hosts: [])
        let decision = await fixture.evaluator.evaluate(chainDER: [chain.leafDER], host: "weak.internal.test")
        #expect(!decision.isTrusted)
        #expect(decision.reasons.contains { $0.contains("RSA modulus is not a whole number of bytes") }, "\(decision.reasons)")
    }
}
