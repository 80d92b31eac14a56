import Foundation
import Testing
import TestSupport

/// Large uploads to a space the daemon cannot authorize up front go with `Expect: 100-continue`:
/// the origin's 401 comes before the body, is answered from the store, and the body crosses the
/// wire once. The origins count every body byte they receive.
@Suite("Expect: 100-continue for large uploads")
struct ExpectContinueTests {
    static let user = "alice"
    static let password = "Expect-Secret-7"
    /// The replay bound the daemon runs with: every upload below is larger.
    static let replayBound = 64 * 1024
    static let size = 4 * 1024 * 1024

    static func config(_ origin: TestAuthOrigin) -> String {
        """
        [upstream]
        resolve = ["auth.internal.test:\(origin.port):127.0.0.1"]
        [limits]
        request_body_buffer_bytes = \(Self.replayBound)
        """
    }

    static func base(_ origin: TestAuthOrigin) -> String { "http://auth.internal.test:\(origin.port)" }

    static func store(_ daemon: DaemonProcess, _ origin: TestAuthOrigin) throws {
        let body: [String: Any] = ["url": Self.base(origin), "user": Self.user, "password": Self.password, "persistence": "session"]
        let connection = try UnixSocketConnection(path: daemon.socketPath)
        let response = try connection.request("POST", "/v1/passwords", headers: [("Content-Type", "application/json")], body: jsonBody(body))
        #expect(response.status == 201)
    }

