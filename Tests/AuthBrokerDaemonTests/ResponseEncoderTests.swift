import AuthBrokerCore
import Foundation
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import AuthBrokerDaemon

/// The client connection's response encoder, on an embedded channel: requests come in through the
/// real decoder and `RequestFramingCheck` (which tells the encoder what each response answers),
/// responses go out as the bytes a client reads.
@Suite("Client response encoder")
struct ResponseEncoderTests {
    struct Connection {
        let channel: EmbeddedChannel

        func request(_ text: String) throws {
            try self.channel.writeInbound(ByteBuffer(string: text))
            while try self.channel.readInbound(as: HTTPServerRequestPart.self) != nil {}
        }

        /// Writes the parts (the last with a flush) and returns each buffer that went out.
        @discardableResult
        func respond(_ parts: [HTTPServerResponsePart]) throws -> [String] {
            for part in parts.dropLast() { self.channel.write(part, promise: nil) }
            if let last = parts.last { self.channel.writeAndFlush(last, promise: nil) }
            return try self.written()
        }

        func written() throws -> [String] {
            var buffers: [String] = []
            while let buffer = try self.channel.readOutbound(as: IOData.self) {
                guard case .byteBuffer(let bytes) = buffer else {
                    Issue.record("a file region went out")
                    continue
                }
                buffers.append(String(buffer: bytes))
            }
            return buffers
        }
    }

