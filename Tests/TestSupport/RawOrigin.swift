import NIOCore
import NIOPosix
import NIOConcurrencyHelpers

/// An origin that answers with exactly the bytes a test gives it, for framing tests: plain TCP on
/// 127.0.0.1, port 0. It records every byte each connection sent, so a test can check what the
/// daemon forwarded (or that it aborted the exchange).
///
/// `respond` is asked after every read with all the bytes the connection has sent so far; it
/// returns nil to wait for more, or the reply. A connection gets one reply; later bytes are only
/// recorded. With `everyRequest`, a connection gets a reply per request: after each reply,
/// `respond` is given only the bytes that came since (requests are not pipelined).
package final class RawOrigin: Sendable {
    package struct Reply: Sendable {
        package var bytes: [UInt8]
        /// Close the connection (FIN) once the reply is written.
        package var close: Bool
        /// How long to wait before replying (a slow origin).
        package var delay: TimeAmount?

        package init(_ bytes: [UInt8], close: Bool = false, delay: TimeAmount? = nil) {
            self.bytes = bytes
            self.close = close
            self.delay = delay
        }

        package init(_ text: String, close: Bool = false, delay: TimeAmount? = nil) {
            self.init(Array(text.utf8), close: close, delay: delay)
        }
    }

    package let port: Int
    private let channel: any Channel
    private let record: Record

    private init(port: Int, channel: any Channel, record: Record) {
        self.port = port
        self.channel = channel
        self.record = record
    }

    /// Answers `reply` once a connection has sent a whole request head (up to the blank line).
    package static func start(replyAfterHead reply: Reply) async throws -> RawOrigin {
        try await self.start { received in Self.headEnd(in: received) == nil ? nil : reply }
    }

    /// Never answers: records what arrives.
    package static func startSilent() async throws -> RawOrigin {
        try await self.start { _ in nil }
    }

    package static func start(everyRequest: Bool = false, respond: @escaping @Sendable ([UInt8]) -> Reply?) async throws -> RawOrigin {
        let record = Record()
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.allowRemoteHalfClosure, value: true)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let index = record.connections.withLockedValue { connections in
                        connections.append(Connection(received: [], open: true))
                        return connections.count - 1
                    }
                    try channel.pipeline.syncOperations.addHandler(
                        RawReplyHandler(index: index, record: record, everyRequest: everyRequest, respond: respond)
                    )
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = channel.localAddress?.port else { throw TestSupportError("raw origin has no port") }
        return RawOrigin(port: port, channel: channel, record: record)
    }

    /// What each connection sent so far, in the order they were accepted.
    package var received: [[UInt8]] { self.record.connections.withLockedValue { $0.map(\.received) } }

    /// What all connections sent, as text (for `contains` checks).
    package var receivedText: String { String(decoding: self.received.joined(), as: UTF8.self) }

    /// Connections open now.
    package var openConnections: Int { self.record.connections.withLockedValue { $0.filter(\.open).count } }

    /// Connections accepted so far.
    package var acceptedConnections: Int { self.record.connections.withLockedValue { $0.count } }

    /// Waits (up to `seconds`) until no connection is open; returns whether none is.
    package func waitUntilNoConnectionIsOpen(seconds: Int = 10) async -> Bool {
        await waitUntil(seconds: seconds) { self.openConnections == 0 }
    }

    package func stop() async {
        try? await self.channel.close()
    }

    /// The index of the blank line ending a head (`\r\n\r\n`), if there is one.
    package static func headEnd(in bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        return (0...(bytes.count - 4)).first { bytes[$0] == 13 && bytes[$0 + 1] == 10 && bytes[$0 + 2] == 13 && bytes[$0 + 3] == 10 }
    }

    fileprivate struct Connection: Sendable {
        var received: [UInt8]
        var open: Bool
    }

    fileprivate final class Record: Sendable {
        let connections = NIOLockedValueBox<[Connection]>([])
    }
}

private final class RawReplyHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let index: Int
    private let record: RawOrigin.Record
    private let respond: @Sendable ([UInt8]) -> RawOrigin.Reply?
    private let everyRequest: Bool
    private var replied = false
    /// What the connection sent since its last reply (`everyRequest`).
    private var pending: [UInt8] = []

    init(index: Int, record: RawOrigin.Record, everyRequest: Bool, respond: @escaping @Sendable ([UInt8]) -> RawOrigin.Reply?) {
        self.index = index
        self.record = record
        self.everyRequest = everyRequest
        self.respond = respond
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = self.unwrapInboundIn(data)
        let received = self.record.connections.withLockedValue { connections in
            connections[self.index].received += buffer.readableBytesView
            return connections[self.index].received
        }
        self.pending += buffer.readableBytesView
        guard !self.replied, let reply = self.respond(self.everyRequest ? self.pending : received) else { return }
        self.replied = !self.everyRequest
        self.pending = []
        let channel = context.channel
        let write: @Sendable () -> Void = {
            let written = channel.writeAndFlush(ByteBuffer(bytes: reply.bytes))
            if reply.close { written.whenComplete { _ in channel.close(promise: nil) } }
        }
        if let delay = reply.delay {
            channel.eventLoop.scheduleTask(in: delay) { write() }
        } else {
            write()
        }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        // The peer half-closed: close our side too, as a server does at the end of its input.
        if let event = event as? ChannelEvent, case .inputClosed = event {
            context.close(promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.record.connections.withLockedValue { $0[self.index].open = false }
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}
