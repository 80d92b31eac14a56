import Foundation
import Testing
import TestSupport

/// DESIGN.md: a client sees only the standard challenges it can answer.
@Suite("Challenges passed to clients")
struct ChallengeFilteringTests {
    @Test("a 401 offering Negotiate, Digest, Basic and NTLM reaches the client with Digest and Basic only; Bearer alone leaves none")
    func onlyBasicAndDigest() async throws {
        let origin = try await TestOrigin.start(name: "challenger")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let mixed = try fetch(daemon, "http://origin.internal.test:\(origin.port)/offer-challenges")
            #expect(mixed.status == 401)
            let offered = mixed.headers.filter { $0.0.lowercased() == "www-authenticate" }.map(\.1)
            #expect(offered.count == 2)
            #expect(offered.first?.hasPrefix("Digest ") == true)
            #expect(offered.first?.contains(#"realm="mixed@test""#) == true)
            #expect(offered.first?.contains(#"nonce="abc123""#) == true)
            #expect(offered.last?.hasPrefix("Basic ") == true)
            #expect(!offered.contains { $0.lowercased().contains("negotiate") || $0.lowercased().contains("ntlm") })

            let bearer = try fetch(daemon, "http://origin.internal.test:\(origin.port)/offer-challenges/bearer")
            #expect(bearer.status == 401)
            #expect(bearer.header("WWW-Authenticate") == nil)
            #expect(bearer.header("Proxy-Status") == nil)

            try await Task.sleep(for: .milliseconds(100))
            #expect(daemon.log.contains("removed challenges the client cannot answer"))
            #expect(daemon.log.contains("negotiate,ntlm"))
            #expect(daemon.log.contains("schemes=bearer"))
        }
    }
}
