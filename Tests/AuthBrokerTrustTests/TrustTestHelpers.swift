import AuthBrokerCore
import AuthBrokerTrust
import Crypto
import Foundation
import Logging
import SwiftASN1
import TestSupport
import X509

/// A fresh directory under the system temp dir, removed by the caller with `cleanUp()`.
struct TemporaryDirectory {
    let path: String

    init() throws {
        let path = NSTemporaryDirectory() + "authbroker-trust-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        self.path = path
    }

    func file(_ name: String) -> String { self.path + "/" + name }

    func cleanUp() {
        try? FileManager.default.removeItem(atPath: self.path)
    }
}

func pattern(_ text: String) throws -> HostPattern {
    try HostPattern(parsing: text)
}

/// A store in a temp dir and an evaluator with no system roots (unless a bundle is given).
struct EvaluatorFixture {
    let directory: TemporaryDirectory
    let store: TrustStore
    let evaluator: TrustEvaluator

    init(systemBundle: String? = nil, cacheSize: Int = 0, publicSuffixes: PublicSuffixList = .defaultRuleOnly) throws {
        self.directory = try TemporaryDirectory()
        self.store = try TrustStore(path: self.directory.file("state/trust.json"))
        var bundlePath = self.directory.file("no-such-bundle.pem")
        if let systemBundle {
            bundlePath = self.directory.file("system.pem")
            try systemBundle.write(toFile: bundlePath, atomically: true, encoding: .utf8)
        }
        self.evaluator = TrustEvaluator(
            systemAnchorsPath: bundlePath,
            store: self.store,
            cacheSize: cacheSize,
            cacheTTL: .seconds(300),
            publicSuffixes: publicSuffixes,
            logger: Logger(label: "trust-tests", factory: { _ in SwiftLogNoOpLogHandler() })
        )
    }

    func evaluate(_ chain: [TestIdentity], host: String, now: Date = Date()) async -> TrustDecision {
        await self.evaluator.evaluate(chainDER: chain.map(\.der), host: host, now: now)
    }
}

/// A certificate made for a trust test, with its key and its DER.
struct MadeCertificate: Sendable {
    var certificate: Certificate
    var key: P256.Signing.PrivateKey
    var der: [UInt8]

    /// Its key identifier: the SHA-1 of its public key.
    var keyID: ArraySlice<UInt8> { Self.keyID(self.key) }

    static func keyID(_ key: P256.Signing.PrivateKey) -> ArraySlice<UInt8> {
        ArraySlice(Insecure.SHA1.hash(data: key.publicKey.x963Representation))
    }

    /// A certificate with exactly `extensions`, signed by `issuer` (nil: self-signed).
    static func sign(
        subject: DistinguishedName, issuer: MadeCertificate?, key: P256.Signing.PrivateKey, notBefore: Date, notAfter: Date,
        extensions: Certificate.Extensions
    ) throws -> MadeCertificate {
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: notBefore, notValidAfter: notAfter, issuer: issuer?.certificate.subject ?? subject,
            subject: subject, signatureAlgorithm: .ecdsaWithSHA256, extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(issuer?.key ?? key)
        )
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return MadeCertificate(certificate: certificate, key: key, der: serializer.serializedBytes)
    }
}
