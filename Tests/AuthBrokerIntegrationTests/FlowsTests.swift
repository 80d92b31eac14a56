import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The flow log: `authbrokerctl flows` shows what the daemon served (live, and the recent ones),
/// and `flows export --har` writes HAR 1.2 that a schema check accepts, with every secret masked.
@Suite("Flow log", .serialized)
struct FlowsTests {
    static let password = "Stored-Pa55word-7d1e"
    static let secrets = ["CLIENTSECRET", "COOKIESECRET", "APIKEYSECRET", "SETCOOKIESECRET", Self.password]

    static var repository: String {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().path
    }

    /// Runs scripts/validate-har (python3-jsonschema) on `file` against the HAR 1.2 schema.
    static func validateHAR(_ file: String) throws -> CLIAndClientsTests.Run {
        try CLIAndClientsTests.run(
            "/usr/bin/python3",
            [Self.repository + "/scripts/validate-har", Self.repository + "/Tests/AuthBrokerIntegrationTests/Fixtures/har-1.2.schema.json", file]
        )
    }

    static func config(_ origin: TestAuthOrigin, flows: String = "record = \"always\"\nbodies = true\nmask_headers = [\"X-Api-Key\"]") -> String {
        """
        [upstream]
        resolve = ["auth.internal.test:\(origin.port):127.0.0.1"]

        [flows]
        \(flows)

        [[respond]]
        host = "stub.test"
        path = "/login"
        status = 200
        headers = ["Set-Cookie: session=SETCOOKIESECRET; Path=/; HttpOnly", "Content-Type: text/plain"]
        body = "welcome"
        """
    }

