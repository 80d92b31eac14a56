import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The real `authbrokerd` binary, started for one test on a temporary socket with its own
/// XDG directories, config file and log.
package final class DaemonProcess: @unchecked Sendable {  // mutable only in start/stop, which tests call from one task
    package let directory: String
    package let socketPath: String
    package let logPath: String
    package let configPath: String
    package let process: Process
    package let environment: [String: String]

    private init(directory: String, socketPath: String, logPath: String, configPath: String, process: Process, environment: [String: String]) {
        self.directory = directory
        self.socketPath = socketPath
        self.logPath = logPath
        self.configPath = configPath
        self.process = process
        self.environment = environment
    }

    /// Where the built executables are: `$AUTHBROKER_BIN_DIR`, else beside the test bundle.
    package static var binDirectory: String {
        if let explicit = ProcessInfo.processInfo.environment["AUTHBROKER_BIN_DIR"] { return explicit }
        let candidates = [CommandLine.arguments.first, Bundle.main.executablePath].compactMap { $0 }
        for candidate in candidates {
            var url = URL(fileURLWithPath: candidate).deletingLastPathComponent()
            for _ in 0..<4 {
                if FileManager.default.isExecutableFile(atPath: url.appendingPathComponent("authbrokerd").path) {
                    return url.path
                }
                url = url.deletingLastPathComponent()
            }
        }
        // The package root's debug build, found from this file's path.
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        return root.appendingPathComponent(".build/debug").path
    }

    /// A fresh temporary directory with a short path (socket paths are limited to 107 bytes).
    package static func makeTemporaryDirectory() throws -> String {
        var template = Array("/tmp/abt-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else {
            throw TestSupportError("mkdtemp failed: \(String(cString: strerror(errno)))")
        }
        return String(cString: made)
    }

    /// Starts the daemon and waits until its socket accepts connections.
    /// - Parameters:
    ///   - config: the text of `config.toml` (written to `$XDG_CONFIG_HOME/authbroker/config.toml`).
    ///   - directory: reuse a directory (and so the state) of an earlier daemon.
    ///   - user: run as this (test) user through `setpriv`; the directory is handed to it.
    ///   - removingEnvironment: variables to unset after the test's own are set (to make the
    ///     daemon fall back as it does without `XDG_RUNTIME_DIR` or `HOME`).
    package static func start(
        config: String = "", directory: String? = nil, extraArguments: [String] = [],
        extraEnvironment: [String: String] = [:], removingEnvironment: [String] = [], user: TestUser? = nil,
        socket: String? = nil
    ) async throws -> DaemonProcess {
        let directory = try directory ?? makeTemporaryDirectory()
        let runtime = directory + "/run"
        let configHome = directory + "/config"
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.createDirectory(atPath: configHome + "/authbroker", withIntermediateDirectories: true)
        let configPath = configHome + "/authbroker/config.toml"
        // Each daemon keeps secrets in its own encrypted file unless the test asks for another
        // store: the test keyring is shared by every test in the run.
        var isolated = config.contains("[secrets]") ? config : config + "\n[secrets]\nstore = \"file\"\n"
        // Tests use ephemeral ports: the user's fixed proxy port may be another daemon's.
        if !config.contains("[proxy]") { isolated += "\n[proxy]\nlisten = [\"127.0.0.1:0\"]\n" }
        try isolated.write(toFile: configPath, atomically: true, encoding: .utf8)
        let logPath = directory + "/daemon.log"
        guard FileManager.default.createFile(atPath: logPath, contents: nil) else {
            throw TestSupportError("cannot create \(logPath)")
        }

        var environment = ProcessInfo.processInfo.environment
        for key in ["AUTHBROKER_SOCKET", "AUTHBROKER_CONFIG", "LISTEN_PID", "LISTEN_FDS", "NOTIFY_SOCKET", "JOURNAL_STREAM"] {
            environment.removeValue(forKey: key)
        }
        environment["XDG_RUNTIME_DIR"] = runtime
        environment["XDG_CONFIG_HOME"] = configHome
        environment["XDG_STATE_HOME"] = directory + "/state"
        environment["XDG_DATA_HOME"] = directory + "/data"
        environment["HOME"] = directory
        environment.merge(extraEnvironment) { _, new in new }
        for key in removingEnvironment { environment.removeValue(forKey: key) }
        // Where the daemon puts its socket when nobody names one (BrokerPaths.defaultSocketPath).
        let fallbackSocket = "\(environment["TMPDIR"] ?? "/tmp")/authbroker-\(user?.uid ?? getuid())/authbroker.sock"
        let socketPath = socket ?? (environment["XDG_RUNTIME_DIR"] == nil ? fallbackSocket : runtime + "/authbroker/authbroker.sock")

        let process = Process()
        let arguments = ["--log-level", "debug"] + (socket.map { ["--socket", $0] } ?? []) + extraArguments
        if let user {
            try user.own(directory)
            process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            process.arguments = user.setprivArguments + [binDirectory + "/authbrokerd"] + arguments
        } else {
            process.executableURL = URL(fileURLWithPath: binDirectory + "/authbrokerd")
            process.arguments = arguments
        }
        process.environment = environment
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        process.standardError = log
        process.standardOutput = log
        try process.run()
        let daemon = DaemonProcess(
            directory: directory, socketPath: socketPath, logPath: logPath, configPath: configPath,
            process: process, environment: environment
        )
        try await daemon.waitUntilListening()
        return daemon
    }

    package var pid: Int32 { self.process.processIdentifier }

    /// The proxy port, as `/v1/status` reports it (the first address).
    package func proxyPort() throws -> Int {
        let status = try UnixSocketConnection(path: self.socketPath).request("GET", "/v1/status")
        guard let addresses = status.json["proxy_port"] as? [String], let first = addresses.first,
            let port = first.split(separator: ":").last.flatMap({ Int($0) })
        else { throw TestSupportError("the daemon reports no proxy port: \(status.text)") }
        return port
    }

    /// Waits (up to a minute, so a broken daemon fails the test instead of hanging it) for the socket.
    package func waitUntilListening(path: String? = nil) async throws {
        let path = path ?? self.socketPath
        for _ in 0..<1200 {
            if !self.process.isRunning {
                throw TestSupportError("authbrokerd exited with \(self.process.terminationStatus) before listening:\n\(self.log)")
            }
            if let connection = try? UnixSocketConnection(path: path) {
                connection.close()
                return
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw TestSupportError("authbrokerd did not listen on \(path) within a minute:\n\(self.log)")
    }

    package var log: String {
        (try? String(contentsOfFile: self.logPath, encoding: .utf8)) ?? ""
    }

    /// Sends SIGTERM and returns the exit status.
    @discardableResult
    package func stop() async -> Int32 {
        if self.process.isRunning {
            kill(self.process.processIdentifier, SIGTERM)
        }
        return await self.waitForExit()
    }

    package func waitForExit() async -> Int32 {
        for _ in 0..<1200 where self.process.isRunning {
            try? await Task.sleep(for: .milliseconds(50))
        }
        if self.process.isRunning {
            kill(self.process.processIdentifier, SIGKILL)
            self.process.waitUntilExit()
            return -9
        }
        return self.process.terminationStatus
    }

    /// The daemon's resident set size in KiB, from /proc.
    package var residentKiB: Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(self.pid)/status", encoding: .utf8) else { return nil }
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "")
        }
        return nil
    }

    /// What the daemon's open file descriptors point at (`/proc/PID/fd`), by number.
    package var openFileDescriptors: [Int: String] {
        let directory = "/proc/\(self.pid)/fd"
        var result: [Int: String] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] {
            guard let number = Int(name) else { continue }
            result[number] = (try? FileManager.default.destinationOfSymbolicLink(atPath: directory + "/" + name)) ?? "?"
        }
        return result
    }

    /// The daemon's open file descriptors that a leak would show in: all but timer descriptors,
    /// which libdispatch makes once per clock, the first time a timer on that clock is armed, and
    /// keeps for good (so a first fault may add one, and no later one adds more).
    package var countedFileDescriptors: Int {
        self.openFileDescriptors.values.filter { $0 != "anon_inode:[timerfd]" }.count
    }

    /// The daemon's count of counted file descriptors once it has stopped changing (connections
    /// that just ended are closed a moment later), for a baseline.
    package func settledFileDescriptorCount() async -> Int {
        var count = self.countedFileDescriptors
        for _ in 0..<50 {
            try? await Task.sleep(for: .milliseconds(300))
            let next = self.countedFileDescriptors
            if next == count { break }
            count = next
        }
        return count
    }

    /// Waits (up to `seconds`) until the daemon has at most `limit` counted file descriptors;
    /// returns the last count seen.
    package func waitForFileDescriptors(atMost limit: Int, seconds: Int = 10) async -> Int {
        var count = self.countedFileDescriptors
        for _ in 0..<(seconds * 20) where count > limit {
            try? await Task.sleep(for: .milliseconds(50))
            count = self.countedFileDescriptors
        }
        return count
    }

    /// Deletes the temporary directory.
    package func cleanUp() {
        try? FileManager.default.removeItem(atPath: self.directory)
    }
}
