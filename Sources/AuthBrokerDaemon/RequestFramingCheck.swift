import AuthBrokerCore
import NIOCore
import NIOHTTP1

/// Right after the client connection's HTTP decoder: every request head's body framing is
/// decided here once (RFC 9112 §6.3), so nothing later reads `Transfer-Encoding` or
/// `Content-Length` as text.
///
/// A head whose body length cannot be known (a `Transfer-Encoding` that does not end in a single
/// `chunked`, a `Content-Length` that is not one number) is the client's error: it goes on as an
/// inbound error, which the connection answers with 400 `malformed_request` and a close; nothing
/// of that request, or any after it, is passed on. A head that passes has its framing fields
/// in one canonical form (`Content-Length` without whitespace, `Transfer-Encoding` as its
/// lower-cased list), since the decoder passes whitespace around values through.
final class RequestFramingCheck: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    private var refused = false

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !self.refused else { return }
        guard case .head(var head) = self.unwrapInboundIn(data) else {
            context.fireChannelRead(data)
            return
        }
        do {
            switch try RequestBodyFraming.of(head.headers) {
            case .chunked:
                let codings = ((try? TransferCodings(head.headers)) ?? nil)?.names ?? ["chunked"]
                head.headers.replaceOrAdd(name: "Transfer-Encoding", value: codings.joined(separator: ", "))
            case .length, .none:
                if let length = try RequestBodyFraming.contentLength(head.headers),
                    head.headers.first(name: "content-length") != String(length)
                {
                    head.headers.replaceOrAdd(name: "Content-Length", value: String(length))
                }
            }
        } catch {
            self.refused = true
            context.fireErrorCaught(error)
            return
        }
        Self.trimConnectionOptions(&head.headers)
        context.fireChannelRead(self.wrapInboundOut(.head(head)))
    }

    /// `Connection: close<TAB>` is `close` (RFC 9110 §5.5): the decoder's keep-alive verdict
    /// misses a token with a tab beside it, so such a field is rewritten with its tokens trimmed
    /// (which also makes `isKeepAlive` read the field again).
    static func trimConnectionOptions(_ headers: inout HTTPHeaders) {
        let isOWS = { (byte: UInt8) in byte == 0x20 || byte == 0x09 }
        let padded = headers.contains { name, value in
            ProxyHeaders.fieldName(name, is: "connection") && (value.utf8.first.map(isOWS) == true || value.utf8.last.map(isOWS) == true || value.utf8.contains(0x09))
        }
        guard padded else { return }
        let tokens = headers["connection"].flatMap { $0.split(separator: ",") }
            .map { String(decoding: $0.utf8.drop(while: isOWS).reversed().drop(while: isOWS).reversed(), as: UTF8.self) }
            .filter { !$0.isEmpty }
        headers.replaceOrAdd(name: "Connection", value: tokens.joined(separator: ", "))
    }
}
