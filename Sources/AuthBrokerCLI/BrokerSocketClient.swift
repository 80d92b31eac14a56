import AuthBrokerCore
import Foundation
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

/// Why talking to the daemon failed, before any HTTP answer could be read.
package enum BrokerClientError: Error, Sendable, Equatable {
    /// Nothing listens on the socket: it is missing, or the daemon behind it is gone.
    case daemonNotRunning(socket: String)
    /// The socket exists but this user may not connect to it.
    case permissionDenied(socket: String)
    /// The socket path cannot be used at all (too long, not a socket, ...).
    case unusableSocket(socket: String, reason: String)
    /// The daemon closed the connection before the response was complete.
    case connectionClosed(socket: String)
    /// The daemon's bytes were not a valid HTTP/1.1 response.
    case protocolError(reason: String)
    /// A control-API response was larger than the CLI accepts.
    case responseTooLarge(limit: Int)
    /// The request body could not be read or changed size while it was sent.
    case requestBody(reason: String)
    /// The process listening on the socket is not the user's own: nothing was sent.
    case foreignListener(ForeignListener)
}

/// The body of a request to the daemon.
package enum BrokerRequestBody: Sendable {
    case none
    case bytes(ByteBuffer)
    /// Streamed from an open file descriptor in chunks (the caller closes it). With a length,
    /// exactly that many bytes are sent (the caller sets `Content-Length`); without, until EOF
    /// (the caller sets `Transfer-Encoding: chunked`).
    case file(descriptor: CInt, length: Int64?)
}

/// The rest of a response after its head: body chunks as they arrive, with backpressure.
///
/// Reading pulls from `NIOAsyncChannel`'s inbound stream, whose high/low watermarks stop the
/// socket being read while the consumer is slow; so a body of any size passes in bounded memory.
package struct BrokerResponseBody {
    private var iterator: NIOAsyncChannelInboundStream<HTTPClientResponsePart>.AsyncIterator
    private let socket: String
    /// True once the end of the response has been read.
    package private(set) var isComplete = false

    init(iterator: NIOAsyncChannelInboundStream<HTTPClientResponsePart>.AsyncIterator, socket: String) {
        self.iterator = iterator
        self.socket = socket
    }

    /// The next chunk of the body, or nil at its end.
    package mutating func next() async throws -> ByteBuffer? {
        guard !isComplete else { return nil }
        switch try await BrokerSocketClient.nextPart(&iterator, socket: socket) {
        case .body(let chunk): return chunk
        case .end: isComplete = true; return nil
        case .head: throw BrokerClientError.protocolError(reason: "a second response head arrived inside a body")
        }
    }

    /// Up to `limit` bytes of the body; `complete` is false when more remains (call `next()` for it).
    package mutating func collect(upTo limit: Int) async throws -> (buffer: ByteBuffer, complete: Bool) {
        var buffer = ByteBuffer()
        while buffer.readableBytes < limit {
            guard var chunk = try await next() else { return (buffer, true) }
            buffer.writeBuffer(&chunk)
        }
        return (buffer, false)
    }
}

/// A buffered control-API response (the control API's bodies are small JSON documents).
package struct ControlResponse: Sendable {
    package var head: HTTPResponseHead
    package var body: ByteBuffer

    package var status: Int { Int(head.status.code) }

    /// The body as a problem+json document, when it is one.
    package var problem: ProblemDetails? {
        try? BrokerJSON.decoder().decode(ProblemDetails.self, from: Data(body.readableBytesView))
    }
}

