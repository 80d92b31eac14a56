import AuthBrokerCore
import NIOCore
import NIOHTTP1

/// What the request whose lease makes a connection brings to it: who asked (for the audit log
/// and agents), how long it may wait for an agent, and the client's own `Proxy-Authorization`.
///
/// A task-local because the pool makes connections on behalf of whichever request's lease
/// needed one (its connect task inherits the leasing task's values); a connection made for one
/// request may later carry another of the same user's requests.
package enum UpstreamConnectContext {
    package struct Value: Sendable {
        package var requester: Requester?
        package var agentWait: Duration?
        /// Sent on the CONNECT that opens a tunnel, instead of a stored credential.
        package var clientProxyAuthorization: String?

        package init(requester: Requester?, agentWait: Duration?, clientProxyAuthorization: String?) {
            self.requester = requester
            self.agentWait = agentWait
            self.clientProxyAuthorization = clientProxyAuthorization
        }
    }

    @TaskLocal package static var current: Value?
}

/// Sends nothing itself: reads the proxy's answer to the CONNECT the connector wrote, and
/// completes `promise` with its head once the response ended (the body of a refusal is read and
/// dropped, up to a bound). Removed, with the HTTP codec, before TLS starts in the tunnel.
final class ProxyConnectHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart

    /// Bytes of a refusal's body read at most; a longer one closes the connection.
    static let maxRefusalBodyBytes = 65_536

    private let promise: EventLoopPromise<HTTPResponseHead>
    private var head: HTTPResponseHead?
    private var bodyBytes = 0

    init(promise: EventLoopPromise<HTTPResponseHead>) {
        self.promise = promise
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head(let head) where head.status.code < 200:
            break  // 1xx before the answer (RFC 9110 §15.2)
        case .head(let head):
            self.head = head
        case .body(let buffer):
            self.bodyBytes += buffer.readableBytes
            if self.bodyBytes > Self.maxRefusalBodyBytes {
                self.promise.fail(ProxyTunnelError.responseTooLarge)
                context.close(promise: nil)
            }
        case .end:
            if let head = self.head {
                self.promise.succeed(head)
            } else {
                self.promise.fail(ProxyTunnelError.closed)
            }
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.promise.fail(ProxyTunnelError.protocolError(SendableErrorBox(String(describing: error))))
        context.close(promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.promise.fail(ProxyTunnelError.closed)
        context.fireChannelInactive()
    }
}

/// Why a CONNECT got no usable answer from the proxy.
enum ProxyTunnelError: Error, Sendable {
    case closed
    case responseTooLarge
    case protocolError(SendableErrorBox)
}
