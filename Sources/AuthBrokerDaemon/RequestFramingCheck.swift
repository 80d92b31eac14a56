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
/// of that request, or any after it, is passed on. It also tells the connection's
/// `HeadNormalizer` where each request ends, and keeps the methods of the requests not yet
/// answered, for `ResponseEncoder`; and inside an intercepted connection it makes each target
/// absolute (`InterceptedTarget`). One handler for these: each handler a part passes costs on
/// every request.
final class RequestFramingCheck: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias InboundOut = HTTPServerRequestPart

    private let normalizer: HeadNormalizer
    /// The CONNECT's origin, inside an intercepted connection.
    private let interceptedOrigin: CanonicalOrigin?
    private var refused = false
    /// The requests not yet answered, oldest first.
    private var pending: [PendingRequest] = []
    /// The request in hand asked to switch protocols: the connection's last.
    private var lastRequest = false

    init(normalizer: HeadNormalizer, interceptedOrigin: CanonicalOrigin? = nil) {
        self.normalizer = normalizer
        self.interceptedOrigin = interceptedOrigin
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !self.refused else { return }
        switch self.unwrapInboundIn(data) {
        case .head(var head):
            self.normalizer.headDecoded()
            var changed = false
            if let origin = self.interceptedOrigin {
                switch InterceptedTarget.absolute(head.uri, method: head.method, origin: origin) {
                case .success(let uri):
                    head.uri = uri
                    changed = true
                case .failure(let refusal):
                    self.refused = true
                    context.fireErrorCaught(refusal)
                    return
                }
            }
            let framing: RequestBodyFraming
            do {
                framing = try RequestBodyFraming.of(head.headers)
            } catch {
                self.refused = true
                context.fireErrorCaught(error)
                return
            }
            self.pending.append(PendingRequest(method: head.method, fromHTTP10: (head.version.major, head.version.minor) < (1, 1)))
            // `Upgrade` with `Connection: upgrade` makes SwiftNIO's decoder stop parsing after
            // this request, whatever follows: the broker switches no protocols (RFC 9110 §7.8
            // lets it ignore the offer), so the request is answered as any other and is the
            // connection's last, instead of leaving the connection open and deaf.
            if head.method != .CONNECT, Self.asksToUpgrade(head.headers) {
                // Added, not replacing: the fields the client's `Connection` names stay named, so
                // they are still removed before the request goes upstream (RFC 9110 §7.6.1).
                head.headers.add(name: "Connection", value: "close")
                self.lastRequest = true
                changed = true
            }
            // A length with whitespace around it (a pipelined head the normalizer passed
            // unexamined) goes on as the number alone, so later readers can take it as it is.
            if case .length(let length) = framing, let value = head.headers.first(name: "content-length"),
                !value.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") })
            {
                head.headers.replaceOrAdd(name: "Content-Length", value: String(length))
                changed = true
            }
            context.fireChannelRead(changed ? self.wrapInboundOut(.head(head)) : data)
        case .end:
            // After CONNECT come the tunnel's bytes, never another head. (A pattern: HTTPMethod's
            // `==` compares names as strings, on every request's end here.)
            if case .CONNECT? = self.pending.last?.method {
                self.normalizer.tunnelFollows()
            } else if self.lastRequest {
                self.normalizer.lastRequestEnded()
            } else {
                self.normalizer.messageEnded()
            }
            context.fireChannelRead(data)
        case .body:
            context.fireChannelRead(data)
        }
    }

    /// Whether a head offers to switch protocols the way llhttp acts on: an `Upgrade` field and
    /// `upgrade` among the `Connection` options (llhttp reads `Proxy-Connection` as `Connection`).
    static func asksToUpgrade(_ headers: HTTPHeaders) -> Bool {
        headers.contains(name: "upgrade")
            && (headers[canonicalForm: "connection"] + headers[canonicalForm: "proxy-connection"]).contains { $0.lowercased() == "upgrade" }
    }

    /// A request as its response is framed for it.
    struct PendingRequest {
        var method: HTTPMethod
        /// An HTTP/1.0 client, which reads no Transfer-Encoding (RFC 9112 §6.1).
        var fromHTTP10: Bool
    }

    /// The oldest request not yet answered, now answered; nil when there is none (the broker's
    /// answer to a head it could not read).
    func answered() -> PendingRequest? {
        self.pending.isEmpty ? nil : self.pending.removeFirst()
    }
}
