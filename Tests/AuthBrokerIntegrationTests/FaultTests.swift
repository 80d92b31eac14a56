import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// Fault injection through the real daemon: an origin that resets, stalls, or sends broken
/// HTTP or broken TLS, and clients that leave mid-transfer. Each affected request fails the way
/// a proxy must (the broker's own error with the RFC 9209 `Proxy-Status`, or, once a response
/// head went out, a cut client connection); healthy traffic on another connection meanwhile
/// is untouched; and the daemon's file descriptors return to their count before the faults.
@Suite("Faults: misbehaving origins and clients")
struct FaultTests {
    /// What the client sees when a fault hits its request.
    enum Outcome: Sendable, CustomStringConvertible {
        /// The broker's own error instead of a response head: status, `Proxy-Status` error, problem code.
        case brokerError(status: Int, proxyError: String, code: String)
        /// The origin's head was already relayed: the client connection is cut before the body's end.
        case cutAfterHead
        /// The origin's head and body as far as its own framing goes; the connection stays usable.
        case framedBody(String)

        var description: String {
            switch self {
            case .brokerError(let status, let proxyError, _): "\(status) \(proxyError)"
            case .cutAfterHead: "cut after the head"
            case .framedBody(let body): "body \(body.debugDescription)"
            }
        }
    }

    struct Fault: Sendable, CustomTestStringConvertible {
        var path: String
        var tls: Bool
        var outcome: Outcome
        var testDescription: String { "\(self.tls ? "https" : "http") \(self.path): \(self.outcome)" }
    }

    static let faults: [Fault] = [
        Fault(path: "/reset-before-head", tls: false, outcome: .brokerError(status: 502, proxyError: "connection_terminated", code: "connection_terminated")),
        Fault(path: "/partial-head", tls: false, outcome: .brokerError(status: 502, proxyError: "http_response_incomplete", code: "http_response_incomplete")),
        Fault(path: "/stall-head", tls: false, outcome: .brokerError(status: 504, proxyError: "http_response_timeout", code: "http_response_timeout")),
        Fault(path: "/malformed-status", tls: false, outcome: .brokerError(status: 502, proxyError: "http_protocol_error", code: "http_protocol_error")),
        Fault(path: "/malformed-header", tls: false, outcome: .brokerError(status: 502, proxyError: "http_protocol_error", code: "http_protocol_error")),
        Fault(path: "/endless-header", tls: false, outcome: .brokerError(status: 502, proxyError: "http_response_header_section_size", code: "response_head_too_large")),
        Fault(path: "/reset-after/200000", tls: false, outcome: .cutAfterHead),
        Fault(path: "/stall-body/200000", tls: false, outcome: .cutAfterHead),
        Fault(path: "/bad-chunked", tls: false, outcome: .cutAfterHead),
        Fault(path: "/short-body", tls: false, outcome: .cutAfterHead),
        Fault(path: "/long-body", tls: false, outcome: .framedBody("0123456789")),
        Fault(path: "/reset-before-head", tls: true, outcome: .brokerError(status: 502, proxyError: "connection_terminated", code: "connection_terminated")),
        Fault(path: "/malformed-status", tls: true, outcome: .brokerError(status: 502, proxyError: "http_protocol_error", code: "http_protocol_error")),
        Fault(path: "/endless-header", tls: true, outcome: .brokerError(status: 502, proxyError: "http_response_header_section_size", code: "response_head_too_large")),
        Fault(path: "/reset-after/200000", tls: true, outcome: .cutAfterHead),
        Fault(path: "/stall-body/200000", tls: true, outcome: .cutAfterHead),
    ]

    /// Short timeouts, so stalls fail in seconds, and idle pooled connections close at once. The
    /// response head's is the shorter, so a stall before the head is that timeout, not idleness;
    /// the TLS handshake's leaves room for a loaded machine.
    static let timeouts = """
        response_head_timeout_ms = 1000
        idle_timeout_ms = 3000
        tls_handshake_timeout_ms = 5000
        pool_idle_timeout_ms = 200
        [limits]
        max_response_head_bytes = 16384
        """

