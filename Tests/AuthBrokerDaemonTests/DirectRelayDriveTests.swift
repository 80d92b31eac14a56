import AuthBrokerCore
import AuthBrokerDaemon
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

/// The direct relay's shell under a seeded random drive: one client connection sends plain
/// requests (some the relay may take, some it must not), origins answer on pooled connections
/// as they please (200, `Connection: close`, 401, 103 first, closing before the head or in the
/// body), the full path (played by the test, as the connection's task would) answers what it is
/// given, in order, and idle connections come and go. Whatever happens, the client gets each
/// response in the order it asked, each one its own request's (every body names its path), and
/// once everything is answered nothing is left in flight or leased.
@Suite("Direct relay shell, seeded drive", .timeLimit(.minutes(5)))
struct DirectRelayDriveTests {
    @Test("responses in order and each its own; nothing in flight or leased at the end")
    func drive() async throws {
        let reached = try await RelayDrive.run(seeds: 0..<150, wire: false)
        // It cannot pass without having gone where it means to.
        #expect(reached.relayed > 200 && reached.adopted > 20 && reached.handedOver > 50, "\(reached)")
        #expect(reached.fullPathAnswers > 500 && reached.cuts > 5 && reached.unwritableWhileAsked > 10, "\(reached)")
    }

    @Test("the same with real bytes through the upstream HTTP handlers, split into reads, with empty lines and forged responses after some")
    func driveWithBytes() async throws {
        let reached = try await RelayDrive.run(seeds: 1000..<1100, wire: true)
        #expect(reached.relayed > 100 && reached.adopted > 10 && reached.handedOver > 30 && reached.cuts > 3 && reached.forged > 20, "\(reached)")
        #expect(reached.protocolErrors > 0, "a request sent on a connection a forgery made unusable was reached (\(reached))")
    }
}

final class RelayDrive {
    let harness: DataPlaneHarness
    var random: SplitMixRandom
    var next = 0
    /// Paths in the order the client sent them.
    var sent: [String] = []
    /// Bodies of the complete responses the client got, in order.
    var received: [String] = []
    var partial: String?
    /// The `Authbroker-Error` code of the response being received, if it is the broker's own.
    var partialBrokerError: String?
    /// Requests the relay gave the full path, ended, in order; and a head whose end is to come.
    var fullPath: [HTTPRequestHead] = []
    var fullPathHead: HTTPRequestHead?
    /// The path each upstream connection was sent and has not answered.
    var outstanding: [ObjectIdentifier: (channel: NIOAsyncTestingChannel, path: String)] = [:]
    var clientCut = false
    /// The origin was just made to fail inside a response body: the only step that may cut the
    /// client's connection.
    var cutExpected = false
    var notRelayable: Set<String> = []
    var log: [String] = []
    var reached = Reached()

    /// What the drives got to, summed over seeds.
    struct Reached: CustomStringConvertible {
        var relayed = 0
        var adopted = 0
        var handedOver = 0
        var fullPathAnswers = 0
        var cuts = 0
        var unwritableWhileAsked = 0
        /// Forged responses sent in the same read as a real one's end (with bytes only).
        var forged = 0
        /// Requests answered with the broker's `http_protocol_error` after one.
        var protocolErrors = 0

        static func + (lhs: Self, rhs: Self) -> Self {
            Reached(
                relayed: lhs.relayed + rhs.relayed, adopted: lhs.adopted + rhs.adopted, handedOver: lhs.handedOver + rhs.handedOver,
                fullPathAnswers: lhs.fullPathAnswers + rhs.fullPathAnswers, cuts: lhs.cuts + rhs.cuts,
                unwritableWhileAsked: lhs.unwritableWhileAsked + rhs.unwritableWhileAsked, forged: lhs.forged + rhs.forged,
                protocolErrors: lhs.protocolErrors + rhs.protocolErrors
            )
        }

        var description: String {
            "relayed \(self.relayed), adopted \(self.adopted), handed over \(self.handedOver), full path \(self.fullPathAnswers), cuts \(self.cuts), unwritable while asked \(self.unwritableWhileAsked), forged \(self.forged), protocol errors \(self.protocolErrors)"
        }
    }

    /// A drive per seed, of 60 steps each; what they reached, summed.
    static func run(seeds: Range<Int>, wire: Bool) async throws -> Reached {
        var reached = Reached()
        for seed in seeds {
            let drive = try await RelayDrive(seed: UInt64(seed), wire: wire)
            try await drive.run(steps: 60)
            reached = reached + drive.reached
        }
        return reached
    }

