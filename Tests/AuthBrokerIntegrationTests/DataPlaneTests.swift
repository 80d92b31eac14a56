import Foundation
import Testing
import TestSupport

/// The interceptor over plain HTTP: methods, bodies, framing, headers, keep-alive.
@Suite("Data plane over HTTP")
struct DataPlaneTests {
    @Test("GET, POST with a body, chunked upload, HEAD, redirect and keep-alive on one connection")
    func basics() async throws {
        let origin = try await TestOrigin.start(name: "plain")
        defer { Task { await origin.stop() } }
        let base = "http://origin.internal.test:\(origin.port)"
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)

            let hello = try connection.request("GET", "\(base)/hello")
            #expect(hello.status == 200)
            #expect(hello.text == "hello from plain")
            #expect(hello.header("Via")?.contains("authbrokerd") == true)
            #expect(hello.header("Authbroker-Request-Id") != nil)

            let body = Array(repeating: UInt8(ascii: "x"), count: 100_000)
            let echoed = try connection.request("POST", "\(base)/echo", body: body)
            #expect(echoed.status == 200)
            #expect(echoed.body == body)

            try connection.send(
                "PUT \(base)/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            let chunked = try connection.readResponse()
            #expect(chunked.status == 200)
            #expect(chunked.text == "hello world")

            let head = try connection.request("HEAD", "\(base)/hello")
            #expect(head.status == 200)
            #expect(head.body.isEmpty)

            let redirect = try connection.request("GET", "\(base)/redirect")
            #expect(redirect.status == 302)
            #expect(redirect.header("Location") == "/hello")

            let notFound = try connection.request("GET", "\(base)/status/404")
            #expect(notFound.status == 404)
            #expect(notFound.header("Proxy-Status") == nil)
        }
    }

    @Test("pipelined requests, bodies among them, are answered in order on one connection")
    func pipelined() async throws {
        let origin = try await TestOrigin.start(name: "pipelined")
        defer { Task { await origin.stop() } }
        let base = "http://origin.internal.test:\(origin.port)"
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            // Five requests in one write: the daemon reads ahead and must still answer in order.
            try connection.send(
                "GET \(base)/hello HTTP/1.1\r\nHost: x\r\n\r\n"
                    + "POST \(base)/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nfirst"
                    + "GET \(base)/status/404 HTTP/1.1\r\nHost: x\r\n\r\n"
                    + "PUT \(base)/echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nsecond\r\n0\r\n\r\n"
                    + "GET \(base)/hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            let responses = try (0..<5).map { _ in try connection.readResponse() }
            #expect(responses.map(\.status) == [200, 200, 404, 200, 200])
            #expect(responses[0].text == "hello from pipelined")
            #expect(responses[1].text == "first")
            #expect(responses[3].text == "second")
            #expect(responses[4].header("Connection")?.lowercased() == "close")
            #expect(try connection.readToEnd().isEmpty)
        }
    }

    @Test("hop-by-hop and Authbroker-* headers stay here; Host is the target's; Via is appended")
    func headers() async throws {
        let origin = try await TestOrigin.start(name: "headers")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let response = try fetch(
                daemon, "http://origin.internal.test:\(origin.port)/headers?x=1",
                headers: [
                    ("Connection", "X-Secret-Hop"), ("X-Secret-Hop", "drop me"), ("Keep-Alive", "timeout=5"),
                    ("Authbroker-Identity", "mine"), ("Proxy-Authorization", "Basic Zm9vOmJhcg=="),
                    ("X-Kept", "yes"), ("Via", "1.1 upstream-proxy"),
                ]
            )
            #expect(response.status == 200)
            let seen = response.json
            #expect(seen["uri"] as? String == "/headers?x=1")
            let fields = (seen["headers"] as? [[String]] ?? []).map { ($0[0].lowercased(), $0[1]) }
            let names = Set(fields.map(\.0))
            #expect(!names.contains("x-secret-hop"))
            #expect(!names.contains("keep-alive"))
            #expect(!names.contains("authbroker-identity"))
            #expect(!names.contains("proxy-authorization"))
            #expect(fields.contains { $0 == ("x-kept", "yes") })
            #expect(fields.first { $0.0 == "host" }?.1 == "origin.internal.test:\(origin.port)")
            #expect(fields.first { $0.0 == "via" }?.1 == "1.1 upstream-proxy, 1.1 authbrokerd")
        }
    }

    @Test("Expect: 100-continue is relayed from the origin")
    func expectContinue() async throws {
        let origin = try await TestOrigin.start(name: "continue")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            try connection.send(
                "POST http://origin.internal.test:\(origin.port)/expect HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
            )
            // The body goes only after the interim response, as a careful client does.
            let interim = try connection.readInterimStatus()
            #expect(interim == 100)
            try connection.send("12345")
            let final = try connection.readResponse()
            #expect(final.status == 200)
            #expect(final.text == "received 5 bytes")
        }
    }

    @Test("a 200 MiB download streams through with bounded daemon memory")
    func largeDownload() async throws {
        let origin = try await TestOrigin.start(name: "big")
        defer { Task { await origin.stop() } }
        let size = 200 * 1024 * 1024
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let baseline = daemon.residentKiB ?? 0
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            try connection.send("GET http://origin.internal.test:\(origin.port)/bytes/\(size) HTTP/1.1\r\nHost: x\r\n\r\n")
            var received = 0
            var mismatches = 0
            var peakKiB = baseline
            let response = try connection.readResponse { slice in
                if !BytePattern.matches(slice, offset: received) { mismatches += 1 }
                received += slice.count
                if received % (16 * 1024 * 1024) < slice.count {
                    peakKiB = max(peakKiB, daemon.residentKiB ?? 0)
                }
            }
            peakKiB = max(peakKiB, daemon.residentKiB ?? 0)
            #expect(response.status == 200)
            #expect(received == size)
            #expect(mismatches == 0)
            print("200 MiB download: daemon RSS \(baseline) KiB before, peak \(peakKiB) KiB during")
            // Bounded: far below the body size (a buffered body would add 200 MiB).
            #expect(peakKiB - baseline < 64 * 1024)
        }
    }

    @Test("a response cut off after its head closes the client connection; the daemon carries on")
    func truncatedResponse() async throws {
        let origin = try await TestOrigin.start(name: "cut")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            try connection.send("GET http://origin.internal.test:\(origin.port)/close-after-head HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(throws: (any Error).self) { _ = try connection.readResponse() }
            #expect(try fetch(daemon, "http://origin.internal.test:\(origin.port)/hello").status == 200)
        }
    }
}

extension UnixSocketConnection {
    /// Reads one interim (1xx) status line and its headers.
    func readInterimStatus() throws -> Int {
        var bytes: [UInt8] = []
        while !(bytes.count >= 4 && Array(bytes.suffix(4)) == Array("\r\n\r\n".utf8)) {
            let byte = try self.readByte()
            bytes.append(byte)
        }
        let line = String(decoding: bytes, as: UTF8.self).split(separator: "\r\n").first ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
    }
}
