import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The daemon on the Secret Service when the keyring dies and comes back: it stays up, says
/// why secret operations fail, keeps serving what needs no secret, and recovers by itself.
@Suite(
    "Keyring failure under a running daemon",
    .enabled(if: ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] != nil, "needs a session bus: run under scripts/with-test-keyring (make test does)")
)
struct KeyringFailureTests {
    static let busName = "org.freedesktop.secrets"

    static func keyringPID() throws -> pid_t? {
        let reply = try ExternalCommand.run("/usr/bin/dbus-send", [
            "--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
            "org.freedesktop.DBus.GetConnectionUnixProcessID", "string:\(busName)",
        ])
        guard reply.status == 0, let last = reply.stdout.split(separator: " ").last else { return nil }
        return pid_t(last.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    static func waitForKeyring(present: Bool) async throws {
        for _ in 0..<200 {
            if (try keyringPID() != nil) == present { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        Issue.record("the keyring did not \(present ? "come back" : "go away") on the session bus")
    }

    /// Runs a command with stdin, stdout and stderr on /dev/null and waits for it. Not with
    /// Foundation's Process: the keyring daemon forks, and a child that inherited a pipe would
    /// keep a reader waiting for its end forever.
    static func spawnQuietly(_ executable: String, _ arguments: [String]) -> Int32 {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        for fd: Int32 in [0, 1, 2] {
            posix_spawn_file_actions_addopen(&actions, fd, "/dev/null", fd == 0 ? O_RDONLY : O_WRONLY, 0)
        }
        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        guard posix_spawn(&pid, executable, &actions, nil, argv, environ) == 0 else { return -1 }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        return (status >> 8) & 0xff
    }

    @Test("keyring killed: status and plain fetches work, passwords say why; restarted: they work again, no descriptor left over")
    func keyringDiesAndReturns() async throws {
        let origin = try await TestOrigin.start(name: "plain")
        defer { Task { await origin.stop() } }
        let config = configText(resolving: [("origin.internal.test", origin)], extra: "pool_idle_timeout_ms = 200\n[secrets]\nstore = \"secret-service\"\n")
        try await withDaemon(config: config) { daemon in
            let url = "https://keyring-\(UUID().uuidString.prefix(8).lowercased()).internal.test"
            let added = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", url, "--user", "alice", "--password-stdin", "--persistence", "permanent"],
                stdin: "Keyring-Secret-5\n"
            )
            #expect(added.status == 0, "\(added.stderr)")

            let descriptors = await daemon.settledFileDescriptorCount()
            guard let pid = try Self.keyringPID() else {
                Issue.record("no keyring on the session bus")
                return
            }
            kill(pid, SIGKILL)
            try await Self.waitForKeyring(present: false)

            #expect(try fetch(daemon, "http://origin.internal.test:\(origin.port)/hello").status == 200)
            #expect(try CLIAndClientsTests.ctl(daemon, ["status"]).status == 0)
            let refused = try CLIAndClientsTests.ctl(daemon, ["passwords", "list"])
            #expect(refused.status != 0)
            #expect(refused.stderr.lowercased().contains("secret service") || refused.stderr.lowercased().contains("keyring"), "\(refused.stderr)")
            #expect(!refused.stderr.contains("Keyring-Secret-5"))

            let password = ProcessInfo.processInfo.environment["AUTHBROKER_TEST_KEYRING_PASSWORD"] ?? "test-keyring-password"
            #expect(Self.spawnQuietly("/bin/sh", ["-c", "printf %s \"$0\" | gnome-keyring-daemon --unlock --components=secrets", password]) == 0)
            try await Self.waitForKeyring(present: true)

            let listed = try CLIAndClientsTests.ctl(daemon, ["passwords", "list"])
            #expect(listed.status == 0, "\(listed.stderr)")
            #expect(listed.stdout.contains("alice"))
            _ = try CLIAndClientsTests.ctl(daemon, ["passwords", "remove", url, "--user", "alice"])
            #expect(daemon.process.isRunning)
            let after = await daemon.waitForFileDescriptors(atMost: descriptors)
            #expect(after <= descriptors, "open descriptors: \(descriptors) before the keyring died, \(after) after it came back")
        }
    }
}
