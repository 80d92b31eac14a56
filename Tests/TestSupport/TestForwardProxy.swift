import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOConcurrencyHelpers

/// What a `TestForwardProxy` has seen.
package struct TestProxyStats: Sendable, Hashable {
    /// CONNECT requests (each opens at most one tunnel).
    package var connects = 0
    /// Tunnels opened.
    package var tunnels = 0
    /// Absolute-form requests forwarded to their origin.
    package var forwarded = 0
    /// 407s sent.
    package var proxyAuthenticationRequired = 0
    /// Requests that carried a `Proxy-Authorization` the proxy refused.
    package var refused = 0
}

/// The stats behind a lock, shared by every connection of one proxy.
private final class ProxyCounters: Sendable {
    private let stats = NIOLockedValueBox(TestProxyStats())
    func withLock<T: Sendable>(_ body: (inout TestProxyStats) -> T) -> T { self.stats.withLockedValue { body(&$0) } }
}

/// An HTTP forward proxy for integration tests, on 127.0.0.1 at port 0: absolute-form requests
/// are forwarded (one connection per request), CONNECT opens a byte tunnel. Every target is
/// reached at 127.0.0.1 on the target's port, whatever its host name.
///
/// With `auth`, every request must carry a `Proxy-Authorization` the proxy verifies exactly as
/// `TestAuthOrigin` verifies `Authorization` (Basic, or Digest with nonces, `nc` and opaque, the
/// Digest `uri` being the request-target: absolute-form, or `host:port` for CONNECT).
package final class TestForwardProxy: Sendable {
    package let port: Int
    private let channel: any Channel
    private let core: AuthOriginCore
    private let counters: ProxyCounters

    private init(port: Int, channel: any Channel, core: AuthOriginCore, counters: ProxyCounters) {
        self.port = port
        self.channel = channel
        self.core = core
        self.counters = counters
    }

    package static func start(auth: TestProxyAuth = .none, user: String = "", password: String = "") async throws -> TestForwardProxy {
        let core = AuthOriginCore(name: "proxy", user: user, password: password, behaviour: TestAuthBehaviour())
        let counters = ProxyCounters()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let sync = channel.pipeline.syncOperations
                    try sync.addHandler(HTTPResponseEncoder(), name: "encoder")
                    try sync.addHandler(ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .forwardBytes)), name: "decoder")
                    try sync.addHandler(ForwardProxyHandler(auth: auth, core: core, counters: counters), name: "proxy")
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = channel.localAddress?.port else {
            try? await channel.close()
            throw TestSupportError("forward proxy has no port")
        }
        return TestForwardProxy(port: port, channel: channel, core: core, counters: counters)
    }

    package var stats: TestProxyStats { self.counters.withLock { $0 } }
    /// The proxy user's password changes: the one stored in the broker is wrong from now on.
    package func changePassword(_ password: String) { self.core.changePassword(password) }
    /// The proxy's authentication counters (as `TestAuthOrigin.stats`).
    package var authStats: TestAuthStats { self.core.stats }

    package func stop() async {
        try? await self.channel.close()
    }
}

