import AuthBrokerCore
import NIOCore
import NIOHTTP1

// Just in front of each HTTP encoder (which runs with `automaticallySetFramingHeaders` off):
// every outbound message's framing is decided here, by `OutboundBodyFraming`, the one place for
// both directions. SwiftNIO's own framing sets `Transfer-Encoding: chunked` alone, so a
// `gzip, chunked` body would reach its receiver still gzip-coded but no longer saying so. When
// codings precede `chunked`, the framer writes the chunk framing itself (the encoder then passes
// the bytes as they are); otherwise the encoder frames as usual.
//
// Two concrete handlers rather than one generic one: a generic handler's parts are looked up
// by their generic type on every call, which cost the relay more than the framing itself.

/// The client connection's responses: 1xx, 204 and 304 carry no framing, nor does any response
/// to CONNECT (the encoder sends no body with one); any other response without a length is
/// chunked (the encoder suppresses a HEAD response's body). Each response's end is reported to
/// the connection's `ClientTimeoutHandler`.
final class ResponseFramer: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = HTTPServerResponsePart

    private let methods: RequestFramingCheck
    private let timeouts: ClientTimeoutHandler
    private var chunking = SelfChunking()

    init(methods: RequestFramingCheck, timeouts: ClientTimeoutHandler) {
        self.methods = methods
        self.timeouts = timeouts
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let part = self.unwrapOutboundIn(data)
        guard case .head(let head) = part else {
            if case .end = part { self.timeouts.responseEnded() }
            self.chunking.write(part, data: data, context: context, promise: promise, wrap: self.wrapOutboundOut)
            return
        }
        let isFinal = head.status.code >= 200 || head.status == .switchingProtocols
        let method = isFinal ? self.methods.answered() : nil
        let mayHaveBody = head.status.mayHaveResponseBody && method != .CONNECT
        guard let headers = self.chunking.frame(head.headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: true) else {
            context.write(data, promise: promise)
            return
        }
        var prepared = head
        prepared.headers = headers
        context.write(self.wrapOutboundOut(.head(prepared)), promise: promise)
    }
}

/// An upstream connection's requests: a request without framing fields has no body (RFC 9112
/// §6.3 rule 7); `Interceptor.upstreamHead` sets them for every body.
final class RequestFramer: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    private var chunking = SelfChunking()

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let part = self.unwrapOutboundIn(data)
        guard case .head(let head) = part else {
            self.chunking.write(part, data: data, context: context, promise: promise, wrap: self.wrapOutboundOut)
            return
        }
        guard let headers = self.chunking.frame(head.headers, mayHaveBody: true, bodyWithoutFraming: false) else {
            context.write(data, promise: promise)
            return
        }
        var prepared = head
        prepared.headers = headers
        context.write(self.wrapOutboundOut(.head(prepared)), promise: promise)
    }
}

/// A framer's state: whether it writes the current message's chunk framing itself (`active`:
/// codings precede `chunked`).
private struct SelfChunking {
    var active = false

    /// Decides a head's framing: nil when its fields go as they are (the usual head, which a
    /// rewrite would copy), else the fields to send.
    mutating func frame(_ headers: HTTPHeaders, mayHaveBody: Bool, bodyWithoutFraming: Bool) -> HTTPHeaders? {
        if let framing = OutboundBodyFraming.unchanged(headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming) {
            self.active = framing == .chunkedAfterCodings
            return nil
        }
        var prepared = headers
        self.active =
            OutboundBodyFraming.prepare(&prepared, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming) == .chunkedAfterCodings
        return prepared
    }

    /// Writes a body part or the end, framed when active and passed on as it is otherwise.
    mutating func write<Head>(
        _ part: HTTPPart<Head, IOData>, data: NIOAny, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?,
        wrap: (HTTPPart<Head, IOData>) -> NIOAny
    ) {
        guard self.active else {
            context.write(data, promise: promise)
            return
        }
        switch part {
        case .head:
            context.write(data, promise: promise)
        case .body(let body):
            guard body.readableBytes > 0 else {
                // An empty chunk would end the body.
                promise?.succeed()
                return
            }
            var sizeLine = context.channel.allocator.buffer(capacity: 18)
            sizeLine.writeString(String(body.readableBytes, radix: 16))
            sizeLine.writeStaticString("\r\n")
            context.write(wrap(.body(.byteBuffer(sizeLine))), promise: nil)
            context.write(wrap(.body(body)), promise: nil)
            context.write(wrap(.body(.byteBuffer(ByteBuffer(staticString: "\r\n")))), promise: promise)
        case .end:
            // The last chunk; the broker forwards no trailers.
            self.active = false
            context.write(wrap(.body(.byteBuffer(ByteBuffer(staticString: "0\r\n\r\n")))), promise: nil)
            context.write(wrap(.end(nil)), promise: promise)
        }
    }
}
