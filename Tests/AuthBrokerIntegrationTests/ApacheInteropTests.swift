import Foundation
import Testing
import TestSupport

/// Interop with a real server: Apache httpd's mod_auth_basic and mod_auth_digest (Debian's
/// apache2, started on loopback by the fixture) answered by the daemon from a stored password.
@Suite("Apache httpd interop", .enabled(if: ApacheAuthServer.isInstalled, "apache2 is not installed (scripts/install-deps test installs it)"))
struct ApacheInteropTests {
    @Test("the daemon answers mod_auth_basic and mod_auth_digest from the store; repeats skip the 401")
    func basicAndDigest() async throws {
        let apache = try await ApacheAuthServer.start(user: "alice", password: "Apache-Secret-7")
        defer { Task { await apache.stop() } }
        let config = "[upstream]\nresolve = [\"apache.internal.test:\(apache.port):127.0.0.1\"]\n"
        try await withDaemon(config: config) { daemon in
            let base = "http://apache.internal.test:\(apache.port)"
            let stored = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/passwords", headers: [("Content-Type", "application/json")],
                body: jsonBody(["url": base, "user": "alice", "password": "Apache-Secret-7", "persistence": "session"])
            )
            #expect(stored.status == 201)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for path in ["/basic/", "/digest/"] {
                for round in 0..<5 {
                    let response = try connection.request("GET", base + path)
                    #expect(response.status == 200, "\(path) round \(round): \(response.status) \(response.text)")
                }
            }
            // Without the stored password the app gets Apache's challenge.
            let unstored = try fetch(daemon, "http://127.0.0.1:\(apache.port)/digest/")
            #expect(unstored.status == 401)
            #expect(unstored.header("WWW-Authenticate")?.hasPrefix("Digest ") == true)
            let log = daemon.log
            #expect(log.components(separatedBy: "answered the origin's challenge from the store").count - 1 == 2)
        }
    }
}
