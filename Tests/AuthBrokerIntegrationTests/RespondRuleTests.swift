import Foundation
import Testing
import TestSupport

/// `[[respond]]`: matching requests are answered from the config without the network, through
/// the socket, the proxy port, and intercepted https://; others go on as usual.
@Suite("Canned responses", .serialized)
struct RespondRuleTests {
    @Test("a matching request gets the rule's answer and never reaches the network; others go on to the origin")
    func cannedResponses() async throws {
        let origin = try await TestOrigin.start(name: "real")
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try "from a file\n".write(toFile: directory + "/body.txt", atomically: true, encoding: .utf8)
        let config = """
            [upstream]
            resolve = ["stub.test:\(origin.port):127.0.0.1"]

            [[respond]]
            method = "GET"
            host = "*.down.test"
            path = "/v1/status"
            status = 503
            headers = ["Content-Type: application/json", "Retry-After: 60"]
            body = "{\\"up\\": false}"

            [[respond]]
            host = "stub.test"
            path = "/file"
            file = "\(directory)/body.txt"

            [[respond]]
            host = "stub.test"
            path = "/missing"
            file = "\(directory)/no-such-file"
            """
        try await withDaemon(config: config) { daemon in
            // No such host anywhere: only the rule can answer.
            let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://api.down.test/v1/status?verbose=1")
            #expect(status.status == 503)
            #expect(status.text == "{\"up\": false}")
            #expect(status.header("Content-Type") == "application/json")
            #expect(status.header("Retry-After") == "60")
            #expect(status.header("Authbroker-Rule") == "respond config.toml:4")
            #expect(status.header("Authbroker-Error") == nil)
            // Another method is not the rule's: it goes to the network (and fails there).
            let post = try UnixSocketConnection(path: daemon.socketPath).request("POST", "http://api.down.test/v1/status", body: Array("x".utf8))
            #expect(post.header("Authbroker-Error") == "dns_error")

            let file = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://stub.test:\(origin.port)/file/a")
            #expect(file.status == 200 && file.text == "from a file\n")
            try "edited\n".write(toFile: directory + "/body.txt", atomically: true, encoding: .utf8)
            let edited = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://stub.test:\(origin.port)/file/b")
            #expect(edited.text == "edited\n")
            let head = try UnixSocketConnection(path: daemon.socketPath).request("HEAD", "http://stub.test:\(origin.port)/file/c")
            #expect(head.status == 200 && head.header("Content-Length") == "7" && head.body.isEmpty)
            // Not covered by a rule: the origin answers, over a kept connection too.
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for _ in 0..<2 {
                let real = try connection.request("GET", "http://stub.test:\(origin.port)/hello")
                #expect(real.text == "hello from real")
                let canned = try connection.request("GET", "http://stub.test:\(origin.port)/file/d")
                #expect(canned.text == "edited\n")
            }
            let missing = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://stub.test:\(origin.port)/missing")
            #expect(missing.status == 502)
            #expect((missing.json["detail"] as? String)?.contains("line 17") == true, "\(missing.json)")

            // Unmodified programs through the proxy port, http:// and intercepted https://.
            let curl = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "http://api.down.test/v1/status"])
            #expect(curl.stdout == "{\"up\": false}", "\(curl.stderr)")
            let secure = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "-w", " %{http_code}", "https://api.down.test/v1/status"]
            )
            #expect(secure.stdout == "{\"up\": false} 503", "\(secure.stderr)")
        }
    }
}
