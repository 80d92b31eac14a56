import AuthBrokerCore
import NIOCore
import NIOHTTP1

// Every outbound message's framing is decided by `OutboundBodyFraming`, the one place for both
// directions. SwiftNIO's own framing sets `Transfer-Encoding: chunked` alone, so a
// `gzip, chunked` body would reach its receiver still gzip-coded but no longer saying so.
//
// Responses to clients are encoded here, by `ResponseEncoder`, in place of SwiftNIO's encoder
// and header validator (three handlers a response passed, each with its own copy of the head).
// Requests to origins still go through SwiftNIO's encoder, with its framing off and
// `RequestFramer` in front: when codings precede `chunked`, the framer writes the chunk framing
// itself (the encoder frames only a field that is exactly `chunked`).

/// The client connection's response encoder. It frames each response: 1xx, 204 and 304 carry no
/// framing, nor does any response to CONNECT; any other response without a length is chunked,
/// and a chunked body is chunk-framed here. A response to HEAD or CONNECT goes without a body.
/// It writes the head through `ResponseHeadEncoding`, which refuses a field that would break
/// the head: then nothing of the response goes out and the connection closes. A small body goes
/// out in one buffer with its head or its chunk framing, so a small response is one buffer.
/// Each response's end is reported to the connection's `ClientTimeoutHandler`.
final class ResponseEncoder: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPServerResponsePart
    typealias OutboundOut = IOData

    /// Body parts up to this size are copied next to their head or chunk framing rather than
    /// written as buffers of their own.
    static let joinedBodyLimit = 4096

    private enum Body {
        /// Written as it comes (a length).
        case asIs
        /// Chunk-framed here.
        case chunked
        /// Dropped: a response to HEAD or CONNECT, or a status that has no body.
        case none
        /// The head was refused: nothing more of this connection's responses goes out.
        case refused
    }

    private let methods: RequestFramingCheck
    private let timeouts: ClientTimeoutHandler
    private var body = Body.asIs
    /// Bytes encoded but not yet written (a head, or chunk framing), for a small body part or the
    /// end to join; written at the latest at the response's end or the next flush.
    private var pending: ByteBuffer?
    /// The promise the pending bytes' write completes: the first joined write's, which passes its
    /// result on to the next one's (`lastJoinedPromise` is the end of that chain), so they
    /// complete in the order of their writes.
    private var pendingPromise: EventLoopPromise<Void>?
    private var lastJoinedPromise: EventLoopPromise<Void>?

    init(methods: RequestFramingCheck, timeouts: ClientTimeoutHandler) {
        self.methods = methods
        self.timeouts = timeouts
    }

    /// A whole response encoded before it reached this handler (a cache hit: its entry's head
    /// with the answer's fields, and its body, framed by a length or bodiless), sent as an
    /// outbound user event so it passes through here in order with every other write and
    /// answers its request like any response. The sender flushes.
    struct EncodedResponse {
        var bytes: ByteBuffer
    }

    /// A response's framing fields as clients get them: a response without a length that may
    /// have a body is chunked. Also for heads encoded ahead (`ResponseCache.Entry.clientHead`).
    static func frame(_ headers: inout HTTPHeaders, mayHaveBody: Bool) -> OutboundBodyFraming {
        OutboundBodyFraming.apply(to: &headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: true)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard let encoded = event as? EncodedResponse else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        guard self.body != .refused else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        self.writePending(context: context)
        _ = self.methods.answered()
        self.timeouts.responseEnded()
        self.body = .asIs
        context.write(self.wrapOutboundOut(.byteBuffer(encoded.bytes)), promise: promise)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch self.unwrapOutboundIn(data) {
        case .head(let head):
            self.writeHead(head, context: context, promise: promise)
        case .body(let part):
            self.writeBody(part, context: context, promise: promise)
        case .end:
            self.timeouts.responseEnded()
            self.writeEnd(context: context, promise: promise)
        }
    }

    func flush(context: ChannelHandlerContext) {
        self.writePending(context: context)
        context.flush()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.writePending(context: context)
    }

    private func writeHead(_ head: HTTPResponseHead, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        guard self.body != .refused else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        self.writePending(context: context)  // a 1xx head before this one
        let isFinal = head.status.code >= 200 || head.status == .switchingProtocols
        let request = isFinal ? self.methods.answered() : nil
        let method = request?.method
        let mayHaveBody = head.status.mayHaveResponseBody && method != .CONNECT
        var headers = head.headers
        let framing = Self.frame(&headers, mayHaveBody: mayHaveBody)
        var chunks = framing == .chunked || framing == .chunkedAfterCodings
        if chunks, request?.fromHTTP10 == true {
            // RFC 9112 §6.1: no Transfer-Encoding to an HTTP/1.0 client, which would read the chunk
            // framing as the body: the body goes as it is, ended by the connection's close (such a
            // client's connection is never kept).
            headers.remove(name: "transfer-encoding")
            chunks = false
        }
        if isFinal {
            if !mayHaveBody || method == .HEAD {
                self.body = .none
            } else {
                self.body = chunks ? .chunked : .asIs
            }
        }
        // Room for the usual head and a small body after it; a larger head grows it once.
        var buffer = context.channel.allocator.buffer(capacity: 1024)
        do {
            try ResponseHeadEncoding.write(version: head.version, status: head.status, headers: headers, to: &buffer)
        } catch {
            self.body = .refused
            promise?.fail(error)
            context.fireErrorCaught(error)
            context.close(promise: nil)
            return
        }
        self.pending = buffer
        self.join(promise)
    }

    private func writeBody(_ part: IOData, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        switch self.body {
        case .none:
            self.completeInOrder(promise, context: context)
        case .refused:
            promise?.fail(ChannelError.ioOnClosedChannel)
        case .asIs:
            if case .byteBuffer(var bytes) = part, bytes.readableBytes <= Self.joinedBodyLimit, self.pending != nil {
                self.pending!.writeBuffer(&bytes)  // Force unwrap: checked non-nil just above, in the same turn.
                self.join(promise)
                return
            }
            self.writePending(context: context)
            context.write(self.wrapOutboundOut(part), promise: promise)
        case .chunked:
            let size = part.readableBytes
            guard size > 0 else {
                // An empty chunk would end the body.
                self.completeInOrder(promise, context: context)
                return
            }
            var framed = self.pending ?? context.channel.allocator.buffer(capacity: size <= Self.joinedBodyLimit ? size + 24 : 24)
            self.pending = nil
            framed.writeString(String(size, radix: 16))
            framed.writeStaticString("\r\n")
            if case .byteBuffer(var bytes) = part, size <= Self.joinedBodyLimit {
                framed.writeBuffer(&bytes)
                framed.writeStaticString("\r\n")
                self.pending = framed
                self.join(promise)
                return
            }
            self.pending = framed
            self.writePending(context: context)
            context.write(self.wrapOutboundOut(part), promise: nil)
            self.pending = ByteBuffer(staticString: "\r\n")
            self.join(promise)
        }
    }

    private func writeEnd(context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        let body = self.body
        if body != .refused { self.body = .asIs }
        switch body {
        case .refused:
            promise?.fail(ChannelError.ioOnClosedChannel)
        case .chunked:
            // The last chunk; the broker forwards no trailers.
            if self.pending == nil { self.pending = context.channel.allocator.buffer(capacity: 5) }
            self.pending!.writeStaticString("0\r\n\r\n")  // Force unwrap: set just above when it was nil.
            self.join(promise)
            self.writePending(context: context)
        case .asIs, .none:
            if self.pending != nil {
                self.join(promise)
                self.writePending(context: context)
            } else {
                self.completeInOrder(promise, context: context)
            }
        }
    }

    /// For a write that puts nothing on the wire (a dropped body part, an empty chunk, an end
    /// without chunking): its promise completes in order with the writes before it.
    private func completeInOrder(_ promise: EventLoopPromise<Void>?, context: ChannelHandlerContext) {
        guard let promise else { return }
        if self.pending != nil {
            self.join(promise)
        } else {
            context.write(self.wrapOutboundOut(.byteBuffer(ByteBuffer())), promise: promise)
        }
    }

    /// Makes `promise` complete with the pending bytes' write, after those joined before it.
    private func join(_ promise: EventLoopPromise<Void>?) {
        guard let promise else { return }
        if let last = self.lastJoinedPromise {
            last.futureResult.cascade(to: promise)
        } else {
            self.pendingPromise = promise
        }
        self.lastJoinedPromise = promise
    }

    private func writePending(context: ChannelHandlerContext) {
        guard let pending = self.pending else { return }
        let promise = self.pendingPromise
        self.pending = nil
        self.pendingPromise = nil
        self.lastJoinedPromise = nil
        context.write(self.wrapOutboundOut(.byteBuffer(pending)), promise: promise)
    }
}

