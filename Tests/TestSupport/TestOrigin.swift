import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// An origin server for integration tests: HTTP or HTTPS on 127.0.0.1 (or ::1), port 0.
///
/// Routes (all under any host name):
/// - `/hello`: 200 `hello from <name>`
/// - `/echo`: 200, the request body streamed back (same framing as received)
/// - `/bytes/<n>`: 200, n bytes of a repeating pattern, streamed in 64 KiB chunks (content-length)
/// - `/chunked/<n>`: as `/bytes` but chunked
/// - `/headers`: 200, the request head as JSON (method, uri, headers)
/// - `/redirect`: 302 to `/hello`
/// - `/status/<code>`: that status, empty body
/// - `/slow-head/<ms>`: waits before answering
/// - `/close-after-head`: sends a head with content-length 100, 10 bytes, then closes
/// - `/expect`: honours `Expect: 100-continue`, then echoes the body length
/// - `/offer-challenges[/bearer]`: 401 offering Negotiate, Digest, Basic and NTLM (or only Bearer)
/// - `/negotiate-impostor/<token>`: asks for Negotiate, then claims success with a forged token
/// - `/negotiate-once/<id>/...[?basic]`: takes the first Negotiate token for <id>, refuses the rest
package final class TestOrigin: Sendable {
    package let port: Int
    package let name: String
    private let channel: any Channel
    private let accepted: NIOLockedValueBox<Int>

    private init(port: Int, name: String, channel: any Channel, accepted: NIOLockedValueBox<Int>) {
        self.port = port
        self.name = name
        self.channel = channel
        self.accepted = accepted
    }

    /// Connections accepted so far (a client that reuses its connection makes one).
    package var acceptedConnections: Int { self.accepted.withLockedValue { $0 } }

    /// Starts a server; with `identity`, it speaks TLS with that certificate (and `chain` after it).
    /// With `clientCA`, it requires a client certificate issued by that CA (mTLS), or with
    /// `clientCertificateOptional` takes one if offered (`/client-cert` says which).
    package static func start(
        name: String, identity: TestIdentity? = nil, chain: [TestIdentity] = [], host: String = "127.0.0.1",
        clientCA: TestIdentity? = nil, clientCertificateOptional: Bool = false, unixSocketPath: String? = nil
    ) async throws -> TestOrigin {
        var sslContext: NIOSSLContext?
        if let identity {
            let certificates = try ([identity] + chain).map { NIOSSLCertificateSource.certificate(try $0.nioCertificate()) }
            var configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: certificates, privateKey: .privateKey(try identity.nioPrivateKey())
            )
            if let clientCA {
                configuration.certificateVerification = clientCertificateOptional ? .optionalVerification : .noHostnameVerification
                configuration.trustRoots = .certificates([try clientCA.nioCertificate()])
            }
            sslContext = try NIOSSLContext(configuration: configuration)
        }
        let context = sslContext
        let accepted = NIOLockedValueBox(0)
        let bootstrap = ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                accepted.withLockedValue { $0 += 1 }
                return channel.eventLoop.makeCompletedFuture {
                    if let context {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: context))
                    }
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(OriginHandler(name: name))
                }
            }
        let channel = try await (unixSocketPath.map { bootstrap.bind(unixDomainSocketPath: $0) } ?? bootstrap.bind(host: host, port: 0)).get()
        // On a Unix socket (`unixSocketPath`) there is no port: 0.
        guard let port = unixSocketPath == nil ? channel.localAddress?.port : 0 else {
            throw TestSupportError("origin server has no port")
        }
        return TestOrigin(port: port, name: name, channel: channel, accepted: accepted)
    }

    package func stop() async {
        try? await self.channel.close()
    }
}

package struct TestSupportError: Error, CustomStringConvertible {
    package var description: String
    package init(_ description: String) { self.description = description }
}

/// Waits (up to `seconds`, checking every 50 ms) until `condition` holds; returns whether it does.
package func waitUntil(seconds: Int = 10, _ condition: () -> Bool) async -> Bool {
    for _ in 0..<(seconds * 20) {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return condition()
}

/// The deterministic byte pattern `/bytes/<n>` serves: byte i is `i % 251`.
package enum BytePattern {
    /// 64 KiB plus one period, so any chunk up to 64 KiB is one slice of it (debug builds
    /// are far too slow to write hundreds of MiB a byte at a time).
    private static let period: [UInt8] = (0..<(65536 + 251)).map { UInt8($0 % 251) }

    package static func chunk(offset: Int, count: Int) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.reserveCapacity(count)
        var written = 0
        while written < count {
            let start = (offset + written) % 251
            let length = min(count - written, 65536)
            buffer.writeBytes(Self.period[start..<(start + length)])
            written += length
        }
        return buffer
    }

    /// Whether `bytes` are the pattern's bytes from `offset` on (memcmp: fast in debug builds).
    package static func matches(_ bytes: ArraySlice<UInt8>, offset: Int) -> Bool {
        var checked = 0
        while checked < bytes.count {
            let start = (offset + checked) % 251
            let length = min(bytes.count - checked, 65536)
            let equal = bytes[(bytes.startIndex + checked)...].withUnsafeBytes { actual in
                Self.period[start..<(start + length)].withUnsafeBytes { expected in
                    memcmp(actual.baseAddress!, expected.baseAddress!, length) == 0  // both non-empty: length > 0
                }
            }
            if !equal { return false }
            checked += length
        }
        return true
    }
}