    static func body(_ count: Int) -> [UInt8] { (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) } }

    /// `body` in chunked framing, in chunks of `chunkSize`.
    static func chunked(_ body: [UInt8], chunkSize: Int = 100_000) -> [UInt8] {
        var framed: [UInt8] = []
        var offset = 0
        while offset < body.count {
            let end = min(offset + chunkSize, body.count)
            framed += Array(String(end - offset, radix: 16).utf8) + [13, 10] + body[offset..<end] + [13, 10]
            offset = end
        }
        return framed + Array("0\r\n\r\n".utf8)
    }

    @Test("a large upload to a Digest space with a stored password: the 401 comes before the body, which crosses once; the next upload goes with credentials and no Expect")
    func largeUploadToDigestSpace() async throws {
        let origin = try await TestAuthOrigin.start(name: "upload", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, origin)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let target = Self.base(origin) + "/digest/SHA-256/auth/upload.bin"
            let first = try connection.request("PUT", target, body: Self.body(Self.size))
            #expect(first.status == 200, "\(first.text)")
            #expect(first.text == "hello \(Self.user)")
            #expect(first.informational.isEmpty, "the client did not ask for a 100, so it gets none")
            var stats = origin.stats
            #expect(stats.bodyBytes == Self.size, "the body crossed the wire exactly once")
            #expect(stats.expectations == 2, "the first head and the answered one both carried Expect")
            #expect(stats.earlyAnswers == 1)
            #expect(stats.continues == 1)
            #expect(stats.unauthorized == 1)
            #expect(stats.successes == 1)

            // The space is known now: the second upload carries its Digest up front, without Expect,
            // on the same client connection.
            let second = try connection.request("PUT", target, body: Self.body(Self.size))
            #expect(second.status == 200, "\(second.text)")
            stats = origin.stats
            #expect(stats.bodyBytes == 2 * Self.size)
            #expect(stats.expectations == 2)
            #expect(stats.unauthorized == 1)
            #expect(stats.successes == 2)
        }
    }

    @Test("a chunked upload of unknown length is held too, and answered the same way")
    func chunkedUpload() async throws {
        let origin = try await TestAuthOrigin.start(name: "chunked", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, origin)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let size = 3 * 1024 * 1024 + 17
            try connection.send(
                "POST \(Self.base(origin))/digest/MD5/auth/stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            try connection.send(Self.chunked(Self.body(size)))
            let response = try connection.readResponse()
            #expect(response.status == 200, "\(response.text)")
            let stats = origin.stats
            #expect(stats.bodyBytes == size)
            #expect(stats.expectations == 2)
            #expect(stats.unauthorized == 1)
            // The connection is still usable.
            #expect(try connection.request("GET", Self.base(origin) + "/digest/MD5/auth/after").status == 200)
        }
    }

    @Test("a client's own Expect: its body waits for the 100 of the attempt that takes it, and gets exactly one")
    func clientsOwnExpect() async throws {
        let origin = try await TestAuthOrigin.start(name: "careful", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, origin)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            // Small enough for the replay buffer: the client's Expect alone makes the daemon hold it.
            let body = Self.body(1000)
            try connection.send(
                "PUT \(Self.base(origin))/digest/SHA-256/auth/small HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\nExpect: 100-continue\r\n\r\n"
            )
            // The first attempt's 401 is answered in the daemon; the client hears nothing until the
            // answered attempt's 100.
            #expect(try connection.readInterimStatus() == 100)
            try connection.send(body)
            let response = try connection.readResponse()
            #expect(response.status == 200, "\(response.text)")
            #expect(response.informational.isEmpty, "one 100 only")
            #expect(origin.stats.bodyBytes == body.count)
            #expect(origin.stats.continues == 1)
        }
    }

    @Test("an HTTP/1.0 origin that ignores Expect gets the body after the wait")
    func originIgnoresExpect() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "old", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(ignoresExpect: true, speaksHTTP10: true)
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let response = try connection.request("PUT", Self.base(origin) + "/open/upload.bin", body: Self.body(Self.size))
            #expect(response.status == 200, "\(response.text)")
            #expect(response.text == "received \(Self.size) bytes")
            #expect(origin.stats.expectations == 1, "the daemon asked")
            #expect(origin.stats.continues == 0)
            #expect(origin.stats.bodyBytes == Self.size)

            // A client waiting for a 100 gets one from the daemon once it sends the body.
            try connection.send(
                "PUT \(Self.base(origin))/open/2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
            )
            #expect(try connection.readInterimStatus() == 100)
            try connection.send("12345")
            let second = try connection.readResponse()
            #expect(second.status == 200)
            #expect(second.text == "received 5 bytes")
        }
    }

    @Test("an origin that answers 417 to the daemon's Expect gets the request again without it, body and all")
    func expectationFailed() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "strict", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(refusesExpect: true)
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let response = try connection.request("PUT", Self.base(origin) + "/open/upload.bin", body: Self.body(Self.size))
            #expect(response.status == 200, "\(response.text)")
            #expect(response.text == "received \(Self.size) bytes")
            #expect(origin.stats.expectations == 1)
            #expect(origin.stats.earlyAnswers == 1)
            #expect(origin.stats.bodyBytes == Self.size)
        }
    }

    @Test("a final status to the head (413, or 401 with nothing stored) reaches the client without the body crossing; the connection then closes", arguments: ["/too-large/upload.bin", "/basic/upload.bin"])
    func refusedOnTheHead(path: String) async throws {
        let origin = try await TestAuthOrigin.start(name: "refuse", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let expected = path.hasPrefix("/too-large") ? 413 : 401
            // A client that sends its body at once: it can write it all (the daemon discards it),
            // then reads the status and the end of the connection.
            let eager = try UnixSocketConnection(path: daemon.socketPath)
            let response = try eager.request("PUT", Self.base(origin) + path, body: Self.body(Self.size))
            #expect(response.status == expected)
            #expect(response.header("Connection")?.lowercased() == "close")
            #expect(eager.peerClosed())

            // A client that waits for a 100 gets the final status instead, and never sends its body.
            let careful = try UnixSocketConnection(path: daemon.socketPath)
            try careful.send(
                "PUT \(Self.base(origin))\(path) HTTP/1.1\r\nHost: x\r\nContent-Length: \(Self.size)\r\nExpect: 100-continue\r\n\r\n"
            )
            let refused = try careful.readResponse()
            #expect(refused.status == expected)
            #expect(refused.informational.isEmpty)
            #expect(refused.header("Connection")?.lowercased() == "close")
            #expect(careful.peerClosed())

            #expect(origin.stats.bodyBytes == 0, "no body byte crossed the wire")
            #expect(origin.stats.earlyAnswers == 2)
        }
    }

    @Test("a body within the replay bound still goes at once and is replayed after the 401")
    func smallBodyReplayed() async throws {
        let origin = try await TestAuthOrigin.start(name: "small", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, origin)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let body = Self.body(Self.replayBound)
            let response = try connection.request("POST", Self.base(origin) + "/digest/SHA-256/auth-int/form", body: body)
            #expect(response.status == 200, "\(response.text)")
            #expect(origin.stats.expectations == 0)
            #expect(origin.stats.bodyBytes == 2 * body.count, "sent, then replayed from the buffer")
            #expect(origin.stats.unauthorized == 1)
        }
    }
}
