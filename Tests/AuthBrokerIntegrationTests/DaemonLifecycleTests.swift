import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The listener, systemd integration, configuration and shutdown of the real daemon.
@Suite("Daemon lifecycle")
struct DaemonLifecycleTests {
    @Test("the socket is 0600 in a 0700 directory; a second daemon on it is refused; a stale socket is cleaned up")
    func socketOwnership() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try await DaemonProcess.start(directory: directory)
        let socketMode = try FileManager.default.attributesOfItem(atPath: first.socketPath)[.posixPermissions] as? Int
        let directoryMode = try FileManager.default.attributesOfItem(
            atPath: (first.socketPath as NSString).deletingLastPathComponent
        )[.posixPermissions] as? Int
        #expect(socketMode == 0o600)
        #expect(directoryMode == 0o700)

        let second = Process()
        second.executableURL = URL(fileURLWithPath: DaemonProcess.binDirectory + "/authbrokerd")
        second.environment = first.environment
        let errors = Pipe()
        second.standardError = errors
        try second.run()
        second.waitUntilExit()
        let message = String(decoding: errors.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(second.terminationStatus != 0)
        #expect(message.contains("already listening on \(first.socketPath)"))

        // SIGKILL leaves the socket file behind; the next daemon removes it and listens.
        kill(first.pid, SIGKILL)
        _ = await first.waitForExit()
        #expect(FileManager.default.fileExists(atPath: first.socketPath))
        let third = try await DaemonProcess.start(directory: directory)
        #expect(try UnixSocketConnection(path: third.socketPath).request("GET", "/v1/status").status == 200)
        #expect(await third.stop() == 0)
    }

    @Test("SIGTERM: in-flight requests finish, sd_notify says READY and STOPPING, exit status 0")
    func gracefulShutdown() async throws {
        let origin = try await TestOrigin.start(name: "slow")
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let notify = try NotifySocket(path: directory + "/notify.sock")
        let daemon = try await DaemonProcess.start(
            config: configText(resolving: [("slow.internal.test", origin)]), directory: directory,
            extraEnvironment: ["NOTIFY_SOCKET": notify.path]
        )
        #expect(try notify.receive().contains("READY=1"))

        let connection = try UnixSocketConnection(path: daemon.socketPath)
        try connection.send("GET http://slow.internal.test:\(origin.port)/slow-head/1500 HTTP/1.1\r\nHost: x\r\n\r\n")
        try await Task.sleep(for: .milliseconds(400))
        kill(daemon.pid, SIGTERM)
        #expect(try notify.receive().contains("STOPPING=1"))
        let response = try connection.readResponse()
        #expect(response.status == 200)
        #expect(response.text == "slow")
        #expect(response.header("Connection") == "close")
        #expect(await daemon.waitForExit() == 0)
        #expect(daemon.log.contains("stopping"))
        #expect(!FileManager.default.fileExists(atPath: daemon.socketPath))
    }

    @Test("SIGTERM with an agent attached: its stream ends at once, not after the grace period")
    func shutdownEndsAgentStreams() async throws {
        // A grace period far longer than the test's read timeout: waiting it out would fail.
        let daemon = try await DaemonProcess.start(config: "[daemon]\nshutdown_grace_seconds = 120\n")
        defer { daemon.cleanUp() }
        let agent = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 30)
        try agent.send("GET /v1/agent HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(try agent.readLine().hasPrefix("HTTP/1.1 200"))
        kill(daemon.pid, SIGTERM)
        _ = try agent.readToEnd()  // returns once the daemon closes the stream (else throws at 30 s)
        #expect(await daemon.waitForExit() == 0)
        #expect(daemon.log.contains("agent detached"))
        #expect(!daemon.log.contains("grace period over"))
    }

