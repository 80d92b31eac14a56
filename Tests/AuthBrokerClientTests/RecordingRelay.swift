import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A Unix-socket relay in front of the daemon that records every byte the client sends, so a
/// test can see what reached the daemon (headers the daemon consumes and never forwards).
final class RecordingRelay: Sendable {
    let socketPath: String
    private let server: any Channel
    private let recorded: NIOLockedValueBox<[UInt8]>

    private init(socketPath: String, server: any Channel, recorded: NIOLockedValueBox<[UInt8]>) {
        self.socketPath = socketPath
        self.server = server
        self.recorded = recorded
    }

    /// What clients sent, as text.
    var text: String { String(decoding: recorded.withLockedValue { $0 }, as: UTF8.self) }

    static func start(at socketPath: String, forwardingTo daemonSocket: String) async throws -> RecordingRelay {
        let recorded = NIOLockedValueBox<[UInt8]>([])
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group)
            .childChannelInitializer { inbound in
                ClientBootstrap(group: inbound.eventLoop)
                    .channelInitializer { outbound in
                        outbound.pipeline.addHandler(Glue(peer: inbound, record: nil))
                    }
                    .connect(unixDomainSocketPath: daemonSocket)
                    .flatMap { outbound in
                        inbound.pipeline.addHandler(Glue(peer: outbound, record: recorded))
                    }
            }
            .bind(unixDomainSocketPath: socketPath).get()
        return RecordingRelay(socketPath: socketPath, server: server, recorded: recorded)
    }

    func stop() async {
        try? await server.close()
    }

    /// Copies bytes to the peer channel (recording them when asked) and closes it on close.
    private final class Glue: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let peer: any Channel
        let record: NIOLockedValueBox<[UInt8]>?

        init(peer: any Channel, record: NIOLockedValueBox<[UInt8]>?) {
            self.peer = peer
            self.record = record
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let buffer = Self.unwrapInboundIn(data)
            record?.withLockedValue { $0.append(contentsOf: buffer.readableBytesView) }
            peer.writeAndFlush(buffer, promise: nil)
        }

        func channelInactive(context: ChannelHandlerContext) {
            peer.close(promise: nil)
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