    /// How much the daemon's resident memory may grow over a test (allocator slack, not a leak).
    static let residentGrowthBoundKiB = 64 * 1024

    @Test("an origin fault fails only its own request, with the right status; descriptors return to baseline", arguments: Self.faults)
    func originFault(_ fault: Fault) async throws {
        let ca = try TestPKI.makeCA(commonName: "Fault Test CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["faulty.internal.test"], issuer: ca)
        let faulty = try await FaultyOrigin.start(identity: fault.tls ? leaf : nil)
        let healthy = try await TestOrigin.start(name: "healthy")
        defer { Task { await faulty.stop(); await healthy.stop() } }
        let config = Self.config(faulty: faulty.port, healthy: healthy, extra: Self.timeouts)
        try await withDaemon(config: config) { daemon in
            if fault.tls { #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["faulty.internal.test"]).status == 201) }
            let base = "\(fault.tls ? "https" : "http")://faulty.internal.test:\(faulty.port)"
            // The first fault may make the daemon allocate what it keeps for good; the baseline is
            // taken after it, so more of the same fault must not add anything.
            try await Self.warmUp(daemon, [base + "/hello", Self.healthyURL(healthy)])
            try Self.expect(fault.outcome, daemon: daemon, url: base + fault.path, origin: base)
            let before = await Self.baseline(daemon, faulty: faulty)

            let traffic = HealthyTraffic(socketPath: daemon.socketPath, url: Self.healthyURL(healthy), expectedBytes: Self.healthyBytes)
            for _ in 0..<3 {
                try Self.expect(fault.outcome, daemon: daemon, url: base + fault.path, origin: base)
            }
            let after = try fetch(daemon, base + "/hello")
            #expect(after.status == 200 && after.text == "hello", "the origin's next request: \(after.status) \(after.text)")
            let (successes, failures) = await traffic.stop()
            #expect(failures.isEmpty, "healthy requests failed meanwhile: \(failures)")
            #expect(successes > 0)

            try await Self.expectBackToBaseline(daemon, before, faulty: faulty)
        }
    }

    @Test(
        "a TLS handshake fault gets 502 tls_protocol_error or 504 connection_timeout",
        arguments: [
            (FaultyOrigin.HandshakeFault.closeAfterClientHello, 502, "tls_protocol_error"),
            (.plainHTTPReply, 502, "tls_protocol_error"),
            (.stall, 504, "connection_timeout"),
        ]
    )
    func handshakeFault(_ fault: FaultyOrigin.HandshakeFault, status: Int, proxyError: String) async throws {
        let faulty = try await FaultyOrigin.start(handshakeFault: fault)
        let healthy = try await TestOrigin.start(name: "healthy")
        defer { Task { await faulty.stop(); await healthy.stop() } }
        let timeouts = Self.timeouts.replacingOccurrences(of: "tls_handshake_timeout_ms = 5000", with: "tls_handshake_timeout_ms = 1000")
        try await withDaemon(config: Self.config(faulty: faulty.port, healthy: healthy, extra: timeouts)) { daemon in
            try await Self.warmUp(daemon, [Self.healthyURL(healthy)])
            let url = "https://faulty.internal.test:\(faulty.port)/hello"
            Self.expectBrokerError(try fetch(daemon, url), status: status, proxyError: proxyError)
            let before = await Self.baseline(daemon, faulty: faulty)
            let traffic = HealthyTraffic(socketPath: daemon.socketPath, url: Self.healthyURL(healthy), expectedBytes: Self.healthyBytes)
            for _ in 0..<3 {
                Self.expectBrokerError(try fetch(daemon, url), status: status, proxyError: proxyError)
            }
            let (successes, failures) = await traffic.stop()
            #expect(failures.isEmpty, "healthy requests failed meanwhile: \(failures)")
            #expect(successes > 0)
            try await Self.expectBackToBaseline(daemon, before, faulty: faulty)
        }
    }

    @Test("a client that leaves mid-download: the upstream connection closes at once, and the next requests work")
    func clientLeavesMidDownload() async throws {
        let faulty = try await FaultyOrigin.start()
        let healthy = try await TestOrigin.start(name: "healthy")
        defer { Task { await faulty.stop(); await healthy.stop() } }
        // Long timeouts: only the client's leaving can end the upstream exchange in time.
        let config = Self.config(faulty: faulty.port, healthy: healthy, extra: "idle_timeout_ms = 60000\npool_idle_timeout_ms = 200")
        try await withDaemon(config: config) { daemon in
            let base = "http://faulty.internal.test:\(faulty.port)"
            let leave = {
                let connection = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 20)
                try connection.send("GET \(base)/bytes/\(256 << 20) HTTP/1.1\r\nHost: x\r\n\r\n")
                let head = try connection.readHead()
                #expect(head.status == 200)
                _ = try connection.discard(atLeast: 1 << 20)
                connection.close()
                #expect(await faulty.waitUntilNoConnectionIsOpen(seconds: 5), "the upstream download went on after its client left")
            }
            try await Self.warmUp(daemon, [base + "/hello", Self.healthyURL(healthy)])
            try await leave()
            let before = await Self.baseline(daemon, faulty: faulty)
            let traffic = HealthyTraffic(socketPath: daemon.socketPath, url: Self.healthyURL(healthy), expectedBytes: Self.healthyBytes)
            for _ in 0..<3 { try await leave() }
            let accepted = faulty.acceptedConnections
            let next = try fetch(daemon, base + "/hello")
            #expect(next.status == 200 && next.text == "hello")
            #expect(faulty.acceptedConnections == accepted + 1, "an abandoned connection must not be reused")
            let (successes, failures) = await traffic.stop()
            #expect(failures.isEmpty, "healthy requests failed meanwhile: \(failures)")
            #expect(successes > 0)
            try await Self.expectBackToBaseline(daemon, before, faulty: faulty)
        }
    }

    @Test("a client that leaves mid-upload: the upstream connection closes at once, and the next requests work")
    func clientLeavesMidUpload() async throws {
        let faulty = try await FaultyOrigin.start()
        let healthy = try await TestOrigin.start(name: "healthy")
        defer { Task { await faulty.stop(); await healthy.stop() } }
        let config = Self.config(faulty: faulty.port, healthy: healthy, extra: "idle_timeout_ms = 60000\npool_idle_timeout_ms = 200")
        try await withDaemon(config: config) { daemon in
            let base = "http://faulty.internal.test:\(faulty.port)"
            let chunk = [UInt8](repeating: 0x55, count: 1 << 20)
            let leave = {
                let connection = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 20)
                try connection.send("POST \(base)/sink HTTP/1.1\r\nHost: x\r\nContent-Length: \(64 << 20)\r\n\r\n")
                try connection.send(chunk)
                // The upload reached the origin before the client leaves.
                for _ in 0..<100 where faulty.openConnections == 0 { try await Task.sleep(for: .milliseconds(20)) }
                connection.close()
                #expect(await faulty.waitUntilNoConnectionIsOpen(seconds: 5), "the upstream upload stayed open after its client left")
            }
            try await Self.warmUp(daemon, [base + "/hello", Self.healthyURL(healthy)])
            try await leave()
            let before = await Self.baseline(daemon, faulty: faulty)
            let traffic = HealthyTraffic(socketPath: daemon.socketPath, url: Self.healthyURL(healthy), expectedBytes: Self.healthyBytes)
            for _ in 0..<3 { try await leave() }
            let upload = try UnixSocketConnection(path: daemon.socketPath).request("POST", base + "/sink", body: chunk)
            #expect(upload.status == 200 && upload.text == "received", "the next upload: \(upload.status) \(upload.text)")
            let (successes, failures) = await traffic.stop()
            #expect(failures.isEmpty, "healthy requests failed meanwhile: \(failures)")
            #expect(successes > 0)
            try await Self.expectBackToBaseline(daemon, before, faulty: faulty)
        }
    }

