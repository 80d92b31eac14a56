import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Reloading the rules: SIGHUP, `POST /v1/reload` and `authbrokerctl reload` put new
/// `[[respond]]`/`[[route]]` rules in place; a file with an error changes nothing and says where.
@Suite("Reloading rules", .serialized)
struct ReloadTests {
    static func stub(_ daemon: DaemonProcess) throws -> String {
        try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://stub.test/x").text
    }

    @Test("SIGHUP and /v1/reload replace the rules; a broken file keeps the old ones and names its line")
    func reloadRules() async throws {
        let config = "[[respond]]\nhost = \"stub.test\"\nbody = \"one\"\n"
        try await withDaemon(config: config) { daemon in
            #expect(try Self.stub(daemon) == "one")
            let written = try String(contentsOfFile: daemon.configPath, encoding: .utf8)

            // SIGHUP, as `systemctl --user reload` sends it.
            try written.replacingOccurrences(of: "\"one\"", with: "\"two\"").write(toFile: daemon.configPath, atomically: true, encoding: .utf8)
            kill(daemon.pid, SIGHUP)
            for _ in 0..<100 where try Self.stub(daemon) != "two" {
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(try Self.stub(daemon) == "two")
            #expect(daemon.log.contains("reloaded the rules of the config file"))

            // A file with an error: nothing changes, and the answer names the line.
            try ("[[respond]]\nbody = \"three\"\n" + written).write(toFile: daemon.configPath, atomically: true, encoding: .utf8)
            let broken = try UnixSocketConnection(path: daemon.socketPath).request("POST", "/v1/reload")
            #expect(broken.status == 422)
            #expect(broken.json["code"] as? String == "invalid_config")
            #expect((broken.json["detail"] as? String)?.contains("config.toml:1") == true, "\(broken.json)")
            let cli = try ExternalCommand.run(DaemonProcess.binDirectory + "/authbrokerctl", ["reload", "--socket", daemon.socketPath])
            #expect(cli.status != 0 && cli.stderr.contains("has no host"), "\(cli.stderr)")
            #expect(try Self.stub(daemon) == "two")

            // Fixed, with a route added and a setting that needs a restart changed.
            let directory = try DaemonProcess.makeTemporaryDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let socketOrigin = try await TestOrigin.start(name: "routed", unixSocketPath: directory + "/o.sock")
            defer { Task { await socketOrigin.stop() } }
            let fixed = written.replacingOccurrences(of: "\"one\"", with: "\"four\"")
                + "\n[[route]]\nhost = \"routed.test\"\nunix = \"\(directory)/o.sock\"\n[limits]\nmax_auth_spaces = 77\n"
            try fixed.write(toFile: daemon.configPath, atomically: true, encoding: .utf8)
            let reloaded = try ExternalCommand.run(DaemonProcess.binDirectory + "/authbrokerctl", ["reload", "--socket", daemon.socketPath])
            #expect(reloaded.status == 0, "\(reloaded.stderr)")
            #expect(reloaded.stdout.contains("Reloaded: 1 [[route]], 1 [[respond]], 0 [[rewrite]]."), "\(reloaded.stdout)")
            #expect(reloaded.stdout.contains("take effect when the daemon restarts"))
            #expect(try Self.stub(daemon) == "four")
            let routed = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://routed.test/hello")
            #expect(routed.text == "hello from routed")
        }
    }

    @Test("a reload that moves a host (connect_to, [[route]]) applies to the next request, not after its pooled connection idles out")
    func reloadReachesPooledConnections() async throws {
        let first = try await TestOrigin.start(name: "first"), second = try await TestOrigin.start(name: "second")
        defer { Task { await first.stop(); await second.stop() } }
        func rules(_ origin: TestOrigin) -> String {
            "[[rewrite]]\nhost = \"moved.test\"\nconnect_to = \"127.0.0.1:\(origin.port)\"\n"
        }
        try await withDaemon(config: rules(first)) { daemon in
            // One client connection, kept alive, as an app that polls does.
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for _ in 0..<3 {
                #expect(try connection.request("GET", "http://moved.test/hello").text == "hello from first")
            }
            try rules(second).write(toFile: daemon.configPath, atomically: true, encoding: .utf8)
            let reloaded = try UnixSocketConnection(path: daemon.socketPath).request("POST", "/v1/reload")
            #expect(reloaded.status == 200, "\(reloaded.text)")
            #expect(try connection.request("GET", "http://moved.test/hello").text == "hello from second", "the pooled connection to the old address was reused")
            // A reload that changes nothing of where connections go (a comment, a response rule)
            // keeps the pool: the next request goes on the connection already open.
            let opened = second.acceptedConnections
            try ("# a comment moves every line\n" + rules(second) + "[[respond]]\nhost = \"stub.test\"\nbody = \"x\"\n")
                .write(toFile: daemon.configPath, atomically: true, encoding: .utf8)
            #expect(try UnixSocketConnection(path: daemon.socketPath).request("POST", "/v1/reload").status == 200)
            #expect(try connection.request("GET", "http://moved.test/hello").text == "hello from second")
            #expect(second.acceptedConnections == opened, "a reload that moved nothing dropped the pooled connection")
        }
    }
}
