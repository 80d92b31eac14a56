import Foundation
import Logging
import NIOConcurrencyHelpers
import Testing

@testable import AuthBrokerPAM

/// The real-PAM test environment: a test user with a known password, a private PAM
/// configuration directory (pam_start_confdir), and the probe executable.
enum PAMFixture {
    static let user = "abtestpam"
    static let password = "known-test-password"
    static let wrongPassword = "not-the-password-42"

    static let skipReason: Comment =
        "needs root: creating the test user 'abtestpam' and checking another user's password through pam_unix (which reads /etc/shadow) need root"

    /// Whether the test user exists with the known password: created (as root) on first use.
    static var userReady: Bool { self.setUp }

    private static let setUp: Bool = {
        guard getuid() == 0 else { return false }
        if getpwnam(Self.user) == nil {
            guard run("/usr/sbin/useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", Self.user]).status == 0
            else { return false }
        }
        return run("/usr/sbin/chpasswd", [], input: "\(Self.user):\(Self.password)\n").status == 0
    }()

    /// A private PAM configuration directory, readable by everyone (the probe runs as the test
    /// user), holding:
    /// - `authbroker`: pam_unix for auth and account, as on a real system;
    /// - `authbroker-deny-account`: pam_unix auth, then an account check that always refuses;
    /// - `authbroker-info`: an information message (pam_echo) before pam_unix's prompt.
    /// Named for this process (`/tmp/abpam-<pid>-…`); directories of test runs that have
    /// ended are removed first, as Swift Testing has no suite-wide teardown.
    static let configDirectory: String = {
        let leftovers = (try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? []
        for name in leftovers where name.hasPrefix("abpam-") {
            let parts = name.split(separator: "-")
            if parts.count == 3, let pid = Int32(parts[1]), kill(pid, 0) != 0, errno == ESRCH {
                try? FileManager.default.removeItem(atPath: "/tmp/" + name)
            }
        }
        var template = Array("/tmp/abpam-\(getpid())-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { return "/nonexistent-pam-config" }
        let directory = String(cString: made)
        chmod(directory, 0o755)
        let services = [
            "authbroker": "auth required pam_unix.so\naccount required pam_unix.so\n",
            "authbroker-deny-account": "auth required pam_unix.so\naccount required pam_deny.so\n",
            "authbroker-info": "auth optional pam_echo.so Welcome to the test\nauth required pam_unix.so\naccount required pam_unix.so\n",
        ]
        for (name, text) in services {
            let path = directory + "/" + name
            _ = FileManager.default.createFile(atPath: path, contents: Data(text.utf8), attributes: [.posixPermissions: 0o644])
        }
        return directory
    }()

    static func authenticator(
        service: String = "authbroker", promptTimeout: Duration = .seconds(10), logger: Logger = Logger(label: "test.pam")
    ) -> PAMAuthenticator {
        PAMAuthenticator(
            configuration: .init(service: service, configDirectory: Self.configDirectory, promptTimeout: promptTimeout),
            logger: logger
        )
    }

    /// The built `authbroker-pam-probe`: `$AUTHBROKER_BIN_DIR`, beside the test bundle, or the
    /// package's debug build.
    static var probePath: String {
        let name = "authbroker-pam-probe"
        if let explicit = ProcessInfo.processInfo.environment["AUTHBROKER_BIN_DIR"] { return explicit + "/" + name }
        for candidate in [CommandLine.arguments.first, Bundle.main.executablePath].compactMap({ $0 }) {
            var url = URL(fileURLWithPath: candidate).deletingLastPathComponent()
            for _ in 0..<4 {
                let path = url.appendingPathComponent(name).path
                if FileManager.default.isExecutableFile(atPath: path) { return path }
                url = url.deletingLastPathComponent()
            }
        }
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug/" + name).path
    }

    /// Runs a program to completion, `input` on its stdin; its exit status is -1 if it could
    /// not start.
    static func run(_ executable: String, _ arguments: [String], input: String? = nil) -> (status: Int32, output: String, errors: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        do { try process.run() } catch { return (-1, "", "\(error)") }
        if let input { stdin.fileHandleForWriting.write(Data(input.utf8)) }
        try? stdin.fileHandleForWriting.close()
        let output = stdout.fileHandleForReading.readDataToEndOfFile()
        let errors = stderr.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: output, as: UTF8.self), String(decoding: errors, as: UTF8.self))
    }
}

/// Collects every log line (message and metadata) so tests can search them.
final class LogCapture: Sendable {
    private let lines = NIOLockedValueBox<[String]>([])

    var text: String { self.lines.withLockedValue { $0.joined(separator: "\n") } }

    var logger: Logger {
        var logger = Logger(label: "test.pam") { _ in CapturingLogHandler(capture: self) }
        logger.logLevel = .trace
        return logger
    }

    fileprivate func append(_ line: String) {
        self.lines.withLockedValue { $0.append(line) }
    }
}

private struct CapturingLogHandler: LogHandler {
    let capture: LogCapture
    var metadata: Logger.Metadata = [:]
    var logLevel: Logger.Level = .trace

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged = self.metadata.merging(event.metadata ?? [:]) { $1 }
        self.capture.append("\(event.level) \(event.message) \(merged)")
    }
}

/// Records the prompts a responder was given.
final class PromptLog: Sendable {
    private let prompts = NIOLockedValueBox<[PAMPrompt]>([])
    var all: [PAMPrompt] { self.prompts.withLockedValue { $0 } }
    func append(_ prompt: PAMPrompt) { self.prompts.withLockedValue { $0.append(prompt) } }
}