    static func connect(controlOnly: Bool = false) throws -> Connection {
        let terms = ClientConnectionTerms(limits: BrokerSettings.Limits(), controlOnly: controlOnly)
        let state = ClientTimeoutState()
        let timeouts = ClientTimeoutHandler(terms: terms, state: state) { _ in }
        let normalizer = HeadNormalizer(.requests, maxHeadBytes: 65536)
        let framing = RequestFramingCheck(normalizer: normalizer)
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandlers([
            normalizer, ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)), framing,
            ResponseEncoder(methods: framing, timeouts: timeouts), timeouts,
        ])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        return Connection(channel: channel)
    }

    static func head(_ status: HTTPResponseStatus = .ok, _ fields: (String, String)...) -> HTTPServerResponsePart {
        .head(HTTPResponseHead(version: .http1_1, status: status, headers: HTTPHeaders(fields)))
    }

    static func body(_ text: String) -> HTTPServerResponsePart { .body(.byteBuffer(ByteBuffer(string: text))) }

    @Test("on a control-only slot, the refusal of a pipelined data request waits for the control response before it (in order)")
    func refusalAfterEarlierResponses() throws {
        let connection = try Self.connect(controlOnly: true)
        try connection.channel.writeInbound(ByteBuffer(string: "GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\nGET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"))
        guard case .head(let control)? = try connection.channel.readInbound(as: HTTPServerRequestPart.self) else {
            Issue.record("the control request did not go on")
            return
        }
        #expect(control.uri == "/v1/status")
        while try connection.channel.readInbound(as: HTTPServerRequestPart.self) != nil {}
        connection.channel.embeddedEventLoop.run()
        #expect(try connection.written().isEmpty, "the refusal went out before the control response")
        let written = try connection.respond([Self.head(.ok, ("Content-Length", "2")), Self.body("ok"), .end(nil)])
        connection.channel.embeddedEventLoop.run()
        let all = (written + (try connection.written())).joined()
        #expect(all.hasPrefix("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"), "\(all)")
        #expect(all.contains("HTTP/1.1 503"), "no refusal after the control response: \(all)")
    }

    @Test("a small response goes out as one buffer: head, body and all")
    func smallResponseIsOneBuffer() throws {
        let connection = try Self.connect()
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.ok, ("Content-Length", "5")), Self.body("hello"), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"]
        )
        // Without a length, chunked: framing and the last chunk in the same one buffer.
        try connection.request("GET http://a.test/2 HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.ok, ("X-A", "1")), Self.body("hello"), Self.body(""), Self.body("!"), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nX-A: 1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n"]
        )
    }

    @Test("an HTTP/1.0 client never gets Transfer-Encoding: a response without a length goes as it is, ended by the close")
    func http10ClientGetsNoChunks() throws {
        let connection = try Self.connect()
        try connection.request("GET http://a.test/ HTTP/1.0\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.ok, ("X-A", "1"), ("Connection", "close")), Self.body("hello"), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nX-A: 1\r\nConnection: close\r\n\r\nhello"]
        )
        // A length is kept as it is.
        let another = try Self.connect()
        try another.request("GET http://a.test/ HTTP/1.0\r\nHost: a.test\r\n\r\n")
        #expect(
            try another.respond([Self.head(.ok, ("Content-Length", "5")), Self.body("hello"), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"]
        )
    }

    @Test("codings before chunked are kept, and the body is chunk-framed here")
    func codingsBeforeChunked() throws {
        let connection = try Self.connect()
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        let written = try connection.respond([
            Self.head(.ok, ("Transfer-Encoding", "gzip, chunked"), ("Content-Length", "9")), Self.body("gz"), .end(nil),
        ])
        #expect(written == ["HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n2\r\ngz\r\n0\r\n\r\n"])
    }

    @Test("a large body goes as its own buffer, not copied; chunked, between its framing")
    func largeBodyIsNotCopied() throws {
        let connection = try Self.connect()
        let large = String(repeating: "x", count: ResponseEncoder.joinedBodyLimit + 1)
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.ok, ("Content-Length", "\(large.utf8.count)")), Self.body(large), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nContent-Length: \(large.utf8.count)\r\n\r\n", large]
        )
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        let hex = String(large.utf8.count, radix: 16)
        #expect(
            try connection.respond([Self.head(.ok), Self.body(large), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\(hex)\r\n", large, "\r\n0\r\n\r\n"]
        )
    }

    @Test("a response to HEAD keeps its framing fields and sends no body; 204 and 304 lose them")
    func bodilessResponses() throws {
        let connection = try Self.connect()
        try connection.request("HEAD http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.ok, ("Content-Length", "5")), Self.body("hello"), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"]
        )
        try connection.request("HEAD http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(try connection.respond([Self.head(.ok), .end(nil)]) == ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"])
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.notModified, ("Content-Length", "5"), ("ETag", "\"a\"")), .end(nil)])
                == ["HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\n\r\n"]
        )
        // The next GET's response has its body again.
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([Self.head(.ok, ("Content-Length", "2")), Self.body("ok"), .end(nil)])
                == ["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"]
        )
    }

    @Test("1xx heads go before the final one, which answers the same request")
    func informationalHeads() throws {
        let connection = try Self.connect()
        try connection.request("HEAD http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        #expect(
            try connection.respond([
                Self.head(.custom(code: 103, reasonPhrase: "Early Hints"), ("Link", "</a.css>; rel=preload")),
                Self.head(.ok, ("Content-Length", "5")), Self.body("hello"), .end(nil),
            ]) == ["HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"]
        )
    }

    @Test("a head with a field that would break it sends nothing, fails its writes and closes")
    func refusedHead() throws {
        let connection = try Self.connect()
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        let headWritten = connection.channel.eventLoop.makePromise(of: Void.self)
        let bodyWritten = connection.channel.eventLoop.makePromise(of: Void.self)
        connection.channel.write(
            Self.head(.ok, ("Content-Length", "4"), ("X-Echo", "a\r\nContent-Length: 0\r\n\r\nHTTP/1.1 200 OK")), promise: headWritten
        )
        connection.channel.writeAndFlush(Self.body("evil"), promise: bodyWritten)
        #expect(try connection.written() == [])
        #expect(throws: ResponseHeadEncoding.Refusal.fieldValue(position: 1)) { try headWritten.futureResult.wait() }
        #expect(throws: (any Error).self) { try bodyWritten.futureResult.wait() }
        #expect(!connection.channel.isActive)
        #expect(throws: ResponseHeadEncoding.Refusal.fieldValue(position: 1)) { try connection.channel.throwIfErrorCaught() }
    }

    @Test("every write's promise completes, in order, when its bytes went out joined")
    func promisesOfJoinedWrites() throws {
        let connection = try Self.connect()
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        let order = NIOLoopBoundBox([String](), eventLoop: connection.channel.eventLoop)
        let parts: [(String, HTTPServerResponsePart)] = [
            ("head", Self.head(.ok)), ("body", Self.body("a")), ("end", .end(nil)),
        ]
        for (name, part) in parts {
            let promise = connection.channel.eventLoop.makePromise(of: Void.self)
            promise.futureResult.whenSuccess { order.value.append(name) }
            connection.channel.write(part, promise: promise)
        }
        #expect(order.value.isEmpty)
        connection.channel.flush()
        #expect(order.value == ["head", "body", "end"])
        #expect(try connection.written() == ["HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n"])
    }

    static func entry(_ fields: [(String, String)], status: Int = 200, bodyLength: Int64 = 5) -> ResponseCache.Entry {
        let head = CacheEntryFormat.Head(
            method: "GET", url: "http://a.test/", variantKey: "", varyFields: [], status: status, headers: fields,
            requestTime: Date(), responseTime: Date(), bodyLength: bodyLength
        )
        return ResponseCache.Entry(head: head, bodyOffset: 0, bodyVerified: true)
    }

    @Test("a hit's head from the entry's encoded bytes is byte for byte what the encoder makes of the head as fields")
    func encodedHeadMatchesFields() throws {
        let entries = [
            Self.entry([
                ("Cache-Control", "max-age=600"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"), ("Connection", "x-hop"), ("X-Hop", "1"),
                ("Age", "7"), ("Content-Length", "99"), ("Content-Type", "text/plain; charset=\"utf-8\""), ("X-Tab", "a\tb"),
            ]),
            // Framing the encoder removes: a 204's length.
            Self.entry([("Cache-Control", "max-age=600"), ("Content-Length", "0")], status: 204, bodyLength: 0),
        ]
        for entry in entries {
            let open = try #require(entry.clientHead)
            for keepAlive in [true, false] {
                let answer = StoredAnswerFields(age: 12, requestID: "r-1", cacheStatus: CacheStatusField.hit, keepAlive: keepAlive)
                var fast = open
                #expect(answer.complete(&fast))
                let head = Interceptor.storedResponseHead(entry, clientHeaders: entry.clientHeaders, answer: answer, rewrite: nil)
                let connection = try Self.connect()
                try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
                let slow = try connection.respond([.head(head), .end(nil)])
                #expect([String(buffer: fast)] == slow)
                let text = String(buffer: fast)
                #expect(!text.contains("x-hop") && !text.contains("X-Hop") && !text.contains("Age: 7"))
                #expect(text.contains("Content-Length: 5\r\n") == (entry.head.status == 200))
                #expect(!text.contains("Content-Length: 0"))
                #expect(text.contains("Connection: close") == !keepAlive)
            }
        }
        // A body too large for a direct hit: no bytes kept for it.
        #expect(Self.entry([("Cache-Control", "max-age=600")], bodyLength: Int64(ResponseCache.memoryEntryLimit) + 1).clientHead == nil)
    }

    @Test("a stored field that cannot be sent leaves the entry without encoded head bytes")
    func unsendableStoredField() {
        #expect(Self.entry([("Cache-Control", "max-age=600"), ("X-Bad", "a\u{1}b")]).clientHead == nil)
        #expect(Self.entry([("Cache-Control", "max-age=600")]).clientHead != nil)
        let answer = StoredAnswerFields(age: 1, requestID: "r\r\nSet-Cookie: a=1", cacheStatus: CacheStatusField.hit, keepAlive: true)
        var head = ByteBuffer(string: "HTTP/1.1 200 OK\r\n")
        #expect(!answer.complete(&head))
        #expect(String(buffer: head) == "HTTP/1.1 200 OK\r\n")
    }

    @Test("an encoded response answers its request in order, like any other response")
    func encodedResponseAnswersItsRequest() throws {
        let connection = try Self.connect()
        try connection.request("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\nHEAD http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        connection.channel.pipeline.triggerUserOutboundEvent(
            ResponseEncoder.EncodedResponse(bytes: ByteBuffer(string: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")), promise: nil
        )
        // The HEAD's response: its body is dropped, so the GET's answer took the GET's place.
        let written = try connection.respond([Self.head(.ok, ("Content-Length", "5")), Self.body("hello"), .end(nil)])
        #expect(written == ["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"])
    }

    @Test("writes that put nothing on the wire complete in order too: a HEAD's body, an empty chunk")
    func promisesOfDroppedParts() throws {
        let connection = try Self.connect()
        try connection.request("HEAD http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\nGET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n")
        let order = NIOLoopBoundBox([String](), eventLoop: connection.channel.eventLoop)
        let parts: [(String, HTTPServerResponsePart)] = [
            ("head", Self.head(.ok, ("Content-Length", "1"))), ("dropped", Self.body("a")), ("end", .end(nil)),
            ("head2", Self.head(.ok)), ("empty", Self.body("")), ("end2", .end(nil)),
        ]
        for (name, part) in parts {
            let promise = connection.channel.eventLoop.makePromise(of: Void.self)
            promise.futureResult.whenSuccess { order.value.append(name) }
            connection.channel.write(part, promise: promise)
        }
        connection.channel.flush()
        #expect(order.value == ["head", "dropped", "end", "head2", "empty", "end2"])
    }
}
