import AuthBrokerCore
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import AuthBrokerDaemon

/// The client connection's request decoding (`HeadNormalizer`, NIO's decoder, `RequestFramingCheck`)
/// against hostile pipelines: what a request's body is must not depend on how its bytes were
/// split into reads (a client, or anyone who can delay its packets, chooses that), and must be
/// what the head's framing says, or the broker would forward a different request than the one
/// it framed (request smuggling, RFC 9112 §11.2).
@Suite("Client request framing")
struct ClientRequestFramingTests {
    /// One request as the pipeline passed it on, complete.
    struct Decoded: Equatable, CustomStringConvertible {
        var method: HTTPMethod
        var uri: String
        var framing: RequestBodyFraming?
        var body: [UInt8]
        var description: String { "\(self.method) \(self.uri) \(self.framing.map { "\($0)" } ?? "unframed") body \(self.body.count)" }
    }

    struct Outcome {
        /// The requests passed on whole (head, body, end), in order.
        var requests: [Decoded] = []
        /// The pipeline refused the connection's bytes (an error went on); nothing follows it.
        var refused = false
        /// A request's parts came out of order (a body without a head, a head inside a request).
        var disorder: [String] = []
    }

    /// What leaves the pipeline, in order: parts and errors.
    final class Recorder: ChannelInboundHandler {
        typealias InboundIn = HTTPServerRequestPart
        enum Event {
            case part(HTTPServerRequestPart)
            case error
        }
        var events: [Event] = []

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            self.events.append(.part(self.unwrapInboundIn(data)))
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            self.events.append(.error)
        }
    }

    /// Feeds `reads` through a fresh pipeline, then closes it.
    static func decode(_ reads: [[UInt8]]) throws -> Outcome {
        let normalizer = HeadNormalizer(.requests, maxHeadBytes: 8192)
        let framing = RequestFramingCheck(normalizer: normalizer)
        let recorder = Recorder()
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandlers([
            normalizer, ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)), framing, recorder,
        ])
        for read in reads { try channel.writeInbound(ByteBuffer(bytes: read)) }
        // Every request here is complete, so none may wait for the close (a head held back).
        let beforeClose = recorder.events.count
        _ = try channel.finish()
        var outcome = Outcome()
        if recorder.events.dropFirst(beforeClose).contains(where: { if case .part = $0 { true } else { false } }) {
            outcome.disorder.append("parts held until the close")
        }
        var current: Decoded?
        for event in recorder.events {
            guard case .part(let part) = event else {
                outcome.refused = true
                continue
            }
            if outcome.refused { outcome.disorder.append("a part after the refusal") }
            switch part {
            case .head(let head):
                if current != nil { outcome.disorder.append("a head inside a request") }
                current = Decoded(method: head.method, uri: head.uri, framing: try? RequestBodyFraming.of(head.headers), body: [])
            case .body(let buffer):
                if current == nil { outcome.disorder.append("a body without a head") }
                current?.body += Array(buffer.readableBytesView)
            case .end:
                if let done = current { outcome.requests.append(done) } else { outcome.disorder.append("an end without a head") }
                current = nil
            }
        }
        return outcome
    }

    /// A pipeline of requests, each with framing variants (OWS, repeats, lists, codings,
    /// extensions, trailers, ISO-8859-1 bytes) that decoders have disagreed about, now and then
    /// an empty line before it (RFC 9112 §2.2), and bodies that look like the end of a head.
    static func pipeline(_ random: inout SplitMixRandom) -> [UInt8] {
        var bytes: [UInt8] = []
        for index in 0..<Int.random(in: 1...4, using: &random) {
            let method = ["GET", "POST", "PUT", "HEAD", "DELETE"][Int.random(in: 0..<5, using: &random)]
            var head = "\(method) http://o.test/\(index) HTTP/1.1\r\nHost: o.test\r\n"
            // Mostly well-formed, so that requests after a hostile one are read too.
            func rarely<T>(_ usual: T, _ others: [T]) -> T {
                Int.random(in: 0..<8, using: &random) == 0 ? others.randomElement(using: &random) ?? usual : usual
            }
            // A body the normalizer would change if it took it for a head: whitespace before a
            // CRLF, an empty line, a byte that is not UTF-8.
            let headLike: [UInt8] = Array("X: y \r\n\r\n".utf8) + [0xE9]
            let body = Array("body-\(index)-".utf8) + rarely([], [headLike])
                + Array(repeating: UInt8(ascii: "x"), count: Int.random(in: 0...20, using: &random))
            var payload: [UInt8] = []
            func ows() -> String { rarely("", [" ", "\t", "  ", " \t"]) }
            switch Int.random(in: 0..<4, using: &random) {
            case 0:
                break
            case 1:
                let length = Int.random(in: 0...3, using: &random) == 0 ? body.count + Int.random(in: -3...3, using: &random) : body.count
                let value = rarely("\(length)", ["0\(length)", "\(length), \(length)", "\(length),\(body.count)", "+\(length)", "\(length).0"])
                head += "Content-Length:\(rarely(" ", [""]))\(value)\(ows())\r\n"
                if Int.random(in: 0..<12, using: &random) == 0 { head += "Content-Length: \(body.count)\r\n" }
                payload = body
            default:
                let coding = rarely("chunked", ["Chunked", "gzip, chunked", "chunked, chunked", "identity", "chunked;q=1", "chunked,", " chunked"])
                head += "Transfer-Encoding: \(coding)\(ows())\r\n"
                if Int.random(in: 0..<12, using: &random) == 0 { head += "Content-Length: \(body.count)\r\n" }
                var rest = body[...]
                while !rest.isEmpty {
                    let size = Int.random(in: 1...max(1, rest.count), using: &random)
                    let extensions = rarely("", [";ext=1", " ;x", ";a=\"b\""])
                    payload += Array((String(size, radix: 16) + extensions + "\r\n").utf8) + rest.prefix(size) + Array("\r\n".utf8)
                    rest = rest.dropFirst(size)
                }
                payload += Array(("0\r\n" + (Int.random(in: 0..<3, using: &random) == 0 ? "Trailer-Field: t\r\n" : "") + "\r\n").utf8)
            }
            var headBytes = Array(head.utf8)
            if Int.random(in: 0..<4, using: &random) == 0 {
                headBytes += Array("X-Realm: caf".utf8) + [0xE9] + Array("\(ows())\r\n".utf8)
            }
            bytes += Array(rarely("", ["\r\n", "\r\n\r\n"]).utf8) + headBytes + Array("\r\n".utf8) + payload
        }
        return bytes
    }

    /// `bytes` cut at random places: one byte at a time now and then, else reads of up to 16,
    /// 64 or 512 bytes (large enough to hold the end of one message, a whole head and part of
    /// its body).
    static func reads(of bytes: [UInt8], _ random: inout SplitMixRandom) -> [[UInt8]] {
        if Int.random(in: 0..<4, using: &random) == 0 { return bytes.map { [$0] } }
        let largest = [16, 64, 512][Int.random(in: 0..<3, using: &random)]
        var reads: [[UInt8]] = []
        var rest = bytes[...]
        while !rest.isEmpty {
            let size = Int.random(in: 1...max(1, min(rest.count, largest)), using: &random)
            reads.append(Array(rest.prefix(size)))
            rest = rest.dropFirst(size)
        }
        return reads
    }

    @Test("a request's body is what its head's framing says, however its bytes are split into reads")
    func splitInvariantFraming() throws {
        // The drive must reach both kinds: requests read whole, with bodies of each framing, and refusals.
        var (framedBodies, refusals) = (Set<String>(), 0)
        defer {
            #expect(framedBodies == ["length", "chunked"] && refusals > 100, "the drive reached \(framedBodies), \(refusals) refusals")
        }
        for seed in UInt64(1)...3000 {
            var random = SplitMixRandom(state: seed)
            let bytes = Self.pipeline(&random)
            let whole = try Self.decode([bytes])
            for _ in 0..<3 {
                let split = try Self.decode(Self.reads(of: bytes, &random))
                for outcome in [whole, split] {
                    #expect(outcome.disorder.isEmpty, "seed \(seed): \(outcome.disorder)")
                    for request in outcome.requests {
                        switch request.framing {
                        case .none?:
                            #expect(request.body.isEmpty, "seed \(seed): \(request) has a body its head does not frame")
                        case .length(let length)?:
                            #expect(request.body.count == length, "seed \(seed): \(request) is not its Content-Length \(length)")
                        case .chunked?:
                            break
                        case nil:
                            Issue.record("seed \(seed): \(request) went on with a head whose framing is refused")
                        }
                    }
                }
                // Either may refuse earlier (a pipelined head in the same read is not repaired);
                // what both passed on must be the same requests.
                let common = min(whole.requests.count, split.requests.count)
                #expect(
                    Array(whole.requests.prefix(common)) == Array(split.requests.prefix(common)),
                    "seed \(seed): \(whole.requests) against \(split.requests)"
                )
                refusals += split.refused ? 1 : 0
                for request in split.requests where !request.body.isEmpty {
                    framedBodies.insert(request.framing == .chunked ? "chunked" : "length")
                }
                if !whole.refused && !split.refused {
                    #expect(whole.requests == split.requests, "seed \(seed): \(whole.requests) against \(split.requests)")
                }
            }
        }
    }
}

extension ClientRequestFramingTests {
    @Test("a pipelined head whose CRLF CRLF straddles two reads goes on at once, not at the close")
    func pipelinedHeadStraddlingReads() throws {
        let first = "POST http://o.test/1 HTTP/1.1\r\nHost: o.test\r\nContent-Length: 2\r\n\r\nok"
        let second = "GET http://o.test/2 HTTP/1.1\r\nHost: o.test\r\n\r\n"
        // The first request ends inside the read that starts the second; the second's end is split.
        for cut in [second.utf8.count - 1, second.utf8.count - 2, second.utf8.count - 3] {
            let bytes = Array((first + second).utf8)
            let reads = [Array(bytes[..<(first.utf8.count + cut)]), Array(bytes[(first.utf8.count + cut)...])]
            let outcome = try Self.decode(reads)
            #expect(outcome.disorder.isEmpty, "cut \(cut): \(outcome.disorder)")
            #expect(outcome.requests.map(\.uri) == ["http://o.test/1", "http://o.test/2"] && !outcome.refused, "cut \(cut)")
        }
    }
}

/// SplitMix64 (Steele, Lea and Flood), for reproducible drives.
struct SplitMixRandom: RandomNumberGenerator {
    var state: UInt64

    mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
