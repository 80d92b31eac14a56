import Foundation
import Testing

/// PAM run as an ordinary user, as a user service runs it: the probe authenticates the user it
/// runs as, and pam_unix checks that user's own password through the setgid helper unix_chkpwd.
@Suite("PAM as a non-root user (authbroker-pam-probe)", .serialized)
struct PAMProbeTests {
    private func probe(password: String, configDirectory: String = PAMFixture.configDirectory) throws -> (
        status: Int32, output: String, errors: String
    ) {
        let probe = PAMFixture.probePath
        try #require(FileManager.default.isExecutableFile(atPath: probe), "build the probe first: swift build --build-tests")
        return PAMFixture.run(
            "/usr/bin/setpriv",
            ["--reuid=\(PAMFixture.user)", "--regid=\(PAMFixture.user)", "--clear-groups", probe, configDirectory],
            input: password + "\n"
        )
    }

    @Test(
        "the shipped etc/pam.d/authbroker works with the system's common-auth and common-account",
        .enabled(if: PAMFixture.userReady, PAMFixture.skipReason),
        .enabled(if: FileManager.default.fileExists(atPath: "/etc/pam.d/common-auth"), "not a Debian-style PAM configuration")
    )
    func shippedServiceFile() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let directory = PAMFixture.configDirectory + "/shipped"
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
        // @include is resolved in the configuration directory, so the included files go beside it.
        for (source, name) in [
            (root.appendingPathComponent("etc/pam.d/authbroker").path, "authbroker"),
            ("/etc/pam.d/common-auth", "common-auth"), ("/etc/pam.d/common-account", "common-account"),
        ] {
            try FileManager.default.copyItem(atPath: source, toPath: directory + "/" + name)
            try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: directory + "/" + name)
        }
        let right = try self.probe(password: PAMFixture.password, configDirectory: directory)
        #expect(right.status == 0, "probe said: \(right.output) \(right.errors)")
        let wrong = try self.probe(password: PAMFixture.wrongPassword, configDirectory: directory)
        #expect(wrong.status == 1, "probe said: \(wrong.output) \(wrong.errors)")
        #expect(wrong.output.hasPrefix("authentication_failed"))
    }

    @Test("the right password succeeds", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func correctPassword() throws {
        let result = try self.probe(password: PAMFixture.password)
        #expect(result.status == 0, "probe said: \(result.output) \(result.errors)")
        #expect(result.output.hasPrefix("success"))
        #expect(!result.output.contains(PAMFixture.password))
        #expect(!result.errors.contains(PAMFixture.password))
    }

    @Test("a wrong password fails with 'authentication_failed'", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func wrongPassword() throws {
        let result = try self.probe(password: PAMFixture.wrongPassword)
        #expect(result.status == 1, "probe said: \(result.output) \(result.errors)")
        #expect(result.output.hasPrefix("authentication_failed"))
        #expect(!result.output.contains(PAMFixture.wrongPassword))
        #expect(!result.errors.contains(PAMFixture.wrongPassword))
    }

    @Test("an empty password is refused", .enabled(if: PAMFixture.userReady, PAMFixture.skipReason))
    func emptyPassword() throws {
        let result = try self.probe(password: "")
        #expect(result.status == 1, "probe said: \(result.output) \(result.errors)")
    }
}
