import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// `authbrokerctl` (the built binary) and the README's curl and Python examples, against the real daemon.
@Suite("authbrokerctl and other clients")
struct CLIAndClientsTests {
    struct Run {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    static func run(_ executable: String, _ arguments: [String], stdin: String? = nil, environment: [String: String]? = nil) throws -> Run {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        let out = Pipe()
        let err = Pipe()
        let input = Pipe()
        process.standardOutput = out
        process.standardError = err
        process.standardInput = input
        try process.run()
        if let stdin { input.fileHandleForWriting.write(Data(stdin.utf8)) }
        try input.fileHandleForWriting.close()
        let stdout = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let stderr = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        return Run(status: process.terminationStatus, stdout: stdout, stderr: stderr)
    }

    static func ctl(_ daemon: DaemonProcess, _ arguments: [String], stdin: String? = nil) throws -> Run {
        try run(DaemonProcess.binDirectory + "/authbrokerctl", arguments + ["--socket", daemon.socketPath], stdin: stdin)
    }

    @Test("fetch from a self-signed server fails with the reason, the fingerprints and the fix; anchors add fixes it")
    func fetchUntrustedThenAnchor() async throws {
        let ca = try TestPKI.makeCA(commonName: "CLI Test CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["self-signed.internal.test"], issuer: nil)
        let scoped = try TestPKI.makeLeaf(dnsNames: ["app.internal.test"], issuer: ca)
        let origin = try await TestOrigin.start(name: "cli", identity: leaf)
        let scopedOrigin = try await TestOrigin.start(name: "cli-ca", identity: scoped)
        defer { Task { await origin.stop(); await scopedOrigin.stop() } }
        let config = configText(resolving: [("self-signed.internal.test", origin), ("app.internal.test", scopedOrigin)])
        try await withDaemon(config: config) { daemon in
            let url = "https://self-signed.internal.test:\(origin.port)/hello"
            let refused = try Self.ctl(daemon, ["fetch", url])
            #expect(refused.status == 4)
            #expect(refused.stdout.isEmpty)
            #expect(refused.stderr.contains("self-signed.internal.test"))
            #expect(refused.stderr.lowercased().contains("not trusted"))
            #expect(refused.stderr.lowercased().contains("self-signed"))
            #expect(refused.stderr.contains(leaf.sha256Fingerprint))
            #expect(refused.stderr.contains("authbrokerctl anchors add"))

            // trust-server with the fingerprint proceeds without asking.
            let trusted = try Self.ctl(daemon, ["anchors", "trust-server", url, "--fingerprint", leaf.sha256Fingerprint])
            #expect(trusted.status == 0, "\(trusted.stderr)")
            let fetched = try Self.ctl(daemon, ["fetch", url])
            #expect(fetched.status == 0, "\(fetched.stderr)")
            #expect(fetched.stdout == "hello from cli")

            // A CA file scoped to a domain.
            let caFile = daemon.directory + "/ca.pem"
            try ca.pem.write(toFile: caFile, atomically: true, encoding: .utf8)
            let scopedURL = "https://app.internal.test:\(scopedOrigin.port)/hello"
            #expect(try Self.ctl(daemon, ["fetch", scopedURL]).status == 4)
            let added = try Self.ctl(daemon, ["anchors", "add", caFile, "--hosts", "*.internal.test"])
            #expect(added.status == 0, "\(added.stderr)")
            #expect(added.stdout.contains("*.internal.test") && added.stdout.hasPrefix("Added anchor"), "\(added.stdout)")
            // The same certificate again: the same scope is said to be unchanged, another one to
            // replace it (not "Added", which hid that the old hosts were no longer trusted).
            let same = try Self.ctl(daemon, ["anchors", "add", caFile, "--hosts", "*.internal.test"])
            #expect(same.status == 0 && same.stdout.contains("was already there, unchanged"), "\(same.stdout)")
            let narrowed = try Self.ctl(daemon, ["anchors", "add", caFile, "--hosts", "localhost"])
            #expect(narrowed.stdout.contains("Updated anchor") && narrowed.stdout.contains("*.internal.test"), "\(narrowed.stdout)")
            // trust-server on a host the anchor does not cover adds the host to it, as the
            // out-of-scope error advises, never replacing the hosts it had.
            let widened = try Self.ctl(daemon, ["anchors", "trust-server", scopedURL, "--fingerprint", ca.sha256Fingerprint])
            #expect(widened.status == 0 && widened.stdout.contains("Updated anchor"), "\(widened.status) \(widened.stdout) \(widened.stderr)")
            let scopes = try Self.ctl(daemon, ["anchors", "list"]).stdout
            #expect(scopes.contains("localhost") && scopes.contains("app.internal.test"), "\(scopes)")
            #expect(try Self.ctl(daemon, ["anchors", "add", caFile, "--hosts", "*.internal.test"]).status == 0)
            let included = try Self.ctl(daemon, ["fetch", "-i", scopedURL])
            #expect(included.status == 0)
            #expect(included.stdout.hasPrefix("HTTP/1.1 200"))
            #expect(included.stdout.hasSuffix("hello from cli-ca"))

            let list = try Self.ctl(daemon, ["anchors", "list", "--json"])
            #expect(list.status == 0)
            let anchors = (try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [String: Any])?["anchors"] as? [[String: Any]]
            #expect(anchors?.count == 2)
            let caID = try #require(anchors?.first { ($0["hosts"] as? [String]) == ["*.internal.test"] }?["id"] as? String)
            let removed = try Self.ctl(daemon, ["anchors", "remove", String(caID.prefix(10))])
            #expect(removed.status == 0, "\(removed.stderr)")
            #expect(try Self.ctl(daemon, ["fetch", scopedURL]).status == 4)
        }
    }

    @Test("status works, and a missing daemon is a clear message with exit status 3")
    func status() async throws {
        try await withDaemon { daemon in
            let status = try Self.ctl(daemon, ["status"])
            #expect(status.status == 0)
            #expect(status.stdout.contains("0.1.0"))
            let json = try Self.ctl(daemon, ["status", "--json"])
            let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
            #expect(object?["pid"] as? Int == Int(daemon.pid))
        }
        let missing = try Self.run(DaemonProcess.binDirectory + "/authbrokerctl", ["status", "--socket", "/tmp/no-such-dir/none.sock"])
        #expect(missing.status == 3)
        #expect(missing.stderr.contains("not running"))
        #expect(missing.stderr.contains("/tmp/no-such-dir/none.sock"))
        // A config file named on the command line must exist (as for authbrokerd): a typo is
        // said, not read as "no config" and the default socket tried.
        let typo = try Self.run(DaemonProcess.binDirectory + "/authbrokerctl", ["status", "--config", "/tmp/no-such-dir/config.toml"])
        #expect(typo.status == 1 && typo.stderr.contains("/tmp/no-such-dir/config.toml does not exist"), "\(typo.stderr)")
    }

    @Test("fetch sends a body from stdin and writes the response to a file")
    func fetchBodyAndOutput() async throws {
        let origin = try await TestOrigin.start(name: "cli-echo")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("echo.internal.test", origin)])) { daemon in
            let output = daemon.directory + "/out.bin"
            let run = try Self.ctl(
                daemon, ["fetch", "-X", "PUT", "-d", "-", "-o", output, "http://echo.internal.test:\(origin.port)/echo"],
                stdin: "payload from stdin"
            )
            #expect(run.status == 0, "\(run.stderr)")
            #expect(try String(contentsOfFile: output, encoding: .utf8) == "payload from stdin")
            let failing = try Self.ctl(daemon, ["fetch", "--fail", "http://echo.internal.test:\(origin.port)/status/404"])
            #expect(failing.status == 22)
        }
    }

    @Test("fetch sends curl's defaults, then the user's headers; the target goes percent-encoded as a URL")
    func fetchRequestHead() async throws {
        let origin = try await TestOrigin.start(name: "cli-head")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("head.internal.test", origin)])) { daemon in
            let base = "http://head.internal.test:\(origin.port)"
            func seen(_ run: Run) throws -> (method: String?, uri: String?, fields: [String: String]) {
                let object = try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any]
                var fields: [String: String] = [:]
                for pair in (object?["headers"] as? [[String]]) ?? [] where pair.count == 2 { fields[pair[0].lowercased()] = pair[1] }
                return (object?["method"] as? String, object?["uri"] as? String, fields)
            }

            let plain = try Self.ctl(daemon, ["fetch", base + "/headers?q={x}|y"])
            #expect(plain.status == 0, "\(plain.stderr)")
            let defaults = try seen(plain)
            #expect(defaults.method == "GET")
            // What RFC 3986 leaves out of a URI is percent-encoded, as Foundation's URL writes it.
            #expect(defaults.uri == "/headers?q=%7Bx%7D%7Cy")
            #expect(defaults.fields["user-agent"]?.hasPrefix("authbrokerctl/") == true)
            #expect(defaults.fields["accept"] == "*/*")
            #expect(defaults.fields["content-length"] == nil)

            let custom = try Self.ctl(
                daemon, ["fetch", "-X", "POST", "-H", "Accept: text/plain", "-H", "User-Agent: mine/1", "-H", "X-One: 1", base + "/headers"]
            )
            #expect(custom.status == 0, "\(custom.stderr)")
            let chosen = try seen(custom)
            #expect(chosen.method == "POST")
            #expect(chosen.fields["accept"] == "text/plain")
            #expect(chosen.fields["user-agent"] == "mine/1")
            #expect(chosen.fields["x-one"] == "1")
            // A POST without a body says so (RFC 9110 §8.6).
            #expect(chosen.fields["content-length"] == "0")
        }
    }

    @Test("fetch -X HEAD: a broker error whose answer has no body is still explained, with its exit status")
    func headBrokerErrors() async throws {
        let leaf = try TestPKI.makeLeaf(dnsNames: ["head-untrusted.internal.test"], issuer: nil)
        let origin = try await TestOrigin.start(name: "cli-head-untrusted", identity: leaf)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("head-untrusted.internal.test", origin)])) { daemon in
            let url = "https://head-untrusted.internal.test:\(origin.port)/hello"
            let untrusted = try Self.ctl(daemon, ["fetch", "-X", "HEAD", url])
            #expect(untrusted.status == 4, "\(untrusted.stderr)")
            #expect(untrusted.stdout.isEmpty)
            #expect(untrusted.stderr.hasPrefix("authbrokerctl: cannot fetch \(url): The server's certificate is not trusted"), "\(untrusted.stderr)")
            #expect(untrusted.stderr.contains("(request id "))

            // The daemon's code from its Authbroker-Error mark decides, as with a body.
            let unknown = try Self.ctl(daemon, ["fetch", "-X", "HEAD", "-H", "Authbroker-Identity: nobody", url])
            #expect(unknown.status == 7, "\(unknown.stderr)")
            #expect(unknown.stderr.hasPrefix("authbrokerctl: cannot fetch \(url): "), "\(unknown.stderr)")
        }
    }

    @Test("a socket that does not answer like authbrokerd: what it did is said, with exit 7 or 6")
    func notTheDaemon() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let socketPath = directory + "/fake.sock"
        // One answer per request line, then the connection is closed; three connections, then it exits.
        let server = """
            import socket, sys
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            listener.bind(sys.argv[1])
            listener.listen(8)
            for _ in range(3):
                connection, _ = listener.accept()
                request = b""
                while b"\\r\\n\\r\\n" not in request:
                    chunk = connection.recv(65536)
                    if not chunk:
                        break
                    request += chunk
                line = request.split(b"\\r\\n", 1)[0]
                if b"/v1/status" in line:
                    connection.sendall(b"HTTP/1.1 418 I'm a teapot\\r\\nContent-Length: 5\\r\\nConnection: close\\r\\n\\r\\nnope!")
                elif b"/garbage" in line:
                    connection.sendall(b"this is not HTTP\\r\\n\\r\\n")
                else:
                    connection.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Length: 100\\r\\nConnection: close\\r\\n\\r\\npartial")
                connection.close()
            """
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = ["python3", "-c", server, socketPath]
        try process.run()
        defer {
            // SIGKILL: the child inherits this thread's signal mask, which may block SIGTERM.
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        #expect(await waitUntil { FileManager.default.fileExists(atPath: socketPath) })
        let ctl = DaemonProcess.binDirectory + "/authbrokerctl"

        let status = try Self.run(ctl, ["status", "--socket", socketPath])
        #expect(status.status == 7)
        #expect(
            status.stderr.hasPrefix("authbrokerctl: cannot get status: the daemon answered HTTP 418 I'm a teapot for GET /v1/status; is authbrokerd version "),
            "\(status.stderr)"
        )

        let cut = try Self.run(ctl, ["fetch", "http://origin.internal.test/big", "--socket", socketPath])
        #expect(cut.status == 6)
        #expect(cut.stdout == "partial")
        #expect(
            cut.stderr.hasPrefix("authbrokerctl: the response is incomplete: authbrokerd on \(socketPath) closed the connection before its end"),
            "\(cut.stderr)"
        )

        let garbage = try Self.run(ctl, ["fetch", "http://origin.internal.test/garbage", "--socket", socketPath])
        #expect(garbage.status == 6)
        #expect(garbage.stderr.hasPrefix("authbrokerctl: the daemon's answer is not valid HTTP/1.1"), "\(garbage.stderr)")
    }

    @Test("the README's curl and Python examples work")
    func readmeClients() async throws {
        let origin = try await TestOrigin.start(name: "readme")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("host.internal.test", origin)])) { daemon in
            let url = "http://host.internal.test:\(origin.port)/hello"
            let curl = try Self.run("/usr/bin/curl", ["-sS", "--unix-socket", daemon.socketPath, "--request-target", url, "http://localhost/"])
            #expect(curl.status == 0, "\(curl.stderr)")
            #expect(curl.stdout == "hello from readme")

            let python = """
                import http.client, os, socket, sys

                class BrokerConnection(http.client.HTTPConnection):
                    def __init__(self, path):
                        super().__init__("localhost")
                        self.path = path
                    def connect(self):
                        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                        self.sock.connect(self.path)

                connection = BrokerConnection(sys.argv[1])
                connection.request("GET", sys.argv[2])
                response = connection.getresponse()
                print(response.status, response.read().decode())
                """
            let run = try Self.run("/usr/bin/env", ["python3", "-c", python, daemon.socketPath, url])
            #expect(run.status == 0, "\(run.stderr)")
            #expect(run.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "200 hello from readme")
        }
    }
}
