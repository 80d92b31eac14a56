import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import Logging
import TestSupport

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
