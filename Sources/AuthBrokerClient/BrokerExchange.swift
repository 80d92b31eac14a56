import AuthBrokerCore
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// One request on a connection of its own to the daemon.
///
/// A task owns the connection (`NIOAsyncChannel.executeThenClose`): it sends the request
/// (the body from a child task, so an early answer is heard at once), and hands the response
/// parts to the app through a `ResponseRelay`. `cancel()` (the app's task was cancelled, or
/// the response was dropped unread) closes the connection, which makes the daemon drop the
/// upstream request.
final class BrokerExchange: Sendable {
    let relay: ResponseRelay
    private let channel: any Channel
    private let task: Task<Void, Never>

    private init(relay: ResponseRelay, channel: any Channel, task: Task<Void, Never>) {
        self.relay = relay
        self.channel = channel
        self.task = task
    }

    deinit {
        // Nobody can read the rest any more: stop the transfer (a no-op after the end).
        self.cancel()
    }

    func cancel() {
        relay.cancel()
        task.cancel()
        channel.close(promise: nil)
    }

    /// Connects and starts the exchange; the response parts arrive through `relay`.
    static func start(
        socketPath: String, group: any EventLoopGroup, head: HTTPRequestHead, body: BrokerRequestBody.Storage
    ) async throws -> BrokerExchange {
        let asyncChannel = try await connect(socketPath: socketPath, group: group)
        let relay = ResponseRelay()
        let rawChannel = asyncChannel.channel
        let task = Task {
            do {
                try await asyncChannel.executeThenClose { inbound, outbound in
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask {
                            do {
                                try await send(head, body: body, to: outbound)
                            } catch {
                                // Wake the reader: no response will come for a request never finished.
                                rawChannel.close(promise: nil)
                                throw error
                            }
                        }
                        var sawEnd = false
                        var readError: (any Error)?
                        var inInterim = false
                        do {
                            for try await part in inbound {
                                switch part {
                                case .head(let interim) where (100..<200).contains(interim.status.code) && interim.status.code != 101:
                                    inInterim = true  // 1xx (RFC 9110 §15.2): the real response follows
                                    continue
                                case .end where inInterim:
                                    inInterim = false
                                    continue
                                default:
                                    break
                                }
                                try await relay.yield(part)
                                if case .end = part {
                                    sawEnd = true
                                    break
                                }
                            }
                        } catch {
                            readError = error
                        }
                        group.cancelAll()
                        var sendError: (any Error)?
                        while let outcome = await group.nextResult() {
                            if case .failure(let error) = outcome, !(error is CancellationError) { sendError = error }
                        }
                        if !sawEnd {
                            let read = readError.map(classifyReadError)
                            // An answer that is not HTTP says more than the write it made fail
                            // (the decoder's error closes the connection under the request).
                            if let protocolError = read as? BrokerClientError, case .protocolError = protocolError { throw protocolError }
                            throw sendError.map(classifyReadError) ?? read ?? BrokerClientError.connectionClosed
                        }
                    }
                }
                relay.finish()
            } catch {
                relay.finish(error: error)
            }
        }
        return BrokerExchange(relay: relay, channel: rawChannel, task: task)
    }

    /// The next part, closing the connection if the calling task is cancelled meanwhile.
    func next() async throws -> HTTPClientResponsePart? {
        try await withTaskCancellationHandler {
            try await relay.next()
        } onCancel: {
            self.cancel()
        }
    }

    // MARK: Connection

    /// Connects, then checks who listens before a byte is sent: a socket another user planted
    /// where the daemon's should be must not receive a password.
    private static func connect(
        socketPath: String, group: any EventLoopGroup
    ) async throws -> NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart> {
        let channel = try await connectSocket(socketPath: socketPath, group: group)
        do {
            try await channel.channel.verifyListenerIsOwnUser(socketPath: socketPath)
        } catch {
            // Closed through the async channel, which must be finished before it goes away.
            try? await channel.executeThenClose { _, _ in }
            throw BrokerClientError.foreignListener(socketPath: socketPath, listenerUID: error.listenerUID)
        }
        return channel
    }

    private static func connectSocket(
        socketPath: String, group: any EventLoopGroup
    ) async throws -> NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart> {
        do {
            return try await ClientBootstrap(group: group)
                .connect(unixDomainSocketPath: socketPath) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        // A head as large as the daemon may pass on (`max_response_head_bytes` up
                        // to 1 MiB, plus the fields it adds), not SwiftNIO's own 80 KiB.
                        try channel.pipeline.syncOperations.addHTTPClientHandlers(
                            decoderLimitConfiguration: .heads(upTo: 1_048_576 + 65_536)
                        )
                        return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(
                            wrappingChannelSynchronously: channel
                        )
                    }
                }
        } catch {
            throw classifyConnectError(error, socketPath: socketPath)
        }
    }

    /// Maps the errno of a failed `connect(2)` to what it means for the user.
    static func classifyConnectError(_ error: any Error, socketPath: String) -> any Error {
        if let error = error as? SocketAddressError, case .unixDomainSocketPathTooLong = error {
            return BrokerClientError.unusableSocket(
                socketPath: socketPath, reason: "the path is longer than a Unix socket address allows (108 bytes)"
            )
        }
        let errno: CInt? =
            (error as? IOError)?.errnoCode
            ?? (error as? NIOConnectionError)?.connectionErrors.compactMap { ($0.error as? IOError)?.errnoCode }.first
        switch errno {
        case ENOENT, ECONNREFUSED, ENOTDIR:
            return BrokerClientError.daemonNotRunning(socketPath: socketPath)
        case EACCES, EPERM:
            return BrokerClientError.permissionDenied(socketPath: socketPath)
        case let code?:
            return BrokerClientError.unusableSocket(socketPath: socketPath, reason: String(cString: strerror(code)))
        case nil:
            if error is CancellationError { return error }
            return BrokerClientError.unusableSocket(socketPath: socketPath, reason: String(describing: error))
        }
    }

    static func classifyReadError(_ error: any Error) -> any Error {
        switch error {
        case let error as HTTPParserError where error == .invalidEOFState:
            // The connection closed inside a body: a truncated response, not a malformed one.
            return BrokerClientError.connectionClosed
        case let error as HTTPParserError:
            return BrokerClientError.protocolError(reason: "\(error)")
        case let error as ChannelError where error == .ioOnClosedChannel || error == .eof || error == .alreadyClosed:
            return BrokerClientError.connectionClosed
        case let error as IOError where error.errnoCode == ECONNRESET || error.errnoCode == EPIPE:
            return BrokerClientError.connectionClosed
        default:
            return error
        }
    }

    // MARK: Request

    /// Size of each chunk written from an in-memory body.
    static let writeChunkBytes = 64 * 1024

    private static func send(
        _ head: HTTPRequestHead, body: BrokerRequestBody.Storage, to outbound: NIOAsyncChannelOutboundWriter<HTTPClientRequestPart>
    ) async throws {
        try await outbound.write(.head(head))
        switch body {
        case .empty:
            break
        case .bytes(let bytes):
            var offset = 0
            while offset < bytes.count {
                let end = min(offset + writeChunkBytes, bytes.count)
                try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: bytes[offset..<end]))))
                offset = end
            }
        case .stream(let source, let length):
            let next = source.makeNext()
            var sent = 0
            while let chunk = try await next() {
                try Task.checkCancellation()
                if chunk.isEmpty { continue }  // an empty chunk would end a chunked body early
                sent += chunk.count
                if let length, sent > length {
                    throw BrokerClientError.invalidRequest(reason: "the body stream gave more than its declared \(length) bytes")
                }
                try await outbound.write(.body(.byteBuffer(ByteBuffer(bytes: chunk))))
            }
            if let length, sent != length {
                throw BrokerClientError.invalidRequest(reason: "the body stream gave \(sent) bytes, not its declared \(length)")
            }
        }
        try await outbound.write(.end(nil))
    }
}