    /// Origins send bytes, through the HTTP handlers the daemon gives its upstream connections.
    let wire: Bool
    /// The upstream connection a forged response was just sent on, until the next harvest.
    var forgedOn: ObjectIdentifier?
    /// Requests the relay had sent on a connection that a forgery then made unusable: the only
    /// ones whose answer may be the broker's `http_protocol_error`.
    var poisoned: Set<String> = []

    init(seed: UInt64, wire: Bool = false) async throws {
        self.wire = wire
        self.harness = try await DataPlaneHarness(wire: wire)
        self.random = SplitMixRandom(state: seed &* 0x2545_F491_4F6C_DD1D)
        _ = try await self.harness.seedIdleConnection()
    }

    func run(steps: Int) async throws {
        for _ in 0..<steps where !self.clientCut {
            try await self.step()
            try await self.harvest()
            try self.checkOrder()
        }
        try await self.settle()
        self.reached.relayed = self.harness.interceptor.counters.requestsRelayedDirectly.current
    }

    private func roll(_ bound: Int) -> Int { Int.random(in: 0..<bound, using: &self.random) }

    private func step() async throws {
        let choice = self.roll(100)
        switch choice {
        case 0..<24:
            try await self.sendRequest(relayable: true)
        case 24..<28:
            try await self.sendRequest(relayable: false)
        case 28..<58:
            if let (_, pending) = self.outstanding.randomElement(using: &self.random) {
                try await self.originAnswers(pending.channel, path: pending.path)
            }
        case 58..<84:
            try await self.fullPathAnswers()
        case 84..<94:
            if self.harness.pool.openConnectionCount < 3 {
                self.log.append("new idle connection")
                _ = try await self.harness.seedIdleConnection()
            }
        default:
            let writable = self.roll(2) == 0
            self.log.append("client writable \(writable)")
            self.harness.client.isWritable = writable
            if !writable, !self.outstanding.isEmpty { self.reached.unwritableWhileAsked += 1 }
            let client = self.harness.client
            try await self.harness.loop.submit { client.pipeline.fireChannelWritabilityChanged() }.get()
        }
    }

