import AuthBrokerCore
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import AuthBrokerDaemon

/// An upstream connection's response decoding (`HeadNormalizer`, NIO's decoder,
/// `UpstreamExchangeHandler`, as `UpstreamConnector` builds it) against hostile origins: what
/// reaches the exchange must not depend on how the origin's bytes were split into reads, must be
/// what the final head's framing says, and a connection that sent more than the response it was
/// asked for is never left open for another exchange (RFC 9112 §6.3, §9.3).
@Suite("Upstream response framing")
struct UpstreamResponseFramingTests {
    /// What one exchange came to.
    struct Outcome: Equatable, CustomStringConvertible {
        /// Status and fields of each head, in order; then the body, whether it ended, whether it failed.
        var heads: [String] = []
        var body: [UInt8] = []
        var ended = false
        var failed = false
        /// Still open (and so offered to the pool) after the response.
        var open = false
        var disorder: [String] = []
        var finalHead: HTTPResponseHead?

        static func == (lhs: Self, rhs: Self) -> Bool {
            (lhs.heads, lhs.body, lhs.ended, lhs.failed, lhs.open, lhs.disorder) == (rhs.heads, rhs.body, rhs.ended, rhs.failed, rhs.open, rhs.disorder)
        }

        var description: String { "heads \(self.heads), body \(self.body.count), ended \(self.ended), failed \(self.failed), open \(self.open)" }
    }