    @Test("a connection from another uid is closed unread and logged with its pid and uid", .enabled(if: getuid() == 0, "creating a second user needs root"))
    func otherUserRefused() async throws {
        let user = "authbroker-test"
        if getpwnam(user) == nil {
            let add = Process()
            add.executableURL = URL(fileURLWithPath: "/usr/sbin/useradd")
            add.arguments = ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user]
            try add.run()
            add.waitUntilExit()
            #expect(add.terminationStatus == 0)
        }
        let otherUID = try #require(getpwnam(user)).pointee.pw_uid
        try await withDaemon { daemon in
            // Open the path to everyone, as a careless admin might: the uid check must still hold.
            chmod(daemon.directory, 0o755)
            chmod(daemon.directory + "/run", 0o755)
            chmod((daemon.socketPath as NSString).deletingLastPathComponent, 0o755)
            chmod(daemon.socketPath, 0o777)
            let script = """
                import socket, sys
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sys.argv[1])
                s.settimeout(20)
                try:
                    s.sendall(b"GET /v1/status HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
                except OSError:
                    pass
                try:
                    data = s.recv(65536)
                except OSError:
                    data = b""
                print("REPLY:" + repr(data))
                """
            let probe = Process()
            probe.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            probe.arguments = ["--reuid=\(user)", "--regid=\(user)", "--clear-groups", "/usr/bin/python3", "-c", script, daemon.socketPath]
            let output = Pipe()
            probe.standardOutput = output
            try probe.run()
            probe.waitUntilExit()
            let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
            #expect(printed.contains("REPLY:b''"))
            try await Task.sleep(for: .milliseconds(200))
            #expect(daemon.log.contains("refused a connection from another user"))
            #expect(daemon.log.contains("peer_uid=\(otherUID)"))
            #expect(daemon.log.contains("peer_pid="))
            // Our own uid is still served.
            #expect(try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status").status == 200)
        }
    }

    @Test("started by systemd-socket-activate, the daemon adopts the passed socket and fetches through it")
    func socketActivation() async throws {
        let origin = try await TestOrigin.start(name: "activated")
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let socketPath = directory + "/activated.sock"
        try configText(resolving: [("origin.internal.test", origin)]).write(
            toFile: directory + "/config.toml", atomically: true, encoding: .utf8
        )
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/systemd-socket-activate")
        process.arguments = [
            "--listen=\(socketPath)", "-E", "XDG_STATE_HOME=\(directory)/state", "-E", "HOME=\(directory)",
            DaemonProcess.binDirectory + "/authbrokerd", "--config", directory + "/config.toml",
        ]
        let log = Pipe()
        process.standardError = log
        try process.run()
        defer {
            kill(process.processIdentifier, SIGTERM)
            process.waitUntilExit()
        }
        var connection: UnixSocketConnection?
        for _ in 0..<200 where connection == nil {
            connection = try? UnixSocketConnection(path: socketPath)
            if connection == nil { try await Task.sleep(for: .milliseconds(50)) }
        }
        let client = try #require(connection)
        let response = try client.request("GET", "http://origin.internal.test:\(origin.port)/hello")
        #expect(response.status == 200)
        #expect(response.text == "hello from activated")
        let status = try client.request("GET", "/v1/status")
        #expect(status.json["socket"] as? String != nil)
    }

    @Test("systemd passes the Unix socket and the proxy port's (named proxy); the daemon serves both, and refuses a proxy socket that is not on loopback")
    func socketActivationWithProxyPort() async throws {
        let origin = try await TestOrigin.start(name: "activated")
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let socketPath = directory + "/activated.sock"
        try configText(resolving: [("origin.internal.test", origin)], extra: "[proxy]\nlisten = [\"127.0.0.1:0\"]\n").write(
            toFile: directory + "/config.toml", atomically: true, encoding: .utf8
        )
        /// systemd-socket-activate with the Unix socket and one TCP socket named proxy.
        func activate(socket: String, tcp: String, log: String) throws -> Process {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/systemd-socket-activate")
            process.arguments = [
                "--listen=\(socket)", "--listen=\(tcp)", "--fdname=authbrokerd.socket:proxy", "-E", "XDG_STATE_HOME=\(directory)/state",
                "-E", "HOME=\(directory)", DaemonProcess.binDirectory + "/authbrokerd", "--config", directory + "/config.toml",
            ]
            _ = FileManager.default.createFile(atPath: log, contents: nil)
            process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
            try process.run()
            return process
        }
        let port = try freeLoopbackPort()
        let process = try activate(socket: socketPath, tcp: "127.0.0.1:\(port)", log: directory + "/first.log")
        var connection: UnixSocketConnection?
        for _ in 0..<200 where connection == nil {
            connection = try? UnixSocketConnection(path: socketPath)
            if connection == nil { try await Task.sleep(for: .milliseconds(50)) }
        }
        let client = try #require(connection)
        // The daemon is up once it answers; the passed socket is its proxy port, not [proxy] listen.
        let status = try client.request("GET", "/v1/status")
        #expect(status.json["proxy_port"] as? [String] == ["127.0.0.1:\(port)"], "\(status.json)")
        let proxied = try UnixSocketConnection(tcpPort: port).request("GET", "http://origin.internal.test:\(origin.port)/hello")
        #expect(proxied.status == 200 && proxied.text == "hello from activated")
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()

        // A proxy socket on every interface is refused at start, with what to do.
        let wideSocket = directory + "/wide.sock"
        let wide = try activate(socket: wideSocket, tcp: "0.0.0.0:\(try freeLoopbackPort())", log: directory + "/second.log")
        // systemd-socket-activate starts the daemon at the first connection.
        for _ in 0..<100 where (try? UnixSocketConnection(path: wideSocket)) == nil {
            try await Task.sleep(for: .milliseconds(50))
        }
        var exited = false
        for _ in 0..<200 where !exited {
            exited = !wide.isRunning
            if !exited { try await Task.sleep(for: .milliseconds(50)) }
        }
        if !exited { kill(wide.processIdentifier, SIGKILL) }
        #expect(exited)
        let log = (try? String(contentsOfFile: directory + "/second.log", encoding: .utf8)) ?? ""
        #expect(log.contains("is not a TCP socket on a loopback address"), "\(log)")
        #expect(!log.contains("Fatal error"), "\(log)")
    }

    @Test("systemd-analyze verify accepts the user units")
    func unitsVerify() async throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let home = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: home) }
        try FileManager.default.createDirectory(atPath: home + "/.local/bin", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: home + "/run", withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.createSymbolicLink(atPath: home + "/.local/bin/authbrokerd", withDestinationPath: DaemonProcess.binDirectory + "/authbrokerd")
        let verify = Process()
        verify.executableURL = URL(fileURLWithPath: "/usr/bin/systemd-analyze")
        verify.arguments = [
            "--user", "verify", root.path + "/systemd/authbrokerd.socket", root.path + "/systemd/authbrokerd.service",
            root.path + "/systemd/authbroker-proxy.socket",
        ]
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = home
        environment["XDG_RUNTIME_DIR"] = home + "/run"
        verify.environment = environment
        let output = Pipe()
        verify.standardError = output
        verify.standardOutput = output
        try verify.run()
        verify.waitUntilExit()
        let printed = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(verify.terminationStatus == 0, "systemd-analyze said: \(printed)")
        #expect(printed.isEmpty, "systemd-analyze warned: \(printed)")
    }

    @Test("a bad config file stops startup with an error naming the file and the key")
    func badConfig() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let configPath = directory + "/config.toml"
        try "[upstream]\nconnect_timeout_ms = \"ten\"\n".write(toFile: configPath, atomically: true, encoding: .utf8)
        let result = try runDaemon(arguments: ["--config", configPath, "--socket", directory + "/s.sock"])
        #expect(result.status == 78)
        #expect(result.stderr.contains(configPath))
        #expect(result.stderr.contains("connect_timeout_ms"))
    }

    @Test("a socket path that is relative, or longer than a socket address, stops startup with a message that says so")
    func unfitSocketPaths() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "".write(toFile: directory + "/config.toml", atomically: true, encoding: .utf8)
        let relative = try runDaemon(arguments: ["--config", directory + "/config.toml", "--socket", "relative.sock"])
        #expect(relative.status == 1)
        #expect(relative.stderr.contains("relative.sock is not absolute"), "\(relative.stderr)")
        let long = directory + "/" + String(repeating: "s", count: 120) + ".sock"
        let tooLong = try runDaemon(arguments: ["--config", directory + "/config.toml", "--socket", long])
        #expect(tooLong.status == 1)
        #expect(tooLong.stderr.contains("longer than a Unix socket address allows"), "\(tooLong.stderr)")
    }

    @Test("a proxy port another program holds stops startup with the system's reason, not SwiftNIO's")
    func takenProxyPort() async throws {
        let holder = try await RawOrigin.startSilent()
        defer { Task { await holder.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "[proxy]\nlisten = [\"127.0.0.1:\(holder.port)\"]\n".write(toFile: directory + "/config.toml", atomically: true, encoding: .utf8)
        let result = try runDaemon(arguments: ["--config", directory + "/config.toml", "--socket", directory + "/s.sock"])
        #expect(result.status != 0)
        #expect(result.stderr.contains("cannot listen on the proxy port 127.0.0.1:\(holder.port): Address already in use."), "\(result.stderr)")
        #expect(!result.stderr.contains("descriptor:"), "\(result.stderr)")
    }

    @Test("--help and --version answer without starting anything")
    func helpAndVersion() throws {
        let help = try runDaemon(arguments: ["--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("--socket"))
        #expect(help.stdout.contains("--config"))
        let version = try runDaemon(arguments: ["--version"])
        #expect(version.status == 0)
        #expect(version.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "0.1.0")
    }

    func runDaemon(arguments: [String]) throws -> (status: Int32, stdout: String, stderr: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: DaemonProcess.binDirectory + "/authbrokerd")
        process.arguments = arguments
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        try process.run()
        let stdout = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let stderr = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return (process.terminationStatus, stdout, stderr)
    }
}

/// A datagram socket standing in for systemd's `NOTIFY_SOCKET`.
final class NotifySocket {
    let path: String
    private let fd: Int32

    init(path: String) throws {
        self.path = path
        self.fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            let bytes = Array(path.utf8)
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(self.fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
        }
        guard bound == 0 else { throw TestSupportError("bind \(path): \(String(cString: strerror(errno)))") }
        var timeout = timeval(tv_sec: 30, tv_usec: 0)
        setsockopt(self.fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit {
        close(self.fd)
    }

    /// The next datagram, as text.
    func receive() throws -> String {
        var buffer = [UInt8](repeating: 0, count: 4096)
        let count = buffer.withUnsafeMutableBytes { recv(self.fd, $0.baseAddress, $0.count, 0) }
        guard count >= 0 else { throw TestSupportError("no notification: \(String(cString: strerror(errno)))") }
        return String(decoding: buffer[0..<count], as: UTF8.self)
    }
}

@Suite("Socket directories the daemon did not make")
struct SocketDirectoryTests {
    @Test("an existing directory is checked and never changed: a sticky shared one (like /tmp) is kept as it is; one others can write is refused")
    func existingDirectories() async throws {
        let shared = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: shared) }
        chmod(shared, 0o1777)
        let daemon = try await DaemonProcess.start(socket: shared + "/s.sock")
        #expect(try UnixSocketConnection(path: shared + "/s.sock").request("GET", "/v1/status").status == 200)
        await daemon.stop()
        daemon.cleanUp()
        let mode = (try FileManager.default.attributesOfItem(atPath: shared)[.posixPermissions] as? Int) ?? 0
        #expect(mode == 0o1777)

        chmod(shared, 0o777)
        let refused = try CLIAndClientsTests.run(
            DaemonProcess.binDirectory + "/authbrokerd", ["--socket", shared + "/t.sock"],
            environment: ["HOME": shared, "XDG_CONFIG_HOME": shared + "/config", "XDG_STATE_HOME": shared + "/state", "XDG_DATA_HOME": shared + "/data"]
        )
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("writable by other users"), "\(refused.stderr)")
        #expect(((try FileManager.default.attributesOfItem(atPath: shared)[.posixPermissions] as? Int) ?? 0) == 0o777)
    }
}
