import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import AuthBrokerTrust
import Foundation
import Logging
import NIOHTTP1
import Testing
import TestSupport

/// What the daemon remembers per origin stays bounded when an origin varies its realm on every
/// response (a hostile origin, or one that puts a request id in the realm).
@Suite("Remembered protection spaces")
struct RememberedSpacesTests {
    @Test("an origin that changes its Digest realm each time: the tables stay within max_auth_spaces, the newest is kept")
    func varyingRealmIsBounded() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let logger = Logger(label: "remembered-spaces-tests", factory: { _ in SwiftLogNoOpLogHandler() })
        let store = try TrustStore(path: directory + "/trust.json")
        let evaluator = TrustEvaluator(
            systemAnchorsPath: directory + "/no-bundle.pem", store: store, cacheSize: 8, cacheTTL: .seconds(60), logger: logger
        )
        let vault = PasswordVault()
        let challenges = AgentChallenges(vault: vault, store: store, evaluator: evaluator, logger: logger)
        let authenticator = HTTPAuthenticator(vault: vault, challenges: challenges, maxAuthSpaces: 16, logger: logger)
        let origins = try (0..<3).map { try CanonicalOrigin(parsing: "http://realms\($0).test") }
        for origin in origins {
            try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw"), persistence: .session)
        }

        for round in 0..<200 {
            let origin = origins[round % origins.count]
            var challenge = HTTPHeaders()
            challenge.add(name: "WWW-Authenticate", value: "Digest realm=\"request-\(round)\", nonce=\"n\(round)\", qop=\"auth\", algorithm=SHA-256")
            var state = RequestAuthState(headers: HTTPHeaders())
            let answered = await authenticator.answerChallenge(
                HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: challenge),
                origin: origin, method: .GET, uri: "/r\(round)", resendableBody: .bytes([]), state: &state
            )
            #expect(answered, "round \(round)")
            authenticator.responseAccepted(HTTPResponseHead(version: .http1_1, status: .ok), origin: origin, uri: "/r\(round)", state: state)
        }
        let counts = authenticator.rememberedCounts
        #expect(counts.digestSessions <= 16)
        #expect(counts.acceptances <= 16)
        #expect(counts.authorities <= 16)
        #expect(counts.digestSessions == 16, "the table is used up to its bound, not emptied")

        // The most recently used origin is still known.
        #expect(authenticator.knowsSpaces(at: origins[199 % origins.count]))
    }
}