private final class ForwardProxyHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let auth: TestProxyAuth
    private let core: AuthOriginCore
    private let counters: ProxyCounters
    private var head: HTTPRequestHead?
    private var body = ByteBuffer()

    init(auth: TestProxyAuth, core: AuthOriginCore, counters: ProxyCounters) {
        self.auth = auth
        self.core = core
        self.counters = counters
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            self.body.clear()
        case .body(var buffer):
            self.body.writeBuffer(&buffer)
        case .end:
            guard let head = self.head else { return }
            self.head = nil
            self.handle(head, context: context)
        }
    }

    private func handle(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        if head.method == .CONNECT { self.counters.withLock { $0.connects += 1 } }
        let given = head.headers["proxy-authorization"]
        if let challenge = self.core.proxyChallenge(self.auth, method: head.method.rawValue, target: head.uri, proxyAuthorization: given) {
            self.counters.withLock { stats in
                stats.proxyAuthenticationRequired += 1
                if !given.isEmpty { stats.refused += 1 }
            }
            self.reply(context: context, status: .proxyAuthenticationRequired, headers: challenge, body: "proxy authentication required", keepAlive: head.isKeepAlive)
            return
        }
        if head.method == .CONNECT {
            self.openTunnel(head, context: context)
        } else {
            self.forward(head, context: context)
        }
    }

    private func reply(context: ChannelHandlerContext, status: HTTPResponseStatus, headers extra: [(String, String)] = [], body: String, keepAlive: Bool) {
        var headers = HTTPHeaders(extra)
        headers.add(name: "content-length", value: String(body.utf8.count))
        if !keepAlive { headers.add(name: "connection", value: "close") }
        context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))), promise: nil)
        context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: body)))), promise: nil)
        let channel = context.channel
        context.writeAndFlush(self.wrapOutboundOut(.end(nil))).whenComplete { _ in
            if !keepAlive { channel.close(promise: nil) }
        }
    }

    private static func port(ofAuthority authority: Substring) -> Int? {
        guard let colon = authority.lastIndex(of: ":") else { return nil }
        return Int(authority[authority.index(after: colon)...])
    }

    private func openTunnel(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        guard let port = Self.port(ofAuthority: Substring(head.uri)) else {
            self.reply(context: context, status: .badRequest, body: "bad CONNECT target", keepAlive: false)
            return
        }
        let (local, remote) = GlueHandler.matchedPair()
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        // The tunnel's far side lives on this event loop too, so the glue is single-threaded.
        let remoteBound = NIOLoopBound(remote, eventLoop: context.eventLoop)
        ClientBootstrap(group: context.eventLoop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(remoteBound.value) }
            }
            .connect(host: "127.0.0.1", port: port)
            .assumeIsolated()
            .whenComplete { result in
                let (handler, context) = loopBound.value
                guard case .success = result else {
                    handler.reply(context: context, status: .badGateway, body: "cannot reach \(head.uri)", keepAlive: false)
                    return
                }
                handler.counters.withLock { $0.tunnels += 1 }
                let sync = context.pipeline.syncOperations
                do {
                    // Written raw: NIO's encoder would frame a 200 without a length as chunked,
                    // and a 2xx to CONNECT has no body at all (RFC 9110 §9.3.6).
                    sync.removeHandler(name: "encoder", promise: nil)
                    context.writeAndFlush(NIOAny(ByteBuffer(string: "HTTP/1.1 200 Connection established\r\n\r\n")), promise: nil)
                    try sync.addHandler(local)
                    sync.removeHandler(name: "decoder", promise: nil)
                    sync.removeHandler(handler, promise: nil)
                } catch {
                    context.close(promise: nil)
                }
            }
    }

    private func forward(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        guard let url = URLComponents(string: head.uri), url.scheme == "http" else {
            self.reply(context: context, status: .badRequest, body: "not an absolute-form http target: \(head.uri)", keepAlive: false)
            return
        }
        let port = url.port ?? 80
        var upstreamHead = head
        upstreamHead.uri = (url.percentEncodedPath.isEmpty ? "/" : url.percentEncodedPath) + (url.percentEncodedQuery.map { "?" + $0 } ?? "")
        upstreamHead.headers.remove(name: "proxy-authorization")
        upstreamHead.headers.remove(name: "proxy-connection")
        upstreamHead.headers.replaceOrAdd(name: "connection", value: "close")
        let upstream = upstreamHead
        let body = self.body
        let promise = context.eventLoop.makePromise(of: (HTTPResponseHead, ByteBuffer).self)
        let keepAlive = head.isKeepAlive
        ClientBootstrap(group: context.eventLoop)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(ResponseCollector(promise: promise))
                }
            }
            .connect(host: "127.0.0.1", port: port)
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    channel.write(HTTPClientRequestPart.head(upstream), promise: nil)
                    if body.readableBytes > 0 { channel.write(HTTPClientRequestPart.body(.byteBuffer(body)), promise: nil) }
                    channel.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
                case .failure(let error):
                    promise.fail(error)
                }
            }
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        promise.futureResult.assumeIsolated().whenComplete { result in
            let (handler, context) = loopBound.value
            switch result {
            case .success(let (responseHead, responseBody)):
                handler.counters.withLock { $0.forwarded += 1 }
                var headers = responseHead.headers
                headers.remove(name: "transfer-encoding")
                headers.remove(name: "connection")
                headers.replaceOrAdd(name: "content-length", value: String(responseBody.readableBytes))
                if !keepAlive { headers.add(name: "connection", value: "close") }
                context.write(handler.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: responseHead.status, headers: headers))), promise: nil)
                context.write(handler.wrapOutboundOut(.body(.byteBuffer(responseBody))), promise: nil)
                let channel = context.channel
                context.writeAndFlush(handler.wrapOutboundOut(.end(nil))).whenComplete { _ in
                    if !keepAlive { channel.close(promise: nil) }
                }
            case .failure:
                handler.reply(context: context, status: .badGateway, body: "cannot reach \(head.uri)", keepAlive: false)
            }
        }
    }
}

/// Collects one whole response from an origin.
private final class ResponseCollector: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart
    private let promise: EventLoopPromise<(HTTPResponseHead, ByteBuffer)>
    private var head: HTTPResponseHead?
    private var body = ByteBuffer()

    init(promise: EventLoopPromise<(HTTPResponseHead, ByteBuffer)>) {
        self.promise = promise
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head(let head) where head.status.code >= 200: self.head = head
        case .head: break
        case .body(var buffer): self.body.writeBuffer(&buffer)
        case .end:
            if let head = self.head { self.promise.succeed((head, self.body)) }
            context.close(promise: nil)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.promise.fail(TestSupportError("the origin closed before its response ended"))
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.promise.fail(error)
        context.close(promise: nil)
    }
}

/// Joins two channels on one event loop byte for byte (a CONNECT tunnel), as swift-nio's
/// connect-proxy example does; closing one side closes the other.
private final class GlueHandler: ChannelDuplexHandler {
    typealias InboundIn = NIOAny
    typealias OutboundIn = NIOAny
    typealias OutboundOut = NIOAny

    private var partner: GlueHandler?
    private var context: ChannelHandlerContext?

    static func matchedPair() -> (GlueHandler, GlueHandler) {
        let first = GlueHandler()
        let second = GlueHandler()
        first.partner = second
        second.partner = first
        return (first, second)
    }

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.partner = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.partner?.context?.write(data, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.partner?.context?.flush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.partner?.context?.close(promise: nil)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