    @Test("flows lists each request with its app, credential, rule and error; the HAR validates and holds no secret")
    func listAndExport() async throws {
        let origin = try await TestAuthOrigin.start(name: "basic", user: "alice", password: Self.password)
        defer { Task { await origin.stop() } }
        let base = "http://auth.internal.test:\(origin.port)"
        try await withDaemon(config: Self.config(origin)) { daemon in
            let stored = try StoredCredentialTests.store(daemon, url: base, user: "alice", password: Self.password)
            #expect(stored.status == 201)
            // A stored credential answers the 401; the request body is kept for the resend.
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let upload = try connection.request("POST", base + "/basic/upload", body: Array("payload-123".utf8))
            #expect(upload.status == 200, "\(upload.text)")
            // An unmodified program through the proxy port, sending secrets of its own.
            let curl = try ProxyPortTests.runThroughBroker(
                daemon,
                [
                    "/usr/bin/curl", "-sS", "-H", "Cookie: sid=COOKIESECRET; theme=dark", "-H", "X-Api-Key: APIKEYSECRET",
                    "-u", "bob:CLIENTSECRET", base + "/stats?verbose=1",
                ]
            )
            #expect(curl.status == 0, "\(curl.stderr)")
            let login = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "http://stub.test/login"])
            #expect(login.stdout == "welcome", "\(login.stderr)")
            // https:// to a host a rule covers is intercepted: the CONNECT and the request inside.
            let secure = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "https://stub.test/login"])
            #expect(secure.stdout == "welcome", "\(secure.stderr)")
            let failed = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://no-such-host.invalid/x")
            #expect(failed.header("Authbroker-Error") == "dns_error")

            let listed = try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow"])
            #expect(listed.status == 0, "\(listed.stderr)")
            let lines = listed.stdout.split(separator: "\n").map(String.init)
            #expect(lines.count == 6, "\(listed.stdout)")
            let uploadLine = lines.first { $0.contains("POST \(base)/basic/upload 200") }
            #expect(uploadLine?.contains("credential alice (basic, realm \"") == true, "\(listed.stdout)")
            #expect(lines.contains { $0.contains("curl[") && $0.contains("GET \(base)/stats?verbose=1 200") }, "\(listed.stdout)")
            #expect(lines.contains { $0.contains("GET http://stub.test/login 200 7 B") && $0.contains("respond config.toml:") }, "\(listed.stdout)")
            #expect(lines.contains { $0.contains("GET http://no-such-host.invalid/x 502") && $0.contains("error dns_error") }, "\(listed.stdout)")
            #expect(lines.contains { $0.contains("CONNECT stub.test:443 200") && $0.hasSuffix("intercepted") }, "\(listed.stdout)")
            #expect(lines.contains { $0.contains("GET https://stub.test/login 200 7 B") && $0.contains("respond config.toml:") && $0.hasSuffix("intercepted") }, "\(listed.stdout)")
            for secret in Self.secrets { #expect(!listed.stdout.contains(secret)) }

            let last = try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow", "--last", "1", "--json"])
            let summary = try #require(try JSONSerialization.jsonObject(with: Data(last.stdout.utf8)) as? [String: Any])
            #expect(summary["url"] as? String == "http://no-such-host.invalid/x")
            #expect(summary["error"] as? String == "dns_error")

            let file = daemon.directory + "/flows.har"
            let exported = try CLIAndClientsTests.ctl(daemon, ["flows", "export", "--har", file])
            #expect(exported.status == 0, "\(exported.stderr)")
            // Through FileManager: `struct stat`'s members belong to whichever C module included
            // the header first, which member import visibility makes fragile across targets.
            let permissions = try FileManager.default.attributesOfItem(atPath: file)[.posixPermissions] as? Int
            #expect(permissions.map { $0 & 0o777 } == 0o600)
            let validated = try Self.validateHAR(file)
            #expect(validated.status == 0, "\(validated.stdout)\(validated.stderr)")
            let har = try String(contentsOfFile: file, encoding: .utf8)
            for secret in Self.secrets { #expect(!har.contains(secret), "\(secret) is in the HAR") }
            #expect(!har.contains(Data("bob:CLIENTSECRET".utf8).base64EncodedString()))
            #expect(har.contains("Basic [masked]"))
            #expect(har.contains("sid=[masked]; theme=[masked]"))
            #expect(har.contains("session=[masked]; Path=/; HttpOnly"))

            let json = try #require(try JSONSerialization.jsonObject(with: Data(har.utf8)) as? [String: Any])
            let entries = try #require((json["log"] as? [String: Any])?["entries"] as? [[String: Any]])
            #expect(entries.count == 6)
            let uploadEntry = try #require(entries.first { ($0["request"] as? [String: Any])?["url"] as? String == base + "/basic/upload" })
            let extra = try #require(uploadEntry["_authbroker"] as? [String: Any])
            let credentials = (extra["applied"] as? [String: Any])?["credentials"] as? [[String: Any]]
            #expect(credentials?.first?["user"] as? String == "alice")
            #expect(((uploadEntry["request"] as? [String: Any])?["postData"] as? [String: Any])?["text"] as? String == "payload-123")
            #expect(((uploadEntry["response"] as? [String: Any])?["content"] as? [String: Any])?["text"] as? String == "hello alice")
            #expect((uploadEntry["request"] as? [String: Any])?["bodySize"] as? Int == 11)

            // The name is taken: nothing is overwritten.
            let again = try CLIAndClientsTests.ctl(daemon, ["flows", "export", "--har", file])
            #expect(again.status != 0)
            #expect(again.stderr.contains("exists already"), "\(again.stderr)")
            // The daemon's own log holds none of the secrets either.
            for secret in Self.secrets { #expect(!daemon.log.contains(secret), "\(secret) is in the daemon's log") }
        }
    }

    @Test("flows follows requests live, including those the direct relay serves")
    func follow() async throws {
        let origin = try await TestOrigin.start(name: "live")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\"live.test:\(origin.port):127.0.0.1\"]\n[flows]\nrecord = \"always\"\n") { daemon in
            let before = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://live.test:\(origin.port)/hello?before")
            #expect(before.status == 200)
            let watcher = Process()
            watcher.executableURL = URL(fileURLWithPath: DaemonProcess.binDirectory + "/authbrokerctl")
            watcher.arguments = ["flows", "--last", "1", "--socket", daemon.socketPath]
            let output = Pipe()
            watcher.standardOutput = output
            watcher.standardError = FileHandle.nullDevice
            try watcher.run()
            defer { if watcher.isRunning { watcher.terminate() } }
            let reader = LineCollector(output.fileHandleForReading)
            // The one before it is shown first, as history.
            #expect(await reader.waitFor("/hello?before 200"), "\(reader.text)")
            // Several on one connection: the direct relay serves the ones after the first.
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<3 {
                #expect(try connection.request("GET", "http://live.test:\(origin.port)/hello?n=\(index)").status == 200)
            }
            for index in 0..<3 {
                #expect(await reader.waitFor("GET http://live.test:\(origin.port)/hello?n=\(index) 200 15 B"), "\(reader.text)")
            }
            let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
            let relayed = ((status.json["counters"] as? [String: Any])?["requests_relayed_directly"] as? Int) ?? 0
            #expect(relayed >= 1, "\(status.text)")
            // The watcher is a control client, not a flow.
            #expect(!reader.text.contains("/v1/"))
        }
    }

    @Test("by default nothing is recorded until someone asks, and flows says so")
    func recordingOnDemand() async throws {
        let origin = try await TestOrigin.start(name: "lazy")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\"lazy.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let url = "http://lazy.test:\(origin.port)/hello"
            #expect(try UnixSocketConnection(path: daemon.socketPath).request("GET", url + "?unseen").status == 200)
            let first = try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow"])
            #expect(first.status == 0, "\(first.stderr)")
            #expect(first.stdout.isEmpty)
            #expect(first.stderr.contains("records requests from now on"), "\(first.stderr)")
            #expect(try UnixSocketConnection(path: daemon.socketPath).request("GET", url + "?seen").status == 200)
            let second = try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow"])
            #expect(second.stdout.contains("GET \(url)?seen 200"), "\(second.stdout)")
            #expect(!second.stdout.contains("unseen"))
            #expect(second.stderr.isEmpty, "\(second.stderr)")
        }
    }

    @Test("with [flows] keep = 0 nothing is kept, and flows says how to turn it on")
    func off() async throws {
        try await withDaemon(config: "[flows]\nkeep = 0\n") { daemon in
            for arguments in [["flows", "--no-follow"], ["flows"], ["flows", "export", "--har", "-"]] {
                let run = try CLIAndClientsTests.ctl(daemon, arguments)
                #expect(run.status != 0)
                #expect(run.stderr.contains("keep"), "\(arguments): \(run.stderr)")
                #expect(run.stdout.isEmpty)
            }
        }
    }

    @Test("bad queries are refused with what to send instead")
    func badQueries() async throws {
        try await withDaemon { daemon in
            for query in ["/v1/flows?last=-1", "/v1/flows?last=x", "/v1/flows/har?reveal=maybe", "/v1/flows?follow=sometimes"] {
                let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", query)
                #expect(response.status == 400, "\(query)")
                #expect(response.json["code"] as? String == "invalid_parameter", "\(query): \(response.text)")
            }
            let post = try UnixSocketConnection(path: daemon.socketPath).request("POST", "/v1/flows")
            #expect(post.status == 405)
        }
    }

    @Test("secrets are shown only after the login password, through PAM", .enabled(if: TestUser.canCreate, "making the test user needs root"))
    func revealNeedsLoginPassword() async throws {
        let user = try TestUser.pamUser()
        let pamDirectory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: pamDirectory) }
        try "auth required pam_unix.so\naccount required pam_unix.so\n".write(toFile: pamDirectory + "/authbroker", atomically: true, encoding: .utf8)
        chmod(pamDirectory, 0o755)
        let config = """
            [security]
            pam_config_dir = "\(pamDirectory)"

            [flows]
            record = "always"

            [[respond]]
            host = "stub.test"
            status = 204
            """
        let daemon = try await DaemonProcess.start(config: config, user: user)
        defer { daemon.cleanUp() }
        do {
            let sent = try CLIAndClientsTests.run(
                "/usr/bin/setpriv",
                user.setprivArguments + [
                    "/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--unix-socket", daemon.socketPath,
                    "--request-target", "http://stub.test/page", "-H", "Cookie: sid=COOKIESECRET", "http://stub.test/page",
                ]
            )
            #expect(sent.stdout == "204", "\(sent.stderr)")
            let masked = try RevealTests.ctl(daemon, user: user, ["flows", "export", "--har", "-"], stdin: "")
            #expect(masked.status == 0, "\(masked.stderr)")
            #expect(masked.stdout.contains("sid=[masked]"))
            #expect(!masked.stdout.contains("COOKIESECRET"))

            let wrong = try RevealTests.ctl(
                daemon, user: user, ["flows", "export", "--har", "-", "--reveal-secrets", "--login-password-stdin"], stdin: "not-it\n"
            )
            #expect(wrong.status != 0)
            #expect(!wrong.stdout.contains("COOKIESECRET"))
            #expect(wrong.stderr.contains("refused"), "\(wrong.stderr)")

            let right = try RevealTests.ctl(
                daemon, user: user, ["flows", "export", "--har", "-", "--reveal-secrets", "--login-password-stdin"],
                stdin: user.password + "\n"
            )
            #expect(right.status == 0, "\(right.stderr)")
            #expect(right.stdout.contains("sid=COOKIESECRET"))
            #expect(right.stdout.contains("\"masked\" : false"))
        }
        await daemon.stop()
    }
}

/// Collects a pipe's lines as they come, for a test to wait on.
final class LineCollector: @unchecked Sendable {  // `buffer` is only touched under `lock`
    private let lock = NSLock()
    private var buffer = ""

    init(_ handle: FileHandle) {
        handle.readabilityHandler = { [weak self] handle in
            let data = handle.availableData
            guard let self, !data.isEmpty else {
                handle.readabilityHandler = nil
                return
            }
            self.lock.withLock { self.buffer += String(decoding: data, as: UTF8.self) }
        }
    }

    var text: String { self.lock.withLock { self.buffer } }

    /// Whether `needle` arrived within ten seconds.
    func waitFor(_ needle: String) async -> Bool {
        for _ in 0..<200 {
            if self.text.contains(needle) { return true }
            try? await Task.sleep(for: .milliseconds(50))
        }
        return false
    }
}
