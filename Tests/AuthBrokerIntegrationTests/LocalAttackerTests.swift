import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Another local user tries to take the daemon's place under the `/tmp` fallback (no
/// `XDG_RUNTIME_DIR`, no usable `HOME`: su, cron, containers). The fallback base is `$TMPDIR`, a
/// sticky world-writable directory each test makes, so the attacks are the real ones without
/// touching the machine's `/tmp`. The attacker is a second real user acting through `setpriv`.
@Suite("Another local user", .enabled(if: TestUser.canCreate, "making the attacker user needs root"), .serialized)
struct LocalAttackerTests {
    static func attacker() throws -> TestUser {
        try TestUser.ensure(name: "abtestother", password: "attacker-\(UInt32.random(in: 0...UInt32.max))")
    }

    /// A stand-in for `/tmp`: mode 1777, owned by root.
    static func makeSharedTemporaryDirectory() throws -> String {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        guard chmod(directory, 0o1777) == 0 else { throw TestSupportError("chmod 1777 \(directory) failed") }
        return directory
    }

    /// Runs `arguments` as `user`, failing the test if the command fails.
    static func asUser(_ user: TestUser, _ arguments: [String]) throws {
        let result = try CLIAndClientsTests.run("/usr/bin/setpriv", user.setprivArguments + arguments)
        guard result.status == 0 else {
            throw TestSupportError("\(arguments.joined(separator: " ")) as \(user.name) failed: \(result.stderr)")
        }
    }

    /// The environment of a user session without `XDG_RUNTIME_DIR` (and, with `withoutHome`,
    /// without `HOME` and the XDG state and data directories), with `tmp` as `$TMPDIR`.
    static func fallbackEnvironment(tmp: String, configHome: String, withoutHome: Bool) -> [String: String] {
        var environment = ProcessInfo.processInfo.environment
        for key in ["XDG_RUNTIME_DIR", "AUTHBROKER_SOCKET", "AUTHBROKER_CONFIG"] { environment.removeValue(forKey: key) }
        if withoutHome {
            for key in ["HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"] { environment.removeValue(forKey: key) }
        }
        environment["TMPDIR"] = tmp
        environment["XDG_CONFIG_HOME"] = configHome
        return environment
    }

    /// Starts the daemon expecting it to refuse; returns its log.
    static func expectRefusedStart(tmp: String, removing: [String]) async throws -> String {
        do {
            let daemon = try await DaemonProcess.start(extraEnvironment: ["TMPDIR": tmp], removingEnvironment: removing)
            await daemon.stop()
            daemon.cleanUp()
            Issue.record("the daemon started although its directory was planted")
            return ""
        } catch let error as TestSupportError {
            return error.description
        }
    }

    @Test("a symlink planted at /tmp/authbroker-<uid> is refused: the daemon never binds in the shared directory")
    func symlinkedFallbackRefused() async throws {
        let attacker = try Self.attacker()
        let tmp = try Self.makeSharedTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: tmp) }
        let fallback = tmp + "/authbroker-\(getuid())"
        try Self.asUser(attacker, ["/bin/ln", "-s", tmp, fallback])

        let log = try await Self.expectRefusedStart(tmp: tmp, removing: ["XDG_RUNTIME_DIR"])
        #expect(log.contains("symbolic link"), "\(log)")
        #expect(log.contains(fallback))
        #expect(!FileManager.default.fileExists(atPath: tmp + "/authbroker.sock"), "the daemon bound in the shared directory")
    }

    @Test("a fallback directory another user made first is refused, with who owns it")
    func fallbackMadeByAnotherUserRefused() async throws {
        let attacker = try Self.attacker()
        let tmp = try Self.makeSharedTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: tmp) }
        try Self.asUser(attacker, ["/bin/mkdir", "-m", "777", tmp + "/authbroker-\(getuid())"])

        let log = try await Self.expectRefusedStart(tmp: tmp, removing: ["XDG_RUNTIME_DIR"])
        #expect(log.contains("belongs to uid \(attacker.uid)"), "\(log)")
    }

    @Test("with HOME unusable, a trust.json planted under the /tmp fallback is never loaded")
    func plantedTrustStoreRefused() async throws {
        let attacker = try Self.attacker()
        let tmp = try Self.makeSharedTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: tmp) }
        let fallback = tmp + "/authbroker-\(getuid())"
        try Self.asUser(attacker, ["/bin/mkdir", "-m", "755", "-p", fallback + "/state"])
        let planted = fallback + "/state/trust.json"
        try Self.asUser(attacker, ["/bin/sh", "-c", "echo '{\"version\":1,\"anchors\":[],\"pins\":[]}' > '\(planted)'"])

        // The socket stays in XDG_RUNTIME_DIR; only the state falls back.
        let log = try await Self.expectRefusedStart(tmp: tmp, removing: ["HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"])
        #expect(log.contains("belongs to uid \(attacker.uid)"), "\(log)")
        #expect(log.contains(fallback), "\(log)")
    }

    @Test("the fallback still works when it is the user's own: private directory, socket, CLI")
    func privateFallbackWorks() async throws {
        let tmp = try Self.makeSharedTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: tmp) }
        let daemon = try await DaemonProcess.start(
            extraEnvironment: ["TMPDIR": tmp], removingEnvironment: ["XDG_RUNTIME_DIR", "HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"]
        )
        defer { daemon.cleanUp() }
        let fallback = tmp + "/authbroker-\(getuid())"
        #expect(daemon.socketPath == fallback + "/authbroker.sock")
        var info = stat()
        #expect(lstat(fallback, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700)
        #expect(FileManager.default.fileExists(atPath: fallback + "/state/audit.jsonl"))

        let environment = Self.fallbackEnvironment(tmp: tmp, configHome: daemon.directory + "/config", withoutHome: true)
        let status = try CLIAndClientsTests.run(DaemonProcess.binDirectory + "/authbrokerctl", ["status"], environment: environment)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.stdout.contains(daemon.socketPath))
        await daemon.stop()
    }

    @Test(
        "authbrokerctl sends nothing to another user's socket: not a stored password, not the login password",
        arguments: [
            ["passwords", "add", "https://git.corp.test", "--user", "alice", "--password-stdin"],
            ["passwords", "show", "https://git.corp.test", "--user", "alice", "--login-password-stdin"],
        ]
    )
    func ctlRefusesAnImpostor(_ arguments: [String]) async throws {
        let attacker = try Self.attacker()
        let tmp = try Self.makeSharedTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: tmp) }
        let fallback = tmp + "/authbroker-\(getuid())"
        try Self.asUser(attacker, ["/bin/mkdir", "-m", "755", fallback])
        let impostor = try ImpostorListener(user: attacker, socketPath: fallback + "/authbroker.sock", recordDirectory: fallback)
        defer { impostor.stop() }

        let secret = "hunter2-\(UInt32.random(in: 0...UInt32.max))"
        let configHome = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: configHome) }
        let environment = Self.fallbackEnvironment(tmp: tmp, configHome: configHome, withoutHome: false)
        let result = try CLIAndClientsTests.run(
            DaemonProcess.binDirectory + "/authbrokerctl", arguments, stdin: secret + "\n", environment: environment
        )
        #expect(result.status != 0)
        #expect(result.stderr.contains("refusing to use \(fallback)/authbroker.sock"), "\(result.stderr)")
        #expect(result.stderr.contains("uid \(attacker.uid)"), "\(result.stderr)")
        #expect(try await impostor.receivedPerConnection(waitingFor: 1) == [0])
        #expect(impostor.received.isEmpty)
        #expect(!result.stderr.contains(secret))
    }
}
