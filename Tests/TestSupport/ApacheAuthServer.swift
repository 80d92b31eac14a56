import Crypto
import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// Debian's Apache httpd (`apache2`), run in the foreground for one test, demanding Basic and
/// Digest the way a production server does: an interop check that the fixtures we wrote
/// ourselves cannot give.
///
/// Served on 127.0.0.1 at a free port, from a temporary directory holding the config, the
/// password files, the pid file and the error log:
/// - `/basic/`: `AuthType Basic`, realm `basic@apache`, users from an `htpasswd -bc` file.
/// - `/digest/`: `AuthType Digest`, realm `digest@apache`, `AuthDigestAlgorithm MD5`,
///   `AuthDigestQop auth`, `AuthDigestNcCheck On` (a repeated or lower nc is refused), users
///   from an htdigest file (mod_auth_digest knows only MD5).
/// - `/public/`: no authentication.
///
/// Each directory serves `index.html` with the body `<name> ok\n` (`basic ok`, `digest ok`,
/// `public ok`).
package final class ApacheAuthServer: Sendable {
    package static let executable = "/usr/sbin/apache2"
    package static let modulesDirectory = "/usr/lib/apache2/modules"
    package static let htpasswd = "/usr/bin/htpasswd"
    package static let basicRealm = "basic@apache"
    package static let digestRealm = "digest@apache"

    /// Whether apache2 is installed (`apt-get install apache2 apache2-utils`).
    package static var isInstalled: Bool {
        FileManager.default.isExecutableFile(atPath: executable) && FileManager.default.isExecutableFile(atPath: htpasswd)
    }

    package let port: Int
    package let user: String
    /// The temporary directory: `httpd.conf`, `error.log`, `stderr.log`, `htdocs/`.
    package let directory: String
    private let process: SpawnedProcess

    private init(port: Int, user: String, directory: String, process: SpawnedProcess) {
        self.port = port
        self.user = user
        self.directory = directory
        self.process = process
    }

    /// `http://127.0.0.1:<port><path>`.
    package func url(_ path: String) -> String { "http://127.0.0.1:\(self.port)\(path)" }

    /// Apache's error log so far (mod_auth_digest explains refusals there).
    package var errorLog: String { Self.read(self.directory + "/error.log") }

    /// Writes the site and the config, starts `apache2 -DFOREGROUND`, and waits (at most 10 s a try) until
    /// its port accepts connections. A port taken between choosing and binding it is retried
    /// with another, twice.
    ///
    /// - Throws: when apache2 is missing, exits, or does not listen in time; the message carries
    ///   its error log and stderr.
    package static func start(user: String, password: String) async throws -> ApacheAuthServer {
        guard isInstalled else {
            throw TestSupportError("\(executable) or \(htpasswd) is not installed: apt-get install -y apache2 apache2-utils")
        }
        guard !user.contains(":"), !user.contains("\n"), !password.contains("\n") else {
            throw TestSupportError("a user name for htpasswd/htdigest may not contain ':' or a newline")
        }
        let (directory, port, process) = try await self.launchInNewDirectory { directory in
            try self.writeSite(in: directory, user: user, password: password)
        } configuration: { directory, port in
            configuration(directory: directory, port: port)
        }
        return ApacheAuthServer(port: port, user: user, directory: directory, process: process)
    }

    /// SIGTERM (SIGKILL after 5 s), then removes the directory.
    package func stop() async {
        await self.process.terminate()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    /// A test that threw before `stop()` still leaves no Apache behind.
    deinit {
        self.process.kill()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    // MARK: - Start-up

    struct LaunchError: Error, CustomStringConvertible {
        var description: String
        var portInUse: Bool
    }

    /// A new temporary directory that `prepare` fills, then Apache started on a free port with
    /// the config `configuration` makes (a port taken between choosing and binding it is retried
    /// with another, twice). The directory is removed if it fails.
    static func launchInNewDirectory(
        environment: [String: String]? = nil, prepare: (String) throws -> Void, configuration: @escaping (String, Int) -> String
    ) async throws -> (directory: String, port: Int, process: SpawnedProcess) {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        do {
            try prepare(directory)
            var lastError: (any Error)?
            for _ in 0..<3 {
                let port = try freeLoopbackPort()
                do {
                    let process = try await launch(directory: directory, port: port, environment: environment) {
                        configuration(directory, $0)
                    }
                    return (directory, port, process)
                } catch let error as LaunchError where error.portInUse {
                    lastError = error
                }
            }
            throw lastError ?? TestSupportError("apache2 could not bind a port")
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// Starts `apache2 -DFOREGROUND` with the config `configuration` makes for `port` (and
    /// `environment` over the test's own), and waits (at most 10 s) until the port accepts
    /// connections.
    static func launch(
        directory: String, port: Int, environment: [String: String]? = nil, configuration: (Int) -> String
    ) async throws -> SpawnedProcess {
        let config = directory + "/httpd.conf"
        try configuration(port).write(toFile: config, atomically: true, encoding: .utf8)
        // Truncated per try, so that a retry's messages are its own.
        _ = FileManager.default.createFile(atPath: directory + "/error.log", contents: nil)
        // FOREGROUND: the parent does not detach, and a SIGTERM to it stops its children too
        // (not -X, which serves one connection at a time); -f: our config only.
        let process = try SpawnedProcess(
            executable: executable, arguments: ["-DFOREGROUND", "-f", config, "-d", directory],
            stderrPath: directory + "/stderr.log", environment: environment
        )
        for _ in 0..<200 {
            if let status = process.exitStatus {
                let logs = Self.logs(directory)
                throw LaunchError(
                    description: "apache2 \(status) before listening on 127.0.0.1:\(port)\n\(logs)",
                    portInUse: logs.contains("Address already in use")
                )
            }
            if let connection = try? UnixSocketConnection(tcpPort: port, timeoutSeconds: 2) {
                connection.close()
                return process
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        await process.terminate()
        throw LaunchError(description: "apache2 did not listen on 127.0.0.1:\(port) within 10 s\n\(logs(directory))", portInUse: false)
    }

    static func logs(_ directory: String) -> String {
        "error.log:\n\(read(directory + "/error.log"))\nstderr:\n\(read(directory + "/stderr.log"))"
    }

    static func read(_ path: String) -> String {
        (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }

    // MARK: - Files

    /// The document root, the password files; readable by the user Apache drops to when root.
    private static func writeSite(in directory: String, user: String, password: String) throws {
        let manager = FileManager.default
        for name in ["basic", "digest", "public"] {
            let folder = directory + "/htdocs/" + name
            try manager.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try "\(name) ok\n".write(toFile: folder + "/index.html", atomically: true, encoding: .utf8)
        }
        try manager.createDirectory(atPath: directory + "/run", withIntermediateDirectories: true)

        let made = try ExternalCommand.run(htpasswd, ["-bc", directory + "/htpasswd", user, password])
        guard made.status == 0 else {
            throw TestSupportError("htpasswd -bc failed (\(made.status)): \(made.stderr)")
        }
        // htdigest only asks interactively; its line is `user:realm:MD5(user:realm:password)`.
        let ha1 = Insecure.MD5.hash(data: Array("\(user):\(digestRealm):\(password)".utf8))
            .map { String(format: "%02x", $0) }.joined()
        try "\(user):\(digestRealm):\(ha1)\n".write(toFile: directory + "/htdigest", atomically: true, encoding: .utf8)

        try self.makeReadableByApache(directory)
    }

    /// Apache serves as `runAs` when started as root (it refuses to serve as root): it must
    /// read everything under `directory`.
    static func makeReadableByApache(_ directory: String) throws {
        guard getuid() == 0 else { return }
        let manager = FileManager.default
        let paths = try [directory] + manager.subpathsOfDirectory(atPath: directory).map { directory + "/" + $0 }
        for path in paths {
            var isDirectory: ObjCBool = false
            _ = manager.fileExists(atPath: path, isDirectory: &isDirectory)
            let executable = manager.isExecutableFile(atPath: path)
            try manager.setAttributes([.posixPermissions: isDirectory.boolValue || executable ? 0o755 : 0o644], ofItemAtPath: path)
        }
    }

    /// `LoadModule` lines for `modules` (id, file), each only where Debian did not compile it in
    /// (loading one of those again is a syntax error).
    static func loadModules(_ modules: [(String, String)]) -> String {
        modules.map { id, file in
            "<IfModule !\(id)>\n    LoadModule \(id) \(modulesDirectory)/\(file)\n</IfModule>"
        }.joined(separator: "\n")
    }

    /// The `User`/`Group` lines of a root-started Apache.
    static var identityLines: String {
        getuid() == 0 ? "User \(runAs.user)\nGroup \(runAs.group)" : "# not root: Apache keeps the test's user"
    }

    /// The user and group a root-started Apache switches to: `www-data` on Debian, else `nobody`.
    static var runAs: (user: String, group: String) {
        if getpwnam("www-data") != nil { return ("www-data", "www-data") }
        return ("nobody", getgrnam("nogroup") != nil ? "nogroup" : "nobody")
    }

    private static func configuration(directory: String, port: Int) -> String {
        let modules = [
            ("mpm_prefork_module", "mod_mpm_prefork.so"),
            ("unixd_module", "mod_unixd.so"),
            ("authz_core_module", "mod_authz_core.so"),
            ("authz_user_module", "mod_authz_user.so"),
            ("authn_core_module", "mod_authn_core.so"),
            ("authn_file_module", "mod_authn_file.so"),
            ("auth_basic_module", "mod_auth_basic.so"),
            ("auth_digest_module", "mod_auth_digest.so"),
            ("dir_module", "mod_dir.so"),
        ]
        let loads = loadModules(modules)
        let identity = identityLines
        return """
            ServerRoot "\(directory)"
            ServerName 127.0.0.1
            Listen 127.0.0.1:\(port)
            PidFile "\(directory)/run/httpd.pid"
            DefaultRuntimeDir "\(directory)/run"
            ErrorLog "\(directory)/error.log"
            LogLevel warn
            # Few workers: tests need a handful of connections at once, not hundreds.
            StartServers 2
            MinSpareServers 1
            MaxSpareServers 4
            MaxRequestWorkers 16
            \(loads)
            \(identity)

            DocumentRoot "\(directory)/htdocs"
            DirectoryIndex index.html
            <Directory "\(directory)/htdocs">
                Require all granted
            </Directory>

            <Location "/basic/">
                AuthType Basic
                AuthName "\(basicRealm)"
                AuthBasicProvider file
                AuthUserFile "\(directory)/htpasswd"
                Require valid-user
            </Location>

            <Location "/digest/">
                AuthType Digest
                AuthName "\(digestRealm)"
                AuthDigestProvider file
                AuthUserFile "\(directory)/htdigest"
                AuthDigestAlgorithm MD5
                AuthDigestQop auth
                AuthDigestDomain /digest/
                AuthDigestNcCheck On
                Require valid-user
            </Location>

            """
    }
}

/// A loopback port nobody listens on now (for servers that cannot be told to bind port 0 and
/// report it): bound to port 0, read back, released.
package func freeLoopbackPort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw TestSupportError("socket: \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = in_addr_t(0x7F00_0001).bigEndian
    address.sin_port = 0
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(fd, pointer, length) == 0 && getsockname(fd, pointer, &length) == 0
        }
    }
    guard bound else { throw TestSupportError("binding 127.0.0.1:0: \(String(cString: strerror(errno)))") }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// A child started with posix_spawn in a process group of its own, its signal mask emptied and
/// the usual signals at their defaults.
///
/// Foundation's `Process` hands on the test runner's blocked signals (an Apache started that
/// way never sees the SIGTERM that should stop it) and its process group (Apache's prefork
/// parent signals its children with killpg on its own group, which would take the test runner
/// and its shell with it).
final class SpawnedProcess: Sendable {
    let pid: pid_t
    /// The wait status once reaped.
    private let reaped = NIOLockedValueBox<Int32?>(nil)

    /// - Parameter environment: laid over the test's own environment (nil: the test's own).
    init(executable: String, arguments: [String], stderrPath: String, environment: [String: String]? = nil) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, stderrPath, O_WRONLY | O_CREAT | O_TRUNC, 0o644)

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var unblocked = sigset_t()
        sigemptyset(&unblocked)
        posix_spawnattr_setsigmask(&attributes, &unblocked)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGPIPE, SIGCHLD, SIGUSR1, SIGUSR2, SIGWINCH] {
            sigaddset(&defaults, signal)
        }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))

        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        // nil: the test's own `environ`, as it is.
        let envp: [UnsafeMutablePointer<CChar>?]? = environment.map { overrides in
            ProcessInfo.processInfo.environment.merging(overrides) { _, new in new }
                .map { strdup("\($0.key)=\($0.value)") } + [nil]
        }
        defer { for entry in envp ?? [] { free(entry) } }
        var pid = pid_t()
        let result =
            if let envp {
                posix_spawn(&pid, executable, &actions, &attributes, argv, envp)
            } else {
                posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
            }
        guard result == 0 else {
            throw TestSupportError("posix_spawn \(executable): \(String(cString: strerror(result)))")
        }
        self.pid = pid
    }

    deinit {
        self.kill()
    }

    /// nil while running; otherwise how it ended ("exited with 1", "killed by signal 9").
    var exitStatus: String? {
        self.reaped.withLockedValue { reaped -> Int32? in
            if reaped == nil {
                var status: Int32 = 0
                let result = waitpid(self.pid, &status, WNOHANG)
                if result == self.pid {
                    reaped = status
                } else if result < 0 {
                    reaped = -1  // not our child any more (ECHILD): gone
                }
            }
            return reaped
        }.map(Self.describe)
    }

    private static func describe(_ status: Int32) -> String {
        if status == -1 { return "is gone" }
        // WIFEXITED / WEXITSTATUS / WTERMSIG, which Swift does not import (they are macros).
        return status & 0x7F == 0 ? "exited with \((status >> 8) & 0xFF)" : "was killed by signal \(status & 0x7F)"
    }

    /// SIGTERM to the parent, which stops its children; SIGKILL to its whole group after 5 s.
    func terminate() async {
        guard self.exitStatus == nil else { return }
        Glibc.kill(self.pid, SIGTERM)
        for _ in 0..<100 where self.exitStatus == nil {
            try? await Task.sleep(for: .milliseconds(50))
        }
        self.kill()
    }

    /// SIGKILL to the process group (the process and its children), then reaps the process.
    func kill() {
        guard self.exitStatus == nil else { return }
        // The group is the child's own (POSIX_SPAWN_SETPGROUP with 0): its id is the child's pid.
        guard self.pid > 1 else { return }
        Glibc.kill(-self.pid, SIGKILL)
        self.reaped.withLockedValue { reaped in
            guard reaped == nil else { return }
            var status: Int32 = 0
            reaped = waitpid(self.pid, &status, 0) == self.pid ? status : -1
        }
    }
}
