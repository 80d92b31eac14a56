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

            // An origin's own 407 on a kept connection, which the direct relay passes on once it
            // has a pooled connection: its line names the request as the full path's does.
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            var ids = [try #require(mixed.header("Authbroker-Request-Id"))]
            #expect(try connection.request("GET", "http://origin.internal.test:\(origin.port)/hello").status == 200)
            let relayedBefore = try Self.relayedCount(daemon)
            for _ in 0..<3 {
                let proxyChallenge = try connection.request("GET", "http://origin.internal.test:\(origin.port)/offer-challenges/407")
                #expect(proxyChallenge.status == 407)
                ids.append(try #require(proxyChallenge.header("Authbroker-Request-Id")))
            }

            try await Task.sleep(for: .milliseconds(100))
            #expect(daemon.log.contains("removed challenges the client cannot answer"))
            #expect(daemon.log.contains("negotiate,ntlm"))
            #expect(daemon.log.contains("schemes=bearer"))
            let removals = daemon.log.split(separator: "\n").filter { $0.contains("removed challenges the client cannot answer") }
            for id in ids {
                #expect(removals.contains { $0.contains("request_id=\(id)") }, "no line names \(id): \(removals)")
            }
            #expect(try Self.relayedCount(daemon) > relayedBefore, "a 407 went through the direct relay")
        }
    }

    static func relayedCount(_ daemon: DaemonProcess) throws -> Int {
        let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
        return (status.json["counters"] as? [String: Any])?["requests_relayed_directly"] as? Int ?? -1
    }
}
