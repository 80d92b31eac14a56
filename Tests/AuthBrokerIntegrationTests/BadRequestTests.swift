import Foundation
import Testing
import TestSupport

/// Hostile and malformed client input gets an answer (or a close), and the daemon keeps serving.
@Suite("Bad requests")
struct BadRequestTests {
    static let hostile: [(String, String)] = [
        ("garbage bytes", "\u{01}\u{02}\u{03} not http at all\r\n\r\n"),
        ("bad request line", "GET\r\n\r\n"),
        ("bad header", "GET http://x.test/ HTTP/1.1\r\nNo colon here\r\n\r\n"),
        ("bad chunk size", "POST http://x.test/ HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n"),
        ("both framings", "POST http://x.test/ HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc"),
    ]

    @Test("malformed HTTP gets 400 problem+json and the daemon carries on", arguments: Self.hostile.map(\.1))
    func malformed(input: String) async throws {
        try await withDaemon { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            try connection.send(input)
            let raw = String(decoding: try connection.readToEnd(), as: UTF8.self)
            #expect(raw.hasPrefix("HTTP/1.1 400"))
            #expect(raw.contains("application/problem+json"))
            try Self.expectStillServing(daemon)
        }
    }

    @Test("an oversized header section gets 431 and the daemon carries on")
    func oversizedHead() async throws {
        try await withDaemon(config: "[limits]\nmax_request_head_bytes = 4096\n") { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let big = String(repeating: "a", count: 8000)
            let response = try connection.request("GET", "http://x.test/", headers: [("X-Big", big)])
            #expect(response.status == 431)
            #expect(response.json["code"] as? String == "request_head_too_large")

            // Beyond the HTTP parser's own ceiling too.
            let huge = try UnixSocketConnection(path: daemon.socketPath)
            try huge.send("GET http://x.test/ HTTP/1.1\r\nX-Huge: \(String(repeating: "b", count: 200_000))\r\n\r\n")
            let raw = String(decoding: try huge.readToEnd(), as: UTF8.self)
            #expect(raw.hasPrefix("HTTP/1.1 4"))
            try Self.expectStillServing(daemon)
        }
    }

    @Test("head limits above SwiftNIO's own 80 KiB hold both ways: a 100 KiB request head goes up, a 100 KiB response head reaches the library")
    func largeHeadsWithinRaisedLimits() async throws {
        let big = String(repeating: "b", count: 100_000)
        let origin = try await RawOrigin.start(replyAfterHead: .init("HTTP/1.1 200 OK\r\nX-Big: \(big)\r\nContent-Length: 2\r\n\r\nok", close: true))
        defer { Task { await origin.stop() } }
        let config = """
            [upstream]
            resolve = ["big.test:\(origin.port):127.0.0.1"]
            [limits]
            max_request_head_bytes = 262144
            max_response_head_bytes = 262144
            """
        try await withDaemon(config: config) { daemon in
            let url = "http://big.test:\(origin.port)/"
            let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", url, headers: [("X-Big", big)])
            #expect(response.status == 200, "\(response.status) \(response.text.prefix(300))")
            #expect(response.header("X-Big")?.count == big.count)
            #expect(origin.receivedText.contains("X-Big: \(big)"), "the request head did not reach the origin whole")
            // The library (authbrokerctl fetch) reads the same response head.
            let fetched = try CLIAndClientsTests.ctl(daemon, ["fetch", url])
            #expect(fetched.status == 0 && fetched.stdout == "ok", "\(fetched.status) \(fetched.stderr.prefix(300))")
        }
    }

    @Test(
        "targets the broker cannot serve get a 4xx/5xx problem on a connection that stays usable",
        arguments: [
            ("GET", "/not-control", 400, "not_absolute"),
            ("GET", "ftp://x.test/", 400, "unsupported_scheme"),
            ("GET", "https://user:pw@x.test/", 400, "userinfo_not_allowed"),
            ("GET", "http://x.test:99999/", 400, "invalid_port"),
            ("CONNECT", "no-such-host.invalid:443", 502, "dns_error"),
            ("GET", "/v1/nowhere", 404, "not_found"),
            ("DELETE", "/v1/status", 405, "method_not_allowed"),
        ]
    )
    func unservableTargets(method: String, target: String, status: Int, code: String) async throws {
        try await withDaemon { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let response = try connection.request(method, target)
            #expect(response.status == status)
            #expect(response.header("Content-Type") == "application/problem+json")
            if method == "CONNECT" {
                // NIOHTTP1's encoder sends no body with any response to CONNECT (RFC 9112 §6.3
                // requires that for 2xx only); the status and the closed connection say it.
                #expect(response.header("Connection") == "close")
            } else {
                #expect(response.json["code"] as? String == code)
                #expect((response.json["detail"] as? String)?.isEmpty == false)
            }
            try Self.expectStillServing(daemon)
        }
    }

    @Test("an unreachable origin gets 502 connection_refused; an unknown name gets dns_error")
    func upstreamFailures() async throws {
        // A port that was just free: bind, note it, close.
        let origin = try await TestOrigin.start(name: "gone")
        let port = origin.port
        await origin.stop()
        try await withDaemon(config: "[upstream]\nresolve = [\"gone.internal.test:\(port):127.0.0.1\"]\n") { daemon in
            let refused = try fetch(daemon, "http://gone.internal.test:\(port)/")
            #expect(refused.status == 502)
            #expect(refused.header("Proxy-Status")?.contains("error=connection_refused") == true)
            let unknown = try fetch(daemon, "http://no-such-host.invalid/")
            #expect(unknown.status == 502)
            #expect(unknown.header("Proxy-Status")?.contains("error=dns_error") == true)
        }
    }

    @Test("an origin that answers too slowly gets 504 http_response_timeout")
    func responseHeadTimeout() async throws {
        let origin = try await TestOrigin.start(name: "slow")
        defer { Task { await origin.stop() } }
        let config = configText(resolving: [("slow.internal.test", origin)], extra: "response_head_timeout_ms = 300")
        try await withDaemon(config: config) { daemon in
            let response = try fetch(daemon, "http://slow.internal.test:\(origin.port)/slow-head/5000")
            #expect(response.status == 504)
            #expect(response.header("Proxy-Status")?.contains("error=http_response_timeout") == true)
        }
    }

    /// The response-head timer of a pooled connection is armed once and outlives its exchange:
    /// firing during a later exchange, it must check that exchange's own deadline.
    @Test("each exchange on a kept-alive connection gets its whole response-head timeout")
    func responseHeadTimeoutIsPerExchange() async throws {
        let origin = try await TestOrigin.start(name: "slow")
        defer { Task { await origin.stop() } }
        let config = configText(resolving: [("slow.internal.test", origin)], extra: "response_head_timeout_ms = 1000")
        let base = "http://slow.internal.test:\(origin.port)"
        try await withDaemon(config: config) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 20)
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            try await Task.sleep(for: .milliseconds(600))
            // The first exchange's timer comes due while this one waits; this one has time left.
            let slow = try connection.request("GET", "\(base)/slow-head/500")
            #expect(slow.status == 200)
            // And a head that never comes within its own timeout is still cut off.
            let stalled = try connection.request("GET", "\(base)/slow-head/5000")
            #expect(stalled.status == 504)
            #expect(stalled.header("Proxy-Status")?.contains("error=http_response_timeout") == true)
        }
    }

    static func expectStillServing(_ daemon: DaemonProcess) throws {
        let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
        #expect(status.status == 200)
    }
}
