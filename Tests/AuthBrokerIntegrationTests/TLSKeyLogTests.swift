import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `[debug] tls_key_log` against Wireshark's own dissector: a capture of the broker's upstream
/// TLS is decrypted by tshark with the key log, and is not without it.
@Suite(
    "TLS key log",
    .enabled(
        if: getuid() == 0 && FileManager.default.isExecutableFile(atPath: "/usr/bin/tshark")
            && FileManager.default.isExecutableFile(atPath: "/usr/bin/dumpcap"),
        "capturing on lo needs root, tshark and dumpcap (scripts/install-deps test installs them)"
    ),
    .serialized
)
struct TLSKeyLogTests {
    /// An HTTPS origin for `host` with a CA of its own, which the test anchors in the daemon.
    static func origin(host: String) async throws -> (ca: TestIdentity, origin: TestOrigin) {
        let ca = try TestPKI.makeCA(commonName: "Key Log Test CA for \(host)")
        let origin = try await TestOrigin.start(name: host, identity: try TestPKI.makeLeaf(dnsNames: [host], issuer: ca))
        return (ca, origin)
    }

    /// The request-targets tshark reads from the capture's TLS on `port`, decrypted with
    /// `keyLog` when given.
    static func requestTargets(in capture: String, port: Int, keyLog: String?) throws -> ExternalCommand.Result {
        let keys = keyLog.map { ["-o", "tls.keylog_file:\($0)"] } ?? []
        return try ExternalCommand.run(
            "/usr/bin/tshark",
            ["-r", capture] + keys + ["-d", "tcp.port==\(port),tls", "-Y", "http.request", "-T", "fields", "-e", "http.request.uri"]
        )
    }

    @Test("tshark decrypts a capture of a broker request with the key log, and cannot without it; the file is 0600 and status warns")
    func tsharkDecryptsTheCapture() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let keyLog = directory + "/keys.log"
        let capture = directory + "/capture.pcapng"
        let (ca, origin) = try await Self.origin(host: "keylog.internal.test")
        defer { Task { await origin.stop() } }
        let marker = "marker-\(UInt64.random(in: 0...UInt64.max))"
        let config = "[upstream]\nresolve = [\"keylog.internal.test:\(origin.port):127.0.0.1\"]\n[debug]\ntls_key_log = \"\(keyLog)\"\n"
        try await withDaemon(config: config) { daemon in
            #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["keylog.internal.test"]).status == 201)
            let dumpcap = try Capture(port: origin.port, file: capture)
            let response = try fetch(daemon, "https://keylog.internal.test:\(origin.port)/hello?\(marker)")
            #expect(response.status == 200)
            let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
            let warnings = status.json["warnings"] as? [String] ?? []
            #expect(warnings.contains { $0.contains(keyLog) && $0.contains("decrypt") })
            // The key lines are batched for up to 100 ms; the daemon's stop writes what is left.
            await daemon.stop()
            dumpcap.stop()
        }
        var info = stat()
        #expect(stat(keyLog, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
        let keys = try String(contentsOfFile: keyLog, encoding: .utf8)
        #expect(keys.contains("CLIENT_") || keys.contains("_TRAFFIC_SECRET_0"))

        let decrypted = try Self.requestTargets(in: capture, port: origin.port, keyLog: keyLog)
        #expect(decrypted.stdout.contains("/hello?\(marker)"), "tshark: \(decrypted.stdout) \(decrypted.stderr)")
        let opaque = try Self.requestTargets(in: capture, port: origin.port, keyLog: nil)
        #expect(opaque.status == 0)
        #expect(!opaque.stdout.contains(marker))
    }
}

extension TLSKeyLogTests {
    @Test("with tls_key_log_scope = marked, only a request sent with Authbroker-Debug: keylog has its keys logged")
    func onlyMarkedRequestsAreLogged() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let keyLog = directory + "/keys.log"
        let capture = directory + "/capture.pcapng"
        let (ca, origin) = try await Self.origin(host: "marked.internal.test")
        defer { Task { await origin.stop() } }
        let plain = "plain-\(UInt64.random(in: 0...UInt64.max))"
        let marked = "marked-\(UInt64.random(in: 0...UInt64.max))"
        let config = """
            [upstream]
            resolve = ["marked.internal.test:\(origin.port):127.0.0.1"]
            [debug]
            tls_key_log = "\(keyLog)"
            tls_key_log_scope = "marked"
            """
        try await withDaemon(config: config) { daemon in
            #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["marked.internal.test"]).status == 201)
            let dumpcap = try Capture(port: origin.port, file: capture)
            let base = "https://marked.internal.test:\(origin.port)/hello"
            #expect(try fetch(daemon, "\(base)?\(plain)").status == 200)
            try await Task.sleep(for: .milliseconds(300))
            #expect(try String(contentsOfFile: keyLog, encoding: .utf8).isEmpty, "an unmarked request's keys were logged")
            #expect(try fetch(daemon, "\(base)?\(marked)", headers: [("Authbroker-Debug", "keylog")]).status == 200)
            // The marked request took a connection of its own: a second plain one still reuses
            // the first, unlogged connection.
            #expect(try fetch(daemon, "\(base)?\(plain)-again").status == 200)
            await daemon.stop()
            dumpcap.stop()
        }
        let decrypted = try Self.requestTargets(in: capture, port: origin.port, keyLog: keyLog)
        #expect(decrypted.stdout.contains("/hello?\(marked)"), "tshark: \(decrypted.stdout) \(decrypted.stderr)")
        #expect(!decrypted.stdout.contains(plain))
    }
}

/// dumpcap on lo for one port for `seconds`, started and ready before `init` returns.
private final class Capture: Sendable {
    private let process: Process

    init(port: Int, file: String) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/dumpcap")
        // It stops by itself: a test process's children inherit its blocked signals, so neither
        // SIGINT nor SIGTERM would reach it.
        process.arguments = ["-i", "lo", "-f", "tcp port \(port)", "-a", "duration:\(Self.seconds)", "-w", file]
        let messages = file + ".log"
        guard FileManager.default.createFile(atPath: messages, contents: nil) else { throw TestSupportError("cannot create \(messages)") }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: messages))
        process.standardError = log
        process.standardOutput = log
        try process.run()
        self.process = process
        // dumpcap says where it captures once it does: wait for that, 10 s at most.
        var said = ""
        for _ in 0..<100 where !said.contains("Capturing on") {
            Thread.sleep(forTimeInterval: 0.1)
            said = (try? String(contentsOfFile: messages, encoding: .utf8)) ?? ""
        }
        guard said.contains("Capturing on") else {
            process.terminate()
            throw TestSupportError("dumpcap did not start capturing: \(said)")
        }
    }

    /// How long a capture runs: room for the daemon's start, one request and its stop.
    static let seconds = 8

    /// Waits for the capture's end; the file is whole then.
    func stop() {
        self.process.waitUntilExit()
    }
}
