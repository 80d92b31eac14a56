import AuthBrokerCore
import NIOCore
import NIOHTTP1
import NIOSSL

/// A client's `CONNECT host:port` for a host the broker has something to add to (see
/// `InterceptPolicy`): `200`, then the client's TLS is ended here with a leaf the local CA
/// minted for the host, and the requests inside go through the whole broker like any other:
/// its trust decision, client identities, answered challenges, the audit log.
///
/// The connection keeps its task and its handlers after the decoder (the timeouts, the direct
/// relay, the async channel): only the byte-level HTTP handlers are replaced, by the same kinds
/// behind a TLS server handler, and origin-form targets are made absolute for the CONNECT's
/// origin (`InterceptedTarget`), so the serve loop reads the inner requests as it read the
/// CONNECT.
enum ClientInterception {
    /// Rebuilds the pipeline of `channel` (on its event loop) for TLS to `origin` under `tls`.
    /// Bytes the client sent after the CONNECT (a ClientHello sent early) go into the TLS handler.
    static func start(
        _ channel: any Channel, origin: CanonicalOrigin, tls: NIOSSLContext, maxHeadBytes: Int
    ) -> EventLoopFuture<Void> {
        channel.eventLoop.flatSubmit {
            let kept = KeptBytes()
            let decoderGone = channel.eventLoop.makePromise(of: Void.self)
            do {
                try Self.takeApart(channel, keepingIn: kept, decoderGone: decoderGone)
            } catch {
                decoderGone.fail(error)
            }
            // The decoder hands over what it kept on a later turn of the loop, not as it is
            // removed: the new handlers go in only once it has.
            let keptOnLoop = NIOLoopBound(kept, eventLoop: channel.eventLoop)
            return decoderGone.futureResult.flatMapThrowing {
                try Self.putTogether(channel, origin: origin, tls: tls, maxHeadBytes: maxHeadBytes, kept: keptOnLoop.value)
            }
        }
    }

    /// Takes out the HTTP handlers that sit on bytes; the decoder's kept bytes go to `kept`.
    private static func takeApart(_ channel: any Channel, keepingIn kept: KeptBytes, decoderGone: EventLoopPromise<Void>) throws {
        let pipeline = channel.pipeline.syncOperations
        let decoder = try pipeline.handler(type: ByteToMessageHandler<HTTPRequestDecoder>.self)
        try pipeline.addHandler(kept, position: .after(decoder))
        pipeline.removeHandler(try pipeline.handler(type: HeadNormalizer.self), promise: nil)
        pipeline.removeHandler(try pipeline.handler(type: RequestFramingCheck.self), promise: nil)
        pipeline.removeHandler(try pipeline.handler(type: ResponseEncoder.self), promise: nil)
        pipeline.removeHandler(decoder, promise: decoderGone)
    }

    /// The 200 in the clear, then the same kinds of HTTP handlers behind a TLS server handler,
    /// then the kept bytes into it.
    private static func putTogether(
        _ channel: any Channel, origin: CanonicalOrigin, tls: NIOSSLContext, maxHeadBytes: Int, kept: KeptBytes
    ) throws {
        let pipeline = channel.pipeline.syncOperations
        let observer = try pipeline.context(handlerType: ClientBytesObserver.self)
        // Written from the front of the pipeline, before TLS is in the way.
        var established = channel.allocator.buffer(capacity: 40)
        established.writeString("HTTP/1.1 200 Connection established\r\n\r\n")
        observer.writeAndFlush(NIOAny(established), promise: nil)
        // The 200 went around `ResponseEncoder`, which reports every other response's end: told
        // here, the connection waits for its first request inside TLS under the idle and head
        // timeouts like any other (without it, no timer ever ran on an intercepted connection).
        let timeouts = try pipeline.handler(type: ClientTimeoutHandler.self)
        timeouts.responseEnded()
        let normalizer = HeadNormalizer(.requests, maxHeadBytes: maxHeadBytes)
        let framing = RequestFramingCheck(normalizer: normalizer, interceptedOrigin: origin)
        let handlers: [any ChannelHandler] = [
            NIOSSLServerHandler(context: tls), normalizer, ByteToMessageHandler(HTTPRequestDecoder(leftOverBytesStrategy: .dropBytes, limitConfiguration: .requestHeads(upTo: maxHeadBytes))),
            framing, ResponseEncoder(methods: framing, timeouts: timeouts),
        ]
        var previous: any ChannelHandler = observer.handler
        for handler in handlers {
            try pipeline.addHandler(handler, position: .after(previous))
            previous = handler
        }
        pipeline.removeHandler(kept, promise: nil)
        if let early = kept.bytes, early.readableBytes > 0 {
            observer.fireChannelRead(NIOAny(early))
        }
    }
}

/// Holds the bytes a departing decoder forwards, so they can enter the pipeline again in front.
private final class KeptBytes: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    var bytes: ByteBuffer?

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        var buffer = self.unwrapInboundIn(data)
        if self.bytes == nil {
            self.bytes = buffer
        } else {
            self.bytes?.writeBuffer(&buffer)
        }
    }
}

/// Inside an intercepted connection: a request's target is made absolute for the CONNECT's
/// origin (by the connection's `RequestFramingCheck`, which every head passes anyway). A target
/// naming another origin (or another CONNECT, `*`, a control path in absolute form) is refused:
/// what the client asked to reach is the origin it connected to.
enum InterceptedTarget {
    /// The absolute-form target for `uri` sent inside a connection to `origin`.
    static func absolute(_ uri: String, method: HTTPMethod, origin: CanonicalOrigin) -> Result<String, InterceptedTargetRefused> {
        if uri.hasPrefix("/"), method != .CONNECT {
            return .success(origin.description + uri)
        }
        if case .success(.absolute(let named, _)) = RequestTarget.parse(method: method.rawValue, uri: uri), named == origin {
            return .success(uri)
        }
        return .failure(InterceptedTargetRefused(origin: origin, uri: uri))
    }
}

/// A request inside an intercepted connection aimed somewhere else.
struct InterceptedTargetRefused: Error, CustomStringConvertible {
    var origin: CanonicalOrigin
    var uri: String

    var description: String {
        let shown = self.uri.prefix(80)
        return "inside the TLS connection to \(self.origin.authorityForm), a request must be for that origin (origin-form, like GET /path); \(shown) is not"
    }
}
