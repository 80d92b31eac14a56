import Foundation
import Testing
import TestSupport

/// What `authbrokerctl passwords add` does by default: a stored password survives a restart;
/// `--session` keeps one in memory only; an empty password (and an empty user name) is a
/// password like any other, as API tokens sent with Basic often need.
@Suite("passwords add: where a password is kept, and empty ones")
struct PasswordDefaultsTests {
    static func config(_ origin: TestAuthOrigin) -> String {
        "[upstream]\nresolve = [\"auth.internal.test:\(origin.port):127.0.0.1\"]\n"
    }

    static func listed(_ daemon: DaemonProcess) throws -> [[String: Any]] {
        let list = try CLIAndClientsTests.ctl(daemon, ["passwords", "list", "--json"])
        #expect(list.status == 0, "\(list.stderr)")
        let object = try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [String: Any]
        return object?["passwords"] as? [[String: Any]] ?? []
    }

    @Test("by default a password is kept in the secret store and survives a restart; --session does not")
    func permanentByDefault() async throws {
        let origin = try await TestAuthOrigin.start(name: "kept", user: "alice", password: "Kept-Across-Restarts")
        defer { Task { await origin.stop() } }
        let base = "http://auth.internal.test:\(origin.port)"
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withDaemon(config: Self.config(origin), directory: directory, keepDirectory: true) { daemon in
            let added = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", base, "--user", "alice", "--password-stdin"], stdin: "Kept-Across-Restarts\n"
            )
            #expect(added.status == 0, "\(added.stderr)")
            #expect(added.stdout.contains("(permanent)"), "\(added.stdout)")
            let session = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", base, "--user", "bob", "--password-stdin", "--session"], stdin: "only-for-now\n"
            )
            #expect(session.status == 0, "\(session.stderr)")
            #expect(session.stdout.contains("(session)"), "\(session.stdout)")
            let rows = try Self.listed(daemon)
            #expect(Set(rows.compactMap { $0["persistence"] as? String }) == ["permanent", "session"])

            let contradiction = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", base, "--user", "carol", "--password-stdin", "--session", "--persistence", "permanent"],
                stdin: "x\n"
            )
            #expect(contradiction.status == 64)
            #expect(contradiction.stderr.contains("contradict"))
        }
        try await withDaemon(config: Self.config(origin), directory: directory, keepDirectory: true) { daemon in
            let rows = try Self.listed(daemon)
            #expect(rows.map { $0["user"] as? String } == ["alice"], "\(rows)")
            let response = try fetch(daemon, "http://auth.internal.test:\(origin.port)/basic/file.txt")
            #expect(response.status == 200, "\(response.text)")
            #expect(response.text == "hello alice")
        }
    }

    @Test(
        "an empty password, and an empty user name, are stored and answered with",
        arguments: [("token-as-user-0123456789", ""), ("", "token-as-password-0123456789"), ("", "")]
    )
    func emptyParts(user: String, password: String) async throws {
        let origin = try await TestAuthOrigin.start(name: "empty", user: user, password: password)
        defer { Task { await origin.stop() } }
        let base = "http://auth.internal.test:\(origin.port)"
        try await withDaemon(config: Self.config(origin)) { daemon in
            let added = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", base, "--user", user, "--password-stdin"], stdin: password + "\n"
            )
            #expect(added.status == 0, "\(added.stderr)")
            for path in ["/basic/file.txt", "/digest/SHA-256/auth/file.txt"] {
                let response = try fetch(daemon, base + path)
                #expect(response.status == 200, "\(path): \(response.text)")
                #expect(response.text == "hello \(user)")
            }
        }
    }
}
