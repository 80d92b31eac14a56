import Foundation
import NIOCore
import NIOHTTP1

/// A response's status line and header fields.
public struct BrokerResponseHead: Sendable {
    public var status: Int
    public var reasonPhrase: String
    public var headers: BrokerHeaders

    /// `Authbroker-Request-Id`: the id of this request in the daemon's log.
    public var requestID: String? { headers["Authbroker-Request-Id"] }

    init(_ head: HTTPResponseHead) {
        self.status = Int(head.status.code)
        self.reasonPhrase = head.status.reasonPhrase
        self.headers = BrokerHeaders(head.headers)
    }
}

/// A response from the origin, fetched through the daemon: the head at once, the body as it
/// arrives.
public struct BrokerResponse: Sendable {
    public var head: BrokerResponseHead
    /// The body in chunks as they arrive, read at the reader's pace (the daemon and the origin
    /// are slowed, not buffered). Iterate it once. Dropping the response unread, or cancelling
    /// the task reading it, closes the connection and the daemon drops the upstream request.
    public var body: BrokerResponseBody

    public var status: Int { head.status }
    public var headers: BrokerHeaders { head.headers }
}

/// The body of a `BrokerResponse`: an `AsyncSequence` of byte chunks.
public struct BrokerResponseBody: AsyncSequence, Sendable {
    public typealias Element = [UInt8]

    /// Chunks already read (while the head was examined) that come first.
    let prefix: [[UInt8]]
    /// nil: the body was read whole into `prefix`.
    let exchange: BrokerExchange?

    init(prefix: [[UInt8]] = [], exchange: BrokerExchange?) {
        self.prefix = prefix
        self.exchange = exchange
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(prefix: prefix[...], exchange: exchange)
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        var prefix: ArraySlice<[UInt8]>
        let exchange: BrokerExchange?
        var done = false

        public mutating func next() async throws -> [UInt8]? {
            if let first = prefix.popFirst() { return first }
            guard !done, let exchange else { return nil }
            do {
                while true {
                    switch try await exchange.next() {
                    case .body(var buffer):
                        if buffer.readableBytes == 0 { continue }
                        return buffer.readBytes(length: buffer.readableBytes)
                    case .end, nil:
                        done = true
                        return nil
                    case .head:
                        throw BrokerClientError.protocolError(reason: "a second response head arrived inside a body")
                    }
                }
            } catch {
                done = true
                throw error
            }
        }
    }

    /// The whole body, up to `maxBytes`.
    /// - Throws: `BrokerClientError.responseTooLarge` when there is more (the connection is closed).
    public func collect(maxBytes: Int) async throws -> Data {
        var data = Data()
        for try await chunk in self {
            guard data.count + chunk.count <= maxBytes else {
                exchange?.cancel()
                throw BrokerClientError.responseTooLarge(limit: maxBytes)
            }
            data.append(contentsOf: chunk)
        }
        return data
    }

    /// Stops the transfer: closes the connection (the daemon drops the upstream request).
    public func cancel() {
        exchange?.cancel()
    }
}