    private func sendRequest(relayable: Bool) async throws {
        self.next += 1
        let path = "/r\(self.next)"
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: DataPlaneHarness.origin + path)
        // The relay takes no request with credentials of its own (`DirectRelayPolicy`).
        if !relayable {
            head.headers.add(name: "Authorization", value: "Basic eDp5")
            self.notRelayable.insert(path)
        }
        self.log.append("client sends \(path)\(relayable ? "" : " (for the full path)")")
        self.sent.append(path)
        try await self.harness.client.writeInbound(HTTPServerRequestPart.head(head))
        try await self.harness.client.writeInbound(HTTPServerRequestPart.end(nil))
    }

    private func originAnswers(_ upstream: NIOAsyncTestingChannel, path: String) async throws {
        self.outstanding[ObjectIdentifier(upstream)] = nil
        let kind = self.roll(100)
        self.log.append("origin answers \(path): \(kind)")
        if self.wire {
            try await self.originAnswersInBytes(upstream, path: path, kind: kind)
            return
        }
        func head(_ status: HTTPResponseStatus, length: Int, close: Bool = false) -> HTTPClientResponsePart {
            var headers = HTTPHeaders()
            headers.add(name: "Content-Length", value: "\(length)")
            if close { headers.add(name: "Connection", value: "close") }
            return .head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))
        }
        switch kind {
        case 0..<62, 62..<68, 68..<73:
            if kind >= 68 {
                try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .init(statusCode: 103))))
            }
            try await upstream.writeInbound(head(.ok, length: path.utf8.count, close: (62..<68).contains(kind)))
            // The body now and then in two reads.
            let cut = self.roll(path.utf8.count + 1)
            let bytes = Array(path.utf8)
            if cut > 0 { try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(bytes: bytes[..<cut]))) }
            if cut < bytes.count { try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(bytes: bytes[cut...]))) }
            try await upstream.writeInbound(HTTPClientResponsePart.end(nil))
        case 73..<85:
            var challenge = HTTPHeaders()
            challenge.add(name: "WWW-Authenticate", value: "Basic realm=\"r\"")
            challenge.add(name: "Content-Length", value: "0")
            try await upstream.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: challenge)))
            try await upstream.writeInbound(HTTPClientResponsePart.end(nil))
        case 85..<95:
            try await upstream.close()
        default:
            // Cut inside the body: the client cannot be told, its connection is cut too.
            self.cutExpected = true
            try await upstream.writeInbound(head(.ok, length: path.utf8.count + 10))
            try await upstream.writeInbound(HTTPClientResponsePart.body(ByteBuffer(string: path)))
            try await upstream.close()
        }
    }

    /// The same answers as bytes, split into reads at random places; a 200 now and then followed,
    /// in the read with its end, by an empty line (which the decoder skips) or by a whole forged
    /// response. (Bytes sent in a read of their own after a response are refused while nothing
    /// is outstanding, but taken as the answer once the relay has sent the next request: an
    /// origin answering early is indistinguishable from a fast one, so the drive sends none.)
    private func originAnswersInBytes(_ upstream: NIOAsyncTestingChannel, path: String, kind: Int) async throws {
        var response: String
        var after = ""
        switch kind {
        case 0..<73:
            response = kind >= 68 ? "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n" : ""
            response += "HTTP/1.1 200 OK\r\nContent-Length: \(path.utf8.count)\r\n"
            if (62..<68).contains(kind) { response += "Connection: close\r\n" }
            response += "\r\n" + path
            switch self.roll(10) {
            case 0: after = "\r\n"
            case 1:
                after = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
                // SwiftNIO's decoder refuses it; a request the relay started on this connection
                // meanwhile gets the broker's 502.
                self.reached.forged += 1
                self.forgedOn = ObjectIdentifier(upstream)
            default: break
            }
        case 73..<85:
            response = "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"r\"\r\nContent-Length: 0\r\n\r\n"
        case 85..<95:
            if upstream.isActive { try await upstream.close() }
            return
        default:
            self.cutExpected = true
            response = "HTTP/1.1 200 OK\r\nContent-Length: \(path.utf8.count + 10)\r\n\r\n" + path
        }
        var bytes = Array(response.utf8)
        var reads: [[UInt8]] = []
        while bytes.count > 1, self.roll(3) == 0 {
            let cut = 1 + self.roll(bytes.count - 1)
            reads.append(Array(bytes[..<cut]))
            bytes.removeFirst(cut)
        }
        reads.append(bytes + Array(after.utf8))
        // (A refused read closes the connection; what the test still writes to it is dropped.)
        for read in reads where upstream.isActive {
            _ = try? await upstream.writeInbound(ByteBuffer(bytes: read))
        }
        if kind >= 95, upstream.isActive { try await upstream.close() }
    }

    /// The connection's task answers its oldest request, taking over the relay's exchange when
    /// it was handed one, and reports it done.
    private func fullPathAnswers() async throws {
        guard !self.fullPath.isEmpty else { return }
        let head = self.fullPath.removeFirst()
        let path = String(head.uri.dropFirst(DataPlaneHarness.origin.count))
        self.log.append("full path answers \(path)")
        // As the connection's task counts: a request the relay handed over is counted already.
        let handover = self.harness.handovers.take(for: head)
        if handover == nil { self.harness.registry.requestStarted(self.harness.registration) }
        if let handover {
            self.reached.handedOver += 1
            if let adopted = handover.adopted {
                // As the connection's task does with a 401 it passes on: the rest of the
                // response read on the adopted exchange, and the connection back for reuse.
                self.reached.adopted += 1
                var parts: [HTTPClientResponsePart] = []
                for try await batch in adopted.exchange.responseParts { parts += batch }
                guard case .head(let first)? = parts.first, first.status == .unauthorized, case .end? = parts.last else {
                    Issue.record("the adopted exchange gave \(parts)")
                    throw DataPlaneHarness.Unexpected("adopted exchange")
                }
                self.harness.pool.release(adopted.lease, reusable: adopted.lease.connection.isActive)
            }
        }
        self.reached.fullPathAnswers += 1
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "\(path.utf8.count)")
        let client = self.harness.client
        client.write(HTTPServerResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers)), promise: nil)
        client.write(HTTPServerResponsePart.body(.byteBuffer(ByteBuffer(string: path))), promise: nil)
        try await client.writeAndFlush(HTTPServerResponsePart.end(nil))
        self.harness.registry.requestEnded(self.harness.registration)
        try await self.harness.fullPathRequestDone()
    }

    /// Collects what reached the client, the full path and the origins.
    private func harvest() async throws {
        let client = self.harness.client
        while let part = try await client.readOutbound(as: HTTPServerResponsePart.self) {
            switch part {
            case .head(let head):
                guard head.status.code >= 200 else { continue }
                if self.partial != nil { Issue.record("a second head before the end: \(self.log.suffix(12))") }
                self.partial = ""
                self.partialBrokerError = head.headers["Authbroker-Error"].first
            case .body(.byteBuffer(let buffer)):
                if self.partial == nil { Issue.record("a body with no head: \(self.log.suffix(12))") }
                self.partial? += String(buffer: buffer)
            case .body:
                Issue.record("a file body")
            case .end:
                guard let body = self.partial else {
                    Issue.record("an end with no head: \(self.log.suffix(12))")
                    continue
                }
                self.received.append(self.partialBrokerError.map { Self.brokerError($0) } ?? body)
                if self.partialBrokerError == "http_protocol_error" { self.reached.protocolErrors += 1 }
                self.partial = nil
            }
        }
        while let part = try await client.readInbound(as: HTTPServerRequestPart.self) {
            switch part {
            case .head(let head): self.fullPathHead = head
            case .body: Issue.record("a body for the full path")
            case .end:
                if let head = self.fullPathHead { self.fullPath.append(head) }
                self.fullPathHead = nil
            }
        }
        for upstream in self.harness.upstreamChannels {
            var sentPaths: [String] = []
            if self.wire {
                while let bytes = try await upstream.readOutbound(as: ByteBuffer.self) {
                    // A request head is one write (a bodiless request's end writes nothing).
                    let text = String(buffer: bytes)
                    if text.hasPrefix("GET "), let path = text.split(separator: " ").dropFirst().first { sentPaths.append(String(path)) }
                }
            } else {
                while let part = try await upstream.readOutbound(as: HTTPClientRequestPart.self) {
                    if case .head(let head) = part { sentPaths.append(head.uri) }
                }
            }
            if sentPaths.count > 1 || (!sentPaths.isEmpty && self.outstanding[ObjectIdentifier(upstream)] != nil) {
                Issue.record("a second request on a connection before its response: \(sentPaths); \(self.log.suffix(12))")
            }
            if self.forgedOn == ObjectIdentifier(upstream), !upstream.isActive { self.poisoned.formUnion(sentPaths) }
            for path in sentPaths {
                if self.notRelayable.contains(path) { Issue.record("\(path), not the relay's to take, went upstream from it") }
                self.outstanding[ObjectIdentifier(upstream)] = (upstream, path)
            }
            // A connection closed under its request (refused bytes, the relay giving up) answers nothing more.
            if !upstream.isActive { self.outstanding[ObjectIdentifier(upstream)] = nil }
        }
        if !client.isActive, !self.clientCut {
            self.clientCut = true
            self.reached.cuts += 1
            if !self.cutExpected { Issue.record("the client's connection was cut: \(self.log.suffix(12))") }
        }
        self.cutExpected = false
        self.forgedOn = nil
    }

    static func brokerError(_ code: String) -> String { "<the broker's \(code)>" }

    private func checkOrder() throws {
        if self.harness.registration.requestsInHand < 0 {
            Issue.record("a request counted out twice (draining would close a busy connection): \(self.log.suffix(12))")
            throw DataPlaneHarness.Unexpected("count")
        }
        for (index, body) in self.received.enumerated()
        where index >= self.sent.count
            || (body != self.sent[index] && !(body == Self.brokerError("http_protocol_error") && self.poisoned.contains(self.sent[index])))
        {
            Issue.record("response \(index) is \(body), for \(index < self.sent.count ? self.sent[index] : "nothing"); \(self.log.suffix(12))")
            throw DataPlaneHarness.Unexpected("out of order")
        }
    }

    /// Answers everything still asked, then checks nothing is left.
    private func settle() async throws {
        self.harness.client.isWritable = true
        let client = self.harness.client
        try await self.harness.loop.submit { client.pipeline.fireChannelWritabilityChanged() }.get()
        try await self.harvest()
        try self.checkOrder()
        for _ in 0..<500 {
            if let pending = self.outstanding.values.first {
                self.outstanding[ObjectIdentifier(pending.channel)] = nil
                if self.wire {
                    try await pending.channel.writeInbound(
                        ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: \(pending.path.utf8.count)\r\n\r\n\(pending.path)")
                    )
                } else {
                    try await DataPlaneHarness.respond(on: pending.channel, status: .ok, body: pending.path)
                }
            } else if !self.fullPath.isEmpty {
                try await self.fullPathAnswers()
            } else {
                break
            }
            try await self.harvest()
            try self.checkOrder()
        }
        let history = self.log.suffix(12)
        if !self.clientCut {
            #expect(self.received.count == self.sent.count, "every request answered once: \(history)")
            #expect(self.fullPathHead == nil)
        }
        #expect(self.harness.interceptor.counters.requestsInFlight.current == 0, "\(history)")
        #expect(self.harness.registration.requestsInHand == 0, "every request counted in is counted out: \(history)")
        let idle = try await self.harness.idleConnectionIDs().count
        #expect(self.harness.pool.openConnectionCount == idle, "every open connection is idle, none leased: \(history)")
    }
}
