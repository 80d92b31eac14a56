import Foundation
import Testing

/// PAM run as an ordinary user, as a user service runs it: the probe authenticates the user it
/// runs as, and pam_unix checks that user's own password through the setgid helper unix_chkpwd.
@Suite("PAM as a non-root user (authbroker-pam-probe)", .serialized)
struct PAMProbeTests {
    private func probe(password: String) throws -> (status: Int32, output: String, errors: String) {
        let probe = PAMFixture.probePath
        try #require(FileManager.default.isExecutableFile(atPath: probe), "build the probe first: swift build --build-tests")
        return PAMFixture.run(
            "/usr/bin/setpriv",
            ["--reuid=\(PAMFixture.user)", "--regid=\(PAMFixture.user)", "--clear-groups", probe, PAMFixture.configDirectory],
            input: password + "\n"
        )
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