/// What `/negotiate-once/<id>` has seen, per id, across connections.
private let negotiateOnce = NIOLockedValueBox((accepted: Set<String>(), refusedUploads: [String: Int]()))

private final class OriginHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let name: String
    private var head: HTTPRequestHead?
    private var echoing = false
    private var receivedBytes = 0

    init(name: String) {
        self.name = name
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            self.receivedBytes = 0
            let path = head.uri.split(separator: "?").first.map(String.init) ?? head.uri
            if path == "/echo" {
                self.echoing = true
                var headers = HTTPHeaders()
                if let length = head.headers.first(name: "content-length") {
                    headers.add(name: "content-length", value: length)
                }
                context.writeAndFlush(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            } else if path == "/expect", head.headers["expect"].contains("100-continue") {
                context.writeAndFlush(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .continue))), promise: nil)
            }
        case .body(let buffer):
            self.receivedBytes += buffer.readableBytes
            if self.echoing {
                context.writeAndFlush(self.wrapOutboundOut(.body(.byteBuffer(buffer))), promise: nil)
            }
        case .end:
            guard let head = self.head else { return }
            if self.echoing {
                self.echoing = false
                context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
                return
            }
            self.respond(context: context, head: head)
        }
    }

    private func respond(context: ChannelHandlerContext, head: HTTPRequestHead) {
        let path = head.uri.split(separator: "?").first.map(String.init) ?? head.uri
        let parts = path.split(separator: "/").map(String.init)
        switch parts.first {
        case "hello":
            self.send(context: context, status: .ok, body: "hello from \(self.name)")
        case "client-cert":
            // Whether this connection's client presented a certificate (TLS origins only);
            // `?cacheable`: fresh for ten minutes, not `public`; `?stale`: stored, stale at once.
            let handler = try? context.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self)
            let freshness: [(String, String)] =
                head.uri.hasSuffix("?cacheable") ? [("cache-control", "max-age=600")]
                : head.uri.hasSuffix("?stale") ? [("cache-control", "max-age=0")] : []
            self.send(
                context: context, status: .ok, body: handler?.peerCertificate == nil ? "none" : "presented", extraHeaders: freshness
            )
        case "headers":
            var fields: [[String]] = []
            for (name, value) in head.headers { fields.append([name, value]) }
            let object: [String: Any] = ["method": head.method.rawValue, "uri": head.uri, "headers": fields]
            let data = (try? JSONSerialization.data(withJSONObject: object)) ?? Data()
            self.send(context: context, status: .ok, body: String(decoding: data, as: UTF8.self), contentType: "application/json")
        case "redirect":
            var headers = HTTPHeaders()
            headers.add(name: "location", value: "/hello")
            headers.add(name: "content-length", value: "0")
            context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .found, headers: headers))), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        case "status":
            let code = parts.count > 1 ? Int(parts[1]) ?? 500 : 500
            self.send(context: context, status: HTTPResponseStatus(statusCode: code), body: "")
        case "bytes", "chunked":
            let total = parts.count > 1 ? Int(parts[1]) ?? 0 : 0
            var headers = HTTPHeaders()
            if parts.first == "bytes" { headers.add(name: "content-length", value: String(total)) }
            context.writeAndFlush(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            self.stream(context: context, sent: 0, total: total)
        case "slow-head":
            let milliseconds = parts.count > 1 ? Int64(parts[1]) ?? 1000 : 1000
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: .milliseconds(milliseconds)) {
                let (handler, context) = bound.value
                handler.send(context: context, status: .ok, body: "slow")
            }
        case "close-after-head":
            var headers = HTTPHeaders()
            headers.add(name: "content-length", value: "100")
            context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            let channel = context.channel
            context.writeAndFlush(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "0123456789"))))).whenComplete { _ in
                channel.close(promise: nil)
            }
        case "expect":
            self.send(context: context, status: .ok, body: "received \(self.receivedBytes) bytes")
        case "negotiate-impostor":
            // A server that asks for Negotiate and, given any token, claims success with a
            // final token it could not have made without the service key (`/negotiate-impostor/
            // <base64>`; "-" for none).
            let token = parts.count > 1 ? parts[1] : "-"
            var headers = HTTPHeaders()
            let authorized = head.headers.first(name: "authorization")?.lowercased().hasPrefix("negotiate ") == true
            headers.add(name: "www-authenticate", value: authorized ? (token == "-" ? "Negotiate" : "Negotiate \(token)") : "Negotiate")
            let body = authorized ? "impostor says welcome" : ""
            headers.add(name: "content-length", value: String(body.utf8.count))
            context.write(
                self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: authorized ? .ok : .unauthorized, headers: headers))),
                promise: nil
            )
            context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        case "negotiate-once":
            // `/negotiate-once/<id>/...`: takes the first Negotiate token sent for <id> (200, no
            // final token) and refuses every later one with a bare 401 whose body counts the
            // refused requests with a body; Basic `alice:pw` is accepted throughout, offered
            // beside Negotiate when `?basic` is in the query.
            let id = parts.count > 1 ? parts[1] : "-"
            let authorization = head.headers.first(name: "authorization") ?? ""
            let offersBasic = head.uri.contains("?basic")
            if offersBasic, authorization == "Basic " + Data("alice:pw".utf8).base64EncodedString() {
                self.send(context: context, status: .ok, body: "basic ok")
                return
            }
            let first = authorization.lowercased().hasPrefix("negotiate ")
                && negotiateOnce.withLockedValue { seen in seen.accepted.insert(id).inserted }
            if first {
                self.send(context: context, status: .ok, body: "negotiate ok")
                return
            }
            let refused = negotiateOnce.withLockedValue { seen in
                if self.receivedBytes > 0 { seen.refusedUploads[id, default: 0] += 1 }
                return seen.refusedUploads[id, default: 0]
            }
            var headers = HTTPHeaders()
            headers.add(name: "www-authenticate", value: "Negotiate")
            if offersBasic { headers.add(name: "www-authenticate", value: "Basic realm=\"once\"") }
            let body = "refused uploads \(refused), this one \(self.receivedBytes) bytes"
            headers.add(name: "content-length", value: String(body.utf8.count))
            context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .unauthorized, headers: headers))), promise: nil)
            context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        case "offer-challenges":
            // A 401 offering what real servers mix: Negotiate and NTLM beside Digest and Basic,
            // or only Bearer; `/final-token`: a 200 carrying a final Negotiate token nobody asked
            // for beside a Basic challenge; `/407`: an origin's own 407, with Negotiate and Basic
            // in `WWW-Authenticate` and Basic in `Proxy-Authenticate`.
            let variant = parts.count > 1 ? parts[1] : ""
            let fields: [String] =
                switch variant {
                case "bearer": [#"Bearer realm="api", error="invalid_token""#]
                case "final-token": ["Negotiate b3JpZ2luLXRva2Vu", #"Basic realm="after""#]
                case "407": ["Negotiate", #"Basic realm="origin-407""#]
                default: [#"Negotiate, Digest realm="mixed@test", nonce="abc123", qop="auth", algorithm=SHA-256, Basic realm="mixed@test""#, "NTLM"]
                }
            var headers = HTTPHeaders()
            for field in fields { headers.add(name: "www-authenticate", value: field) }
            if variant == "407" { headers.add(name: "proxy-authenticate", value: #"Basic realm="origin-posing-as-proxy""#) }
            headers.add(name: "content-length", value: "0")
            let status: HTTPResponseStatus =
                switch variant {
                case "final-token": .ok
                case "407": .proxyAuthenticationRequired
                default: .unauthorized
                }
            context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
        default:
            self.send(context: context, status: .notFound, body: "no route \(path)")
        }
    }

    /// Streams `/bytes` with backpressure: the next chunk goes when the last one is written.
    private func stream(context: ChannelHandlerContext, sent: Int, total: Int) {
        guard sent < total else {
            context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
            return
        }
        let count = min(65536, total - sent)
        let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.writeAndFlush(self.wrapOutboundOut(.body(.byteBuffer(BytePattern.chunk(offset: sent, count: count))))).whenSuccess {
            let (handler, context) = bound.value
            handler.stream(context: context, sent: sent + count, total: total)
        }
    }

    private func send(
        context: ChannelHandlerContext, status: HTTPResponseStatus, body: String, contentType: String = "text/plain",
        extraHeaders: [(String, String)] = []
    ) {
        var headers = HTTPHeaders(extraHeaders)
        headers.add(name: "content-type", value: contentType)
        headers.add(name: "content-length", value: String(body.utf8.count))
        headers.add(name: "x-origin", value: self.name)
        context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil)
        context.writeAndFlush(self.wrapOutboundOut(.end(nil)), promise: nil)
    }
}