    /// One exchange (`method`, its end written with its head, as the relay sends) on a fresh
    /// connection, the origin's bytes arriving as `reads`; then the origin closes when `closes`.
    static func exchange(_ method: HTTPMethod, reads: [[UInt8]], closes: Bool) throws -> Outcome {
        let channel = EmbeddedChannel()
        let handler = try UpstreamExchangeHandler.addHTTPHandlers(
            to: channel.pipeline.syncOperations, responseHeadTimeout: .seconds(30), idleTimeout: .seconds(30), maxResponseHeadBytes: 8192,
            onClose: {}
        )
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        let sink = UpstreamExchangeHandlerTests.RecordingSink()
        try handler.beginRelay(to: sink)
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: "/r")
        head.headers.add(name: "Host", value: "o.test")
        try channel.writeOutbound(HTTPClientRequestPart.head(head))
        try channel.writeOutbound(HTTPClientRequestPart.end(nil))
        while try channel.readOutbound(as: ByteBuffer.self) != nil {}
        for read in reads where channel.isActive {
            _ = try? channel.writeInbound(ByteBuffer(bytes: read))
            channel.pipeline.fireChannelReadComplete()
        }
        var outcome = Outcome()
        outcome.open = channel.isActive
        if closes, channel.isActive { _ = try? channel.finish() }
        outcome.failed = sink.failure != nil
        for part in sink.parts {
            if outcome.ended { outcome.disorder.append("a part after the end") }
            switch part {
            case .head(let head):
                if outcome.finalHead != nil { outcome.disorder.append("a head after the final one") }
                outcome.heads.append("\(head.status.code) \(head.headers.map { "\($0.name)=\($0.value)" })")
                if head.status.code >= 200 { outcome.finalHead = head }
            case .body(let buffer):
                if outcome.finalHead == nil { outcome.disorder.append("a body before the final head") }
                outcome.body += Array(buffer.readableBytesView)
            case .end:
                outcome.ended = true
            }
        }
        return outcome
    }

    enum Framing: Equatable {
        case none, length(String), chunked(String), closeDelimited
    }

    /// An origin's answer to one request: interim heads, a final head with one of the framings
    /// decoders have disagreed about, and now and then bytes after it that nobody asked for.
    static func answer(_ method: HTTPMethod, _ random: inout SplitMixRandom) -> (bytes: [UInt8], framing: Framing, extra: Bool, body: [UInt8]) {
        func rarely<T>(_ usual: T, _ others: [T]) -> T {
            Int.random(in: 0..<6, using: &random) == 0 ? others.randomElement(using: &random) ?? usual : usual
        }
        func ows() -> String { rarely("", [" ", "\t", " \t"]) }
        var bytes: [UInt8] = []
        // Now and then an empty line before a head (as some origins send after a body).
        func blank() -> [UInt8] { Array(rarely("", ["\r\n", "\r\n\r\n"]).utf8) }
        for _ in 0..<rarely(0, [1, 2]) {
            bytes += blank() + Array(rarely("HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n", ["HTTP/1.1 100 Continue\r\n\r\n"]).utf8)
        }
        bytes += blank()
        let status = rarely(200, [204, 304, 401, 500])
        let body = Array("payload-".utf8) + Array(repeating: UInt8(ascii: "y"), count: Int.random(in: 0...40, using: &random))
        var head = Array("HTTP/1.1 \(status) X\r\nServer: test\(ows())\r\n".utf8)
        if Int.random(in: 0..<5, using: &random) == 0 {
            head += Array("WWW-Authenticate: Basic realm=\"caf".utf8) + [0xE9] + Array("\"\(ows())\r\n".utf8)
        }
        let framing: Framing
        var payload: [UInt8] = []
        switch Int.random(in: 0..<4, using: &random) {
        case 0:
            framing = .length(rarely("\(body.count)", ["0\(body.count)", "\(body.count), \(body.count)"]) + ows())
            head += Array("Content-Length: \(framing.fieldValue)\r\n".utf8)
            payload = body
        case 1, 2:
            framing = .chunked(rarely("chunked", ["Chunked", "gzip, chunked"]) + ows())
            head += Array("Transfer-Encoding: \(framing.fieldValue)\r\n".utf8)
            var rest = body[...]
            while !rest.isEmpty {
                let size = Int.random(in: 1...rest.count, using: &random)
                payload += Array((String(size, radix: 16) + rarely("", [";ext=1", ";a=\"b\""]) + "\r\n").utf8) + rest.prefix(size) + Array("\r\n".utf8)
                rest = rest.dropFirst(size)
            }
            payload += Array(("0\r\n" + rarely("", ["T: t\r\n"]) + "\r\n").utf8)
        default:
            framing = status == 204 || status == 304 ? .none : .closeDelimited
            payload = framing == .none ? [] : body
        }
        bytes += head + Array("\r\n".utf8)
        let bodiless = method == .HEAD || status == 204 || status == 304
        if !bodiless { bytes += payload }
        let extra = Int.random(in: 0..<5, using: &random) == 0
        if extra { bytes += Array("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged".utf8) }
        return (bytes, framing, extra, body)
    }

    @Test("a response reaches the exchange as its framing says, however the origin splits it; one with bytes after it is never kept")
    func splitInvariantFraming() throws {
        var (delimited, extras, framedBodies) = (0, 0, Set<String>())
        for seed in UInt64(1)...3000 {
            var random = SplitMixRandom(state: seed)
            let method: HTTPMethod = Int.random(in: 0..<5, using: &random) == 0 ? .HEAD : .GET
            let (bytes, framing, extra, body) = Self.answer(method, &random)
            let whole = try Self.exchange(method, reads: [bytes], closes: true)
            let reads = ClientRequestFramingTests.reads(of: bytes, &random)
            let split = try Self.exchange(method, reads: reads, closes: true)
            #expect(whole == split, "seed \(seed): whole \(whole), split \(split)")
            for outcome in [whole, split] {
                #expect(outcome.disorder.isEmpty, "seed \(seed): \(outcome.disorder)")
                guard let final = outcome.finalHead, outcome.ended else { continue }
                let bodiless = method == .HEAD || final.status == .noContent || final.status == .notModified
                if bodiless {
                    #expect(outcome.body.isEmpty, "seed \(seed): a body for \(method) \(final.status.code)")
                } else if case .closeDelimited = framing {
                    delimited += 1
                    #expect(outcome.body == body + (extra ? Array("HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged".utf8) : []), "seed \(seed)")
                } else {
                    if case .chunked = framing { framedBodies.insert("chunked") } else { framedBodies.insert("length") }
                    #expect(outcome.body == body, "seed \(seed): \(outcome.body.count) bytes against \(body.count)")
                }
            }
            // Kept open only when the response ended where its framing said and nothing followed.
            let kept = try Self.exchange(method, reads: [bytes], closes: false)
            let status = kept.finalHead?.status
            let runsToClose: Bool =
                if case .closeDelimited = framing, method != .HEAD, status != .noContent, status != .notModified { true } else { false }
            if extra, !runsToClose {
                extras += 1
                #expect(!kept.open, "seed \(seed): a connection that sent bytes after its response stays open")
            }
            if runsToClose {
                #expect(!kept.ended, "seed \(seed): a close-delimited body ended before the close")
            }
        }
        #expect(
            delimited > 100 && extras > 100 && framedBodies == ["length", "chunked"],
            "the drive reached \(delimited) close-delimited bodies, \(extras) extra responses, \(framedBodies)"
        )
    }
}