    // MARK: - Helpers

    static let healthyBytes = 256 * 1024

    static func healthyURL(_ healthy: TestOrigin) -> String {
        "http://healthy.internal.test:\(healthy.port)/bytes/\(Self.healthyBytes)"
    }

    static func config(faulty: Int, healthy: TestOrigin, extra: String) -> String {
        """
        [upstream]
        resolve = ["faulty.internal.test:\(faulty):127.0.0.1", "healthy.internal.test:\(healthy.port):127.0.0.1"]
        \(extra)
        """
    }

    static func warmUp(_ daemon: DaemonProcess, _ urls: [String]) async throws {
        for url in urls {
            let response = try fetch(daemon, url)
            #expect(response.status == 200, "warm-up \(url): \(response.status) \(response.text)")
        }
    }

    /// The daemon's descriptors and memory once its idle pooled connections have expired.
    static func baseline(_ daemon: DaemonProcess, faulty: FaultyOrigin) async -> (fds: Int, residentKiB: Int) {
        _ = await faulty.waitUntilNoConnectionIsOpen()
        return (await daemon.settledFileDescriptorCount(), daemon.residentKiB ?? 0)
    }

    static func expectBackToBaseline(_ daemon: DaemonProcess, _ before: (fds: Int, residentKiB: Int), faulty: FaultyOrigin) async throws {
        #expect(await faulty.waitUntilNoConnectionIsOpen(), "the daemon kept \(faulty.openConnections) connection(s) to the faulty origin")
        let fds = await daemon.waitForFileDescriptors(atMost: before.fds)
        #expect(fds <= before.fds, "open descriptors: \(before.fds) before, \(fds) after: \(daemon.openFileDescriptors.sorted { $0.key < $1.key })")
        let resident = daemon.residentKiB ?? 0
        #expect(resident < before.residentKiB + Self.residentGrowthBoundKiB, "RSS grew from \(before.residentKiB) KiB to \(resident) KiB")
        print("fault test figures: fds \(before.fds) -> \(fds), RSS \(before.residentKiB) -> \(resident) KiB")
    }

