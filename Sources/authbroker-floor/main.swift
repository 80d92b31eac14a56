// BENCHMARK REFERENCE, not a product: the least a SwiftNIO forward proxy can do for a plain
// keep-alive request, to tell how much of authbrokerd's cost per request is the stack itself.
//
// Client connections arrive on a Unix socket with absolute-form `http://` targets (as the broker
// gets them); each client connection gets one upstream connection, opened on its own event loop,
// and every part is forwarded by channel handlers with no tasks, no async sequences, no
// authentication, no trust, no pool and no log line. It is not a usable proxy: no backpressure,
// no error answers, one origin given on the command line.
//
//   authbroker-floor SOCKET_PATH ORIGIN_HOST ORIGIN_PORT
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Forwards one client connection's requests to its own upstream connection.
final class ClientSide: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let originHost: String
    private let originPort: Int
    private var upstream: (any Channel)?
    private var queued: [HTTPClientRequestPart] = []
    private var connecting = false

    init(originHost: String, originPort: Int) {
        self.originHost = originHost
        self.originPort = originPort
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part: HTTPClientRequestPart
        switch self.unwrapInboundIn(data) {
        case .head(var head):
            // Absolute form to origin form: drop "http://host:port" (the third slash starts the path).
            var slashes = 0
            if let pathStart = head.uri.utf8.firstIndex(where: { byte in
                if byte == UInt8(ascii: "/") { slashes += 1 }
                return slashes == 3
            }) {
                head.uri = String(head.uri[pathStart...])
            }
            part = .head(head)
        case .body(let buffer):
            part = .body(.byteBuffer(buffer))
        case .end(let trailers):
            part = .end(trailers)
        }
        if let upstream {
            upstream.write(part, promise: nil)
        } else {
            self.queued.append(part)
            self.connect(context: context)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.upstream?.flush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.upstream?.close(promise: nil)
        context.fireChannelInactive()
    }

    private func connect(context: ChannelHandlerContext) {
        guard !self.connecting else { return }
        self.connecting = true
        let client = NIOLoopBound(context.channel, eventLoop: context.eventLoop)
        let me = NIOLoopBound(self, eventLoop: context.eventLoop)
        ClientBootstrap(group: context.eventLoop)
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(UpstreamSide(client: client.value))
                }
            }
            .connect(host: self.originHost, port: self.originPort)
            .whenComplete { result in
                switch result {
                case .success(let channel):
                    let side = me.value
                    side.upstream = channel
                    for part in side.queued { channel.write(part, promise: nil) }
                    side.queued = []
                    channel.flush()
                case .failure:
                    client.value.close(promise: nil)
                }
            }
    }
}

/// Forwards the origin's response parts to the client connection, one flush per read.
final class UpstreamSide: ChannelInboundHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let client: any Channel

    init(client: any Channel) {
        self.client = client
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part: HTTPServerResponsePart
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            part = .head(HTTPResponseHead(version: head.version, status: head.status, headers: head.headers))
        case .body(let buffer):
            part = .body(.byteBuffer(buffer))
        case .end(let trailers):
            part = .end(trailers)
        }
        self.client.write(part, promise: nil)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.client.flush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.client.close(promise: nil)
        context.fireChannelInactive()
    }
}

let arguments = CommandLine.arguments
guard arguments.count == 4, let originPort = Int(arguments[3]) else {
    print("usage: authbroker-floor SOCKET_PATH ORIGIN_HOST ORIGIN_PORT")
    exit(64)
}
let socketPath = arguments[1]
let originHost = arguments[2]
unlink(socketPath)
let group = MultiThreadedEventLoopGroup(numberOfThreads: System.coreCount)
let server = try ServerBootstrap(group: group)
    .serverChannelOption(.backlog, value: 1024)
    .childChannelInitializer { channel in
        channel.eventLoop.makeCompletedFuture {
            try channel.pipeline.syncOperations.configureHTTPServerPipeline(withPipeliningAssistance: false)
            try channel.pipeline.syncOperations.addHandler(ClientSide(originHost: originHost, originPort: originPort))
        }
    }
    .bind(unixDomainSocketPath: socketPath)
    .wait()
print("listening on \(socketPath)")
try server.closeFuture.wait()