extension UpstreamResponseFramingTests {
    @Test("bytes an origin sends after its response, split inside the next head's CRLF CRLF, close the connection")
    func bytesAfterResponseStraddlingReads() throws {
        // The response ends inside the second read, which also starts a head; that head's end
        // straddles the second and third reads. Held back, the rest would have waited in the
        // pool and come out as the answer to the next request sent on the connection.
        let reads = [
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\no", "kHTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r", "\nforged",
        ]
        let outcome = try Self.exchange(.GET, reads: reads.map { Array($0.utf8) }, closes: false)
        #expect(outcome.ended && outcome.body == Array("ok".utf8))
        #expect(!outcome.open, "the connection is closed, never offered to the pool")
    }
}

extension UpstreamResponseFramingTests {
    @Test("an empty line before a response (RFC 9112 §2.2) is skipped, and the response read whole", arguments: [false, true])
    func emptyLineBeforeResponse(split: Bool) throws {
        let response = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
        let reads = split ? ["\r\n", response] : ["\r\n" + response]
        let outcome = try Self.exchange(.GET, reads: reads.map { Array($0.utf8) }, closes: false)
        #expect(outcome.ended && outcome.body == Array("hello".utf8) && !outcome.failed, "\(outcome)")
        #expect(outcome.open, "a complete response leaves the connection for the pool")
    }
}

extension UpstreamResponseFramingTests {
    @Test("a bare CR before a response is refused, not skipped as an empty line", arguments: [false, true])
    func bareCRBeforeResponse(split: Bool) throws {
        let response = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"
        let reads = split ? ["\r", response] : ["\r" + response]
        let outcome = try Self.exchange(.GET, reads: reads.map { Array($0.utf8) }, closes: false)
        #expect(outcome.failed && !outcome.open && outcome.heads.isEmpty, "\(outcome)")
    }
}

extension UpstreamResponseFramingTests.Framing {
    var fieldValue: String {
        switch self {
        case .length(let value), .chunked(let value): value
        case .none, .closeDelimited: ""
        }
    }
}

extension UpstreamResponseFramingTests {
    @Test("a response nobody asked for, begun in a read after the real one ended, closes the connection", arguments: [false, true])
    func unrequestedResponseInLaterRead(whole: Bool) throws {
        // Held as a head (when not whole), it would have stayed in the pooled connection and
        // completed as the answer to the next request sent on it.
        let forged = whole ? "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged" : "HTTP/1.1 200 OK\r\nX-Forged: 1\r\n"
        let reads = ["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", forged]
        let outcome = try Self.exchange(.GET, reads: reads.map { Array($0.utf8) }, closes: false)
        #expect(outcome.ended && outcome.body == Array("ok".utf8) && !outcome.failed, "\(outcome)")
        #expect(!outcome.open, "closed, never offered to the pool")
    }

    @Test("empty lines an origin sends after its response, in a read of their own, leave the connection usable")
    func emptyLinesAfterResponse() throws {
        let reads = ["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "\r\n"]
        let outcome = try Self.exchange(.GET, reads: reads.map { Array($0.utf8) }, closes: false)
        #expect(outcome.ended && outcome.open, "\(outcome)")
    }
}

extension UpstreamResponseFramingTests {
    @Test("bytes from an origin before the first request on a new connection close it")
    func bytesBeforeFirstRequest() throws {
        let channel = EmbeddedChannel()
        let handler = try UpstreamExchangeHandler.addHTTPHandlers(
            to: channel.pipeline.syncOperations, responseHeadTimeout: .seconds(30), idleTimeout: .seconds(30), maxResponseHeadBytes: 8192,
            onClose: {}
        )
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        _ = try? channel.writeInbound(ByteBuffer(string: "HTTP/1.1 200 OK\r\nX-Early: 1\r\n"))
        #expect(!channel.isActive, "a head begun before any request is never kept for one")
        #expect(throws: UpstreamExchangeError.self) { try handler.beginRelay(to: UpstreamExchangeHandlerTests.RecordingSink()) }
    }
}

extension UpstreamResponseFramingTests {
    @Test("an HTTP/1.0 response with Transfer-Encoding is read, then its connection closed whatever it says of keep-alive (RFC 9112 §6.1)")
    func http10WithTransferEncodingCloses() throws {
        let faulty = "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        let outcome = try Self.exchange(.GET, reads: [Array(faulty.utf8)], closes: false)
        #expect(outcome.ended && outcome.body == Array("abc".utf8) && !outcome.failed, "\(outcome)")
        #expect(!outcome.open, "an HTTP/1.0 response framed by Transfer-Encoding left its connection for the pool")
        // The control: HTTP/1.0 with a length and keep-alive stays usable.
        let plain = "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc"
        #expect(try Self.exchange(.GET, reads: [Array(plain.utf8)], closes: false).open)
    }
}