    static func expectBrokerError(_ response: TestResponse, status: Int, proxyError: String, code: String? = nil) {
        #expect(response.status == status, "\(response.status) \(response.text)")
        #expect(response.header("Proxy-Status")?.contains("error=\(proxyError)") == true, "Proxy-Status: \(response.header("Proxy-Status") ?? "none")")
        #expect(response.header("Content-Type") == "application/problem+json")
        if let code { #expect(response.json["code"] as? String == code) }
        #expect((response.json["detail"] as? String)?.isEmpty == false)
    }

    static func expect(_ outcome: Outcome, daemon: DaemonProcess, url: String, origin: String) throws {
        let connection = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 20)
        try connection.send("GET \(url) HTTP/1.1\r\nHost: x\r\n\r\n")
        switch outcome {
        case .brokerError(let status, let proxyError, let code):
            let response = try connection.readResponse()
            Self.expectBrokerError(response, status: status, proxyError: proxyError, code: code)
        case .cutAfterHead:
            let head = try connection.readHead()
            #expect(head.status == 200)
            let rest = try connection.readToEnd()
            if let length = head.headers["content-length"].flatMap({ Int($0) }) {
                #expect(rest.count < length, "the whole body arrived: \(rest.count) bytes")
            } else {
                #expect(!rest.suffix(5).elementsEqual(Array("0\r\n\r\n".utf8)), "a chunked body that ended properly")
            }
        case .framedBody(let body):
            let response = try connection.readResponse()
            #expect(response.status == 200 && response.text == body)
            // The same client connection carries on, and never sees the origin's surplus bytes.
            let next = try connection.request("GET", origin + "/hello")
            #expect(next.status == 200 && next.text == "hello", "after the surplus: \(next.status) \(next.text)")
        }
    }
}

