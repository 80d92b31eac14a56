import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Revealing a secret needs the user's login password through PAM (DESIGN.md: PAM). The daemon
/// runs as a test user with a known password, as a real user service runs as its user, and
/// pam_unix checks that user's own password through its setgid helper.
@Suite("Reveal behind PAM", .enabled(if: TestUser.canCreate, "making the test user needs root"))
struct RevealTests {
    static let secret = "s3cret-Value-9f1c"

    /// authbrokerctl as the test user, on the daemon's socket.
    static func ctl(_ daemon: DaemonProcess, user: TestUser, _ arguments: [String], stdin: String) throws -> CLIAndClientsTests.Run {
        try CLIAndClientsTests.run(
            "/usr/bin/setpriv",
            user.setprivArguments + [DaemonProcess.binDirectory + "/authbrokerctl"] + arguments + ["--socket", daemon.socketPath],
            stdin: stdin
        )
    }

    @Test("passwords show asks for the login password: wrong is refused, right reveals; no secret reaches the log")
    func showNeedsLoginPassword() async throws {
        let user = try TestUser.pamUser()
        let pamDirectory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: pamDirectory) }
        try "auth required pam_unix.so\naccount required pam_unix.so\n"
            .write(toFile: pamDirectory + "/authbroker", atomically: true, encoding: .utf8)
        chmod(pamDirectory, 0o755)
        let config = "[security]\npam_config_dir = \"\(pamDirectory)\"\nreauth_grant_seconds = 60\n"
        let daemon = try await DaemonProcess.start(config: config, user: user)
        defer { daemon.cleanUp() }
        do {
            let added = try Self.ctl(
                daemon, user: user, ["passwords", "add", "https://git.corp.test", "--user", "alice", "--password-stdin"],
                stdin: Self.secret + "\n"
            )
            #expect(added.status == 0, "\(added.stderr)")

            // No terminal to ask on (a new session has none) and no --login-password-stdin: refused
            // before a dialogue begins, which would hold the user's one attempt until its prompt
            // timed out (the next command below would meet "under way").
            let noTerminal = try CLIAndClientsTests.run(
                "/usr/bin/setsid",
                ["-w", "/usr/bin/setpriv"] + user.setprivArguments + [
                    DaemonProcess.binDirectory + "/authbrokerctl", "passwords", "show", "https://git.corp.test", "--user", "alice",
                    "--socket", daemon.socketPath,
                ]
            )
            #expect(noTerminal.status != 0)
            #expect(noTerminal.stderr.contains("no terminal to ask on"), "\(noTerminal.stderr)")

            let wrong = try Self.ctl(
                daemon, user: user, ["passwords", "show", "https://git.corp.test", "--user", "alice", "--login-password-stdin"],
                stdin: "not-the-login-password\n"
            )
            #expect(wrong.status != 0)
            #expect(wrong.stdout.isEmpty)
            #expect(wrong.stderr.contains("refused"), "\(wrong.stderr)")
            #expect(!wrong.stderr.contains("under way"), "\(wrong.stderr)")
            #expect(!wrong.stderr.contains(Self.secret))

            let right = try Self.ctl(
                daemon, user: user, ["passwords", "show", "https://git.corp.test", "--user", "alice", "--login-password-stdin"],
                stdin: user.password + "\n"
            )
            #expect(right.status == 0, "\(right.stderr)")
            #expect(right.stdout == Self.secret + "\n")

            // A process that did not re-authenticate gets nothing from the control API.
            let refused = try CLIAndClientsTests.run(
                "/usr/bin/setpriv",
                user.setprivArguments + [
                    "/usr/bin/curl", "-s", "-w", "\n%{http_code}", "--unix-socket", daemon.socketPath, "-X", "POST",
                    "-H", "Content-Type: application/json", "-d", #"{"url":"https://git.corp.test","user":"alice"}"#,
                    "http://localhost/v1/passwords/reveal",
                ]
            )
            #expect(refused.stdout.hasSuffix("\n403"), "\(refused.stdout)")
            #expect(refused.stdout.contains("reauthentication_required"))
            #expect(!refused.stdout.contains(Self.secret))

            // identities export is behind the same gate: it writes what was imported, 0600.
            let client = try TestPKI.makeClient(commonName: "alice", issuer: try TestPKI.makeCA(commonName: "Export CA"))
            let cert = daemon.directory + "/id.crt", key = daemon.directory + "/id.key"
            try client.pem.write(toFile: cert, atomically: true, encoding: .utf8)
            try client.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
            try user.own(daemon.directory)
            let imported = try Self.ctl(
                daemon, user: user, ["identities", "import", "--cert", cert, "--key", key, "--name", "laptop"], stdin: ""
            )
            #expect(imported.status == 0, "\(imported.stderr)")
            let exportPath = daemon.directory + "/exported.pem"
            let refusedExport = try Self.ctl(
                daemon, user: user, ["identities", "export", "laptop", "-o", exportPath, "--login-password-stdin"],
                stdin: "not-the-login-password\n"
            )
            #expect(refusedExport.status != 0)
            #expect(!FileManager.default.fileExists(atPath: exportPath))
            let exported = try Self.ctl(
                daemon, user: user, ["identities", "export", "laptop", "-o", exportPath, "--login-password-stdin"],
                stdin: user.password + "\n"
            )
            #expect(exported.status == 0, "\(exported.stderr)")
            // A PEM export is the chain, then the key: a whole identity that imports again.
            let exportedPEM = (try? String(contentsOfFile: exportPath, encoding: .utf8)) ?? ""
            #expect(exportedPEM.hasPrefix("-----BEGIN CERTIFICATE-----"))
            #expect(exportedPEM.hasSuffix(client.privateKeyPEM))
            #expect(exported.stdout.contains("not encrypted"))
            let reimported = try Self.ctl(
                daemon, user: user, ["identities", "import", "--cert", exportPath, "--key", exportPath, "--name", "again"], stdin: ""
            )
            #expect(reimported.status == 0, "\(reimported.stderr)")
            let mode = (try? FileManager.default.attributesOfItem(atPath: exportPath)[.posixPermissions] as? Int) ?? 0
            #expect(mode == 0o600)

            await daemon.stop()
            let log = daemon.log
            #expect(log.contains("re-authenticated"))
            #expect(!log.contains(Self.secret))
            #expect(!log.contains(user.password))
            #expect(!log.contains("not-the-login-password"))
            #expect(!log.contains("PRIVATE KEY"))
        } catch {
            await daemon.stop()
            print("authbrokerd log:\n\(daemon.log)")
            throw error
        }
    }
}