/// An HTTP/1.1 client of the daemon's Unix socket: one connection per request, streaming both ways.
///
/// It knows nothing of commands or output; `AuthBrokerCLI`'s commands turn its answers into
/// text and exit codes.
package struct BrokerSocketClient: Sendable {
    package let socketPath: String
    private let group: any EventLoopGroup

    /// Largest control-API response accepted: far above any real anchor list, far below harm.
    package static let maxControlResponseBytes = 16 * 1024 * 1024
    /// Size of each read from a request body file.
    static let uploadChunkBytes = 64 * 1024

    package init(socketPath: String, group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton) {
        self.socketPath = socketPath
        self.group = group
    }

    /// Sends one request and hands the response head and streaming body to `handleResponse`.
    ///
    /// The request body is sent from a child task while the response is read, so a daemon
    /// that answers early (an error before the upload is done) is heard at once. 1xx interim
    /// responses are skipped. The connection is closed when `handleResponse` returns.
    package func execute<Result: Sendable>(
        _ head: HTTPRequestHead,
        body: BrokerRequestBody = .none,
        handleResponse: (HTTPResponseHead, inout BrokerResponseBody) async throws -> Result
    ) async throws -> Result {
        let channel = try await connect()
        let socket = socketPath
        return try await channel.executeThenClose { inbound, outbound in
            try await withThrowingTaskGroup(of: Void.self) { group in
                let rawChannel = channel.channel
                group.addTask {
                    do {
                        try await Self.send(head, body: body, to: outbound)
                    } catch {
                        // Wake the reader: no response will come for a request never finished.
                        rawChannel.close(promise: nil)
                        throw error
                    }
                }
                var iterator = inbound.makeAsyncIterator()
                do {
                    let responseHead = try await Self.readHead(&iterator, socket: socket)
                    var responseBody = BrokerResponseBody(iterator: iterator, socket: socket)
                    let result = try await handleResponse(responseHead, &responseBody)
                    group.cancelAll()
                    return result
                } catch let error as BrokerClientError {
                    // A request-side failure closed the connection; report that cause instead.
                    group.cancelAll()
                    while let outcome = await group.nextResult() {
                        if case .failure(let sendError as BrokerClientError) = outcome { throw sendError }
                    }
                    throw error
                }
            }
        }
    }

    /// One control-API exchange with a buffered JSON body each way.
    package func control(method: HTTPMethod, path: String, json: Data? = nil) async throws -> ControlResponse {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "authbrokerd")
        headers.add(name: "User-Agent", value: "authbrokerctl/\(AuthBrokerCtl.version)")
        headers.add(name: "Accept", value: "application/json")
        headers.add(name: "Connection", value: "close")
        var body = BrokerRequestBody.none
        if let json {
            headers.add(name: "Content-Type", value: "application/json")
            headers.add(name: "Content-Length", value: String(json.count))
            body = .bytes(ByteBuffer(bytes: json))
        } else if method == .POST || method == .PUT {
            headers.add(name: "Content-Length", value: "0")
        }
        let head = HTTPRequestHead(version: .http1_1, method: method, uri: path, headers: headers)
        return try await execute(head, body: body) { responseHead, responseBody in
            let (buffer, complete) = try await responseBody.collect(upTo: Self.maxControlResponseBytes)
            guard complete else { throw BrokerClientError.responseTooLarge(limit: Self.maxControlResponseBytes) }
            return ControlResponse(head: responseHead, body: buffer)
        }
    }

    // MARK: Connection

    /// Connects, then checks who listens before a byte is sent (`verifyListenerIsOwnUser`).
    private func connect() async throws -> NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart> {
        let channel = try await connectSocket()
        do {
            try await channel.channel.verifyListenerIsOwnUser(socketPath: socketPath)
        } catch {
            // Closed through the async channel, which must be finished before it goes away.
            try? await channel.executeThenClose { _, _ in }
            throw BrokerClientError.foreignListener(error)
        }
        return channel
    }

    private func connectSocket() async throws -> NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart> {
        do {
            return try await ClientBootstrap(group: group)
                .connect(unixDomainSocketPath: socketPath) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        return try NIOAsyncChannel<HTTPClientResponsePart, HTTPClientRequestPart>(
                            wrappingChannelSynchronously: channel
                        )
                    }
                }
        } catch {
            throw classifyConnectError(error)
        }
    }

    /// Maps the errno of a failed `connect(2)` to what it means for the user.
    func classifyConnectError(_ error: any Error) -> any Error {
        if let error = error as? SocketAddressError, case .unixDomainSocketPathTooLong = error {
            return BrokerClientError.unusableSocket(
                socket: socketPath, reason: "the path is longer than a Unix socket address allows (108 bytes)"
            )
        }
        let errno: CInt? =
            (error as? IOError)?.errnoCode
            ?? (error as? NIOConnectionError)?.connectionErrors.compactMap { ($0.error as? IOError)?.errnoCode }.first
        switch errno {
        case ENOENT, ECONNREFUSED, ENOTDIR:
            return BrokerClientError.daemonNotRunning(socket: socketPath)
        case EACCES, EPERM:
            return BrokerClientError.permissionDenied(socket: socketPath)
        case let code?:
            return BrokerClientError.unusableSocket(socket: socketPath, reason: String(cString: strerror(code)))
        case nil:
            return BrokerClientError.unusableSocket(socket: socketPath, reason: String(describing: error))
        }
    }

    // MARK: Wire

    static func nextPart(
        _ iterator: inout NIOAsyncChannelInboundStream<HTTPClientResponsePart>.AsyncIterator, socket: String
    ) async throws -> HTTPClientResponsePart {
        let part: HTTPClientResponsePart?
        do {
            part = try await iterator.next()
        } catch let error as HTTPParserError where error == .invalidEOFState {
            // The connection closed inside a body: a truncated response, not a malformed one.
            throw BrokerClientError.connectionClosed(socket: socket)
        } catch let error as HTTPParserError {
            throw BrokerClientError.protocolError(reason: "\(error)")
        } catch let error as ChannelError where error == .ioOnClosedChannel || error == .eof {
            throw BrokerClientError.connectionClosed(socket: socket)
        } catch let error as IOError where error.errnoCode == ECONNRESET || error.errnoCode == EPIPE {
            throw BrokerClientError.connectionClosed(socket: socket)
        }
        guard let part else { throw BrokerClientError.connectionClosed(socket: socket) }
        return part
    }

    private static func readHead(
        _ iterator: inout NIOAsyncChannelInboundStream<HTTPClientResponsePart>.AsyncIterator, socket: String
    ) async throws -> HTTPResponseHead {
        var inInterim = false
        while true {
            switch try await nextPart(&iterator, socket: socket) {
            case .head(let head) where (100..<200).contains(head.status.code) && head.status.code != 101:
                inInterim = true  // 1xx interim response (RFC 9110 §15.2): the real one follows
            case .head(let head):
                return head
            case .end where inInterim:
                inInterim = false
            case .body, .end:
                throw BrokerClientError.protocolError(reason: "body data arrived before a response head")
            }
        }
    }

    private static func send(
        _ head: HTTPRequestHead, body: BrokerRequestBody, to outbound: NIOAsyncChannelOutboundWriter<HTTPClientRequestPart>
    ) async throws {
        try await outbound.write(.head(head))
        switch body {
        case .none:
            break
        case .bytes(let buffer):
            if buffer.readableBytes > 0 { try await outbound.write(.body(.byteBuffer(buffer))) }
        case .file(let descriptor, let length):
            var sent: Int64 = 0
            while true {
                let want = length.map { Int(min(Int64(uploadChunkBytes), $0 - sent)) } ?? uploadChunkBytes
                if want == 0 { break }
                guard let chunk = try await LocalFile.read(descriptor, upTo: want) else {
                    if let length, sent != length {
                        throw BrokerClientError.requestBody(
                            reason: "the file shrank while it was sent (\(sent) of \(length) bytes)"
                        )
                    }
                    break
                }
                sent += Int64(chunk.readableBytes)
                try await outbound.write(.body(.byteBuffer(chunk)))
            }
        }
        try await outbound.write(.end(nil))
    }
}