/// Requests to a healthy origin, one after another on one keep-alive connection, on a thread of
/// their own (the socket client blocks), until stopped.
final class HealthyTraffic: @unchecked Sendable {  // its fields are only touched under `lock`
    private let lock = NSLock()
    private var stopRequested = false
    private var finished = false
    private var successes = 0
    private var failures: [String] = []

    init(socketPath: String, url: String, expectedBytes: Int) {
        let thread = Thread { [self] in
            var connection: UnixSocketConnection?
            while !self.lock.withLock({ self.stopRequested }) {
                do {
                    let current = try connection ?? UnixSocketConnection(path: socketPath, timeoutSeconds: 20)
                    connection = current
                    let response = try current.request("GET", url)
                    if response.status == 200 && response.body.count == expectedBytes {
                        self.lock.withLock { self.successes += 1 }
                    } else {
                        self.lock.withLock { self.failures.append("\(response.status) with \(response.body.count) bytes") }
                    }
                } catch {
                    self.lock.withLock { self.failures.append("\(error)") }
                    connection = nil
                }
            }
            connection?.close()
            self.lock.withLock { self.finished = true }
        }
        thread.start()
    }

    /// Stops after the request in progress; returns how many succeeded and what failed.
    func stop() async -> (successes: Int, failures: [String]) {
        self.lock.withLock { self.stopRequested = true }
        for _ in 0..<600 where !self.lock.withLock({ self.finished }) {
            try? await Task.sleep(for: .milliseconds(50))
        }
        return self.lock.withLock { (self.successes, self.failures) }
    }
}

extension UnixSocketConnection {
    /// Reads a response head: the status and the headers (names lower-cased).
    func readHead() throws -> (status: Int, headers: [String: String]) {
        var bytes: [UInt8] = []
        while !(bytes.count >= 4 && bytes.suffix(4).elementsEqual(Array("\r\n\r\n".utf8))) {
            bytes.append(try self.readByte())
        }
        let lines = String(decoding: bytes, as: UTF8.self).split(separator: "\r\n")
        let status = Int(lines.first?.split(separator: " ").dropFirst().first ?? "") ?? -1
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            let pair = line.split(separator: ":", maxSplits: 1)
            if pair.count == 2 { headers[pair[0].lowercased()] = pair[1].trimmingCharacters(in: .whitespaces) }
        }
        return (status, headers)
    }
}

/// An origin cannot pass its response off as the broker's own error.
@Suite("Forged broker errors")
struct ForgedBrokerErrorTests {
    @Test("an origin's 502 with the broker's mark, Proxy-Status member and problem body reaches the client as the origin's")
    func forged() async throws {
        let faulty = try await FaultyOrigin.start()
        defer { Task { await faulty.stop() } }
        let config = "[upstream]\nresolve = [\"faulty.internal.test:\(faulty.port):127.0.0.1\"]\n"
        try await withDaemon(config: config) { daemon in
            let url = "http://faulty.internal.test:\(faulty.port)/forged-broker-error"
            let raw = try fetch(daemon, url)
            #expect(raw.status == 502)
            #expect(raw.header("Authbroker-Error") == nil, "the origin's mark reached the client")
            #expect(raw.header("Proxy-Status") == nil, "the origin's authbrokerd member reached the client")
            #expect(raw.text.contains("forged by the origin"))

            // authbrokerctl fetch prints the origin's body, never its "To fix" as the broker's.
            let cli = try CLIAndClientsTests.ctl(daemon, ["fetch", url])
            #expect(cli.status == 0, "\(cli.stderr)")
            #expect(cli.stdout.contains("forged by the origin"))
            #expect(!cli.stderr.contains("evil.test"))
            let failing = try CLIAndClientsTests.ctl(daemon, ["fetch", "--fail", url])
            #expect(failing.status != 0)
            #expect(!failing.stderr.contains("evil.test"))
            #expect(!failing.stderr.lowercased().contains("to fix"))

            // The broker's own error still carries the mark.
            let refused = try fetch(daemon, "http://127.0.0.1:1/nothing-listens")
            #expect(refused.status == 502)
            #expect(refused.header("Authbroker-Error") != nil)
            #expect(refused.json["code"] as? String == refused.header("Authbroker-Error"))
        }
    }
}