/// An upstream connection's requests: a request without framing fields has no body (RFC 9112
/// §6.3 rule 7); `Interceptor.upstreamHead` sets them for every body. When codings precede
/// `chunked`, it writes the body's chunk framing itself (NIO's encoder frames only a field that
/// is exactly `chunked`).
final class RequestFramer: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = HTTPClientRequestPart
    typealias OutboundOut = HTTPClientRequestPart

    /// The current request's body is chunk-framed here (codings precede `chunked`).
    private var chunking = false

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let part = self.unwrapOutboundIn(data)
        switch part {
        case .head(let head):
            if let framing = OutboundBodyFraming.unchanged(head.headers, mayHaveBody: true, bodyWithoutFraming: false) {
                self.chunking = framing == .chunkedAfterCodings
                context.write(data, promise: promise)
                return
            }
            var prepared = head
            self.chunking =
                OutboundBodyFraming.prepare(&prepared.headers, mayHaveBody: true, bodyWithoutFraming: false) == .chunkedAfterCodings
            context.write(self.wrapOutboundOut(.head(prepared)), promise: promise)
        case .body(let body) where self.chunking:
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
        case .end where self.chunking:
            // The last chunk; the broker forwards no trailers.
            self.chunking = false
            context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(staticString: "0\r\n\r\n")))), promise: nil)
            context.write(self.wrapOutboundOut(.end(nil)), promise: promise)
        case .body, .end:
            context.write(data, promise: promise)
        }
    }
}
