import AuthBrokerCore
import NIOCore
import NIOHTTP1

/// Just in front of an HTTP encoder (which runs with `automaticallySetFramingHeaders` off):
/// every outbound message's framing is decided here, by `OutboundBodyFraming.prepare`, the one
/// place for both directions.
///
/// SwiftNIO's own framing sets `Transfer-Encoding: chunked` alone, so a `gzip, chunked` body
/// would reach its receiver still gzip-coded but no longer saying so. When codings precede
/// `chunked`, this handler writes the chunk framing itself (the encoder then passes the bytes
/// as they are); otherwise the encoder frames as usual.
final class OutboundFramer<Head: Equatable & Sendable>: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPPart<Head, IOData>
    typealias OutboundOut = HTTPPart<Head, IOData>

    private let prepare: (inout Head) -> OutboundBodyFraming
    /// The current message's chunk framing is this handler's to write.
    private var framesChunks = false

    private init(prepare: @escaping (inout Head) -> OutboundBodyFraming) {
        self.prepare = prepare
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch self.unwrapOutboundIn(data) {
        case .head(var head):
            self.framesChunks = self.prepare(&head) == .chunkedAfterCodings
            context.write(self.wrapOutboundOut(.head(head)), promise: promise)
        case .body(let body) where self.framesChunks:
            guard body.readableBytes > 0 else {
                // An empty chunk would end the body.
                promise?.succeed()
                return
            }
            var sizeLine = context.channel.allocator.buffer(capacity: 18)
            sizeLine.writeString(String(body.readableBytes, radix: 16))
            sizeLine.writeStaticString("\r\n")
            context.write(self.wrapOutboundOut(.body(.byteBuffer(sizeLine))), promise: nil)
            context.write(self.wrapOutboundOut(.body(body)), promise: nil)
            context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(staticString: "\r\n")))), promise: promise)
        case .end where self.framesChunks:
            // The last chunk; the broker forwards no trailers.
            self.framesChunks = false
            context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(staticString: "0\r\n\r\n")))), promise: nil)
            context.write(self.wrapOutboundOut(.end(nil)), promise: promise)
        case .body, .end:
            context.write(data, promise: promise)
        }
    }
}

extension OutboundFramer where Head == HTTPResponseHead {
    /// For a client connection's responses: 1xx, 204 and 304 carry no framing, nor does any
    /// response to CONNECT (the encoder sends no body with one); any other response without a
    /// length is chunked (the encoder suppresses a HEAD response's body).
    static func responses(to methods: RequestMethodObserver) -> OutboundFramer<HTTPResponseHead> {
        OutboundFramer { head in
            let isFinal = head.status.code >= 200 || head.status == .switchingProtocols
            let method = isFinal ? methods.answered() : nil
            return OutboundBodyFraming.prepare(
                &head.headers, mayHaveBody: head.status.mayHaveResponseBody && method != .CONNECT, bodyWithoutFraming: true
            )
        }
    }
}

/// Behind a client connection's decoder: the methods of the requests read and not yet answered,
/// in order, for `OutboundFramer.responses` (the encoder's own queue is not public).
final class RequestMethodObserver: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    private var methods: [HTTPMethod] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if case .head(let head) = self.unwrapInboundIn(data) { self.methods.append(head.method) }
        context.fireChannelRead(data)
    }

    /// The method of the oldest request not yet answered, now answered; nil when there is none
    /// (the broker's answer to a head it could not read).
    func answered() -> HTTPMethod? {
        self.methods.isEmpty ? nil : self.methods.removeFirst()
    }
}

extension OutboundFramer where Head == HTTPRequestHead {
    /// For an upstream connection's requests: a request without framing fields has no body
    /// (RFC 9112 §6.3 rule 7); `Interceptor.upstreamHead` sets them for every body.
    static func requests() -> OutboundFramer<HTTPRequestHead> {
        OutboundFramer { head in
            OutboundBodyFraming.prepare(&head.headers, mayHaveBody: true, bodyWithoutFraming: false)
        }
    }
}