/// An origin that answers before the request body and then reads the body as a request of its
/// own: the connection is out of step, and another app's request must never be sent on it.
@Suite("Response desync between apps")
struct ResponseDesyncTests {
    @Test("a response that ends before its request body was written closes the upstream connection; the next app gets its own answer")
    func earlyAnswerIsNeverReused() async throws {
        let faulty = try await FaultyOrigin.start()
        defer { Task { await faulty.stop() } }
        let config = "[upstream]\nresolve = [\"faulty.internal.test:\(faulty.port):127.0.0.1\"]\n"
        try await withDaemon(config: config) { daemon in
            let base = "http://faulty.internal.test:\(faulty.port)"
            let smuggled = "GET /smuggled HTTP/1.1\r\nHost: faulty.internal.test\r\n\r\n"
            // App one: the head first; the body only after the answer has come back.
            let first = try UnixSocketConnection(path: daemon.socketPath)
            try first.send("POST \(base)/early-answer HTTP/1.1\r\nHost: faulty.internal.test\r\nContent-Length: \(smuggled.utf8.count)\r\n\r\n")
            let early = try first.readResponse(method: "POST")
            #expect(early.status == 200)
            #expect(early.text == "early")
            try first.send(smuggled)

            // App two, on its own connection, asks for something else on the same origin.
            for _ in 0..<3 {
                let second = try fetch(daemon, base + "/hello")
                #expect(second.status == 200)
                #expect(second.text == "hello", "another app's request received the answer smuggled in the first app's body")
            }
            first.close()
        }
    }
}

/// RFC 9110 §5.5 / RFC 7617 §2.1: a realm sent in ISO-8859-1 matches what a person stored.
@Suite("ISO-8859-1 realms")
struct Latin1RealmTests {
    @Test("a password stored for realm foo-ä answers a server that sends the realm as ISO-8859-1 bytes")
    func latin1RealmMatches() async throws {
        let faulty = try await FaultyOrigin.start()
        defer { Task { await faulty.stop() } }
        let config = "[upstream]\nresolve = [\"faulty.internal.test:\(faulty.port):127.0.0.1\"]\n"
        try await withDaemon(config: config) { daemon in
            let base = "http://faulty.internal.test:\(faulty.port)"
            let stored = try StoredCredentialTests.store(daemon, url: base, user: "alice", password: "s3cret", realm: "foo-\u{E4}")
            #expect(stored.status == 201, "\(stored.text)")
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let response = try connection.request("GET", "\(base)/latin1-realm")
            #expect(response.status == 200, "\(response.text)")
            #expect(response.text == "welcome")
            // Other responses through the same connection still pass unchanged.
            let hello = try connection.request("GET", "\(base)/hello")
            #expect(hello.status == 200 && hello.text == "hello")
        }
    }

    @Test("the upstream proxy's 407 to CONNECT with an ISO-8859-1 realm is answered from the password stored for foo-ä")
    func latin1ProxyRealmOnConnect() async throws {
        let proxy = try await FaultyOrigin.start()
        defer { Task { await proxy.stop() } }
        let config = "[upstream]\nproxy = \"http://127.0.0.1:\(proxy.port)\"\nresolve = [\"tunnelled.internal.test:443:127.0.0.1\"]\n"
        try await withDaemon(config: config) { daemon in
            let stored = try StoredCredentialTests.store(
                daemon, url: "http://127.0.0.1:\(proxy.port)", user: "alice", password: "s3cret", realm: "foo-\u{E4}"
            )
            #expect(stored.status == 201, "\(stored.text)")
            let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", "https://tunnelled.internal.test/")
            // The proxy accepted the answer and opened (then closed) the tunnel: no 407 reaches the app.
            #expect(proxy.authorizedConnects == 1, "\(response.status) \(response.text)")
            #expect(response.status != 407, "\(response.text)")
        }
    }
}
