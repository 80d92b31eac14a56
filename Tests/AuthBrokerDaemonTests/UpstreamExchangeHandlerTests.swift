import AuthBrokerDaemon
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

/// The exchange handler's timers, on an embedded event loop whose clock the test moves.
@Suite("Upstream exchange timers")
struct UpstreamExchangeHandlerTests {
    static let idle = TimeAmount.milliseconds(100)

    /// Takes a relayed exchange's parts and failure, as the direct relay does.
    final class RecordingSink: UpstreamRelaySink {
        var parts: [HTTPClientResponsePart] = []
        var failure: UpstreamExchangeError?
        func upstreamReceived(_ part: HTTPClientResponsePart) { self.parts.append(part) }
        func upstreamReadComplete() {}
        func upstreamFailed(_ error: UpstreamExchangeError) { self.failure = error }

        var failedIdle: Bool { if case .idleTimeout? = self.failure { true } else { false } }
        var failedHead: Bool { if case .responseHeadTimeout? = self.failure { true } else { false } }
    }

    static func makeChannel(headTimeout: TimeAmount = .seconds(10)) throws -> (EmbeddedChannel, UpstreamExchangeHandler) {
        let handler = UpstreamExchangeHandler(
            responseHeadTimeout: headTimeout, idleTimeout: Self.idle, maxResponseHeadBytes: 16384, onClose: {}
        )
        let channel = EmbeddedChannel(handler: handler)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        return (channel, handler)
    }

    @Test("an exchange fails after the idle timeout with no read or write, counted from the last of either")
    func idleCountsFromLastActivity() throws {
        let (channel, handler) = try Self.makeChannel()
        let sink = RecordingSink()
        try handler.beginRelay(to: sink)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(60))
        try channel.writeOutbound(HTTPClientRequestPart.head(HTTPRequestHead(version: .http1_1, method: .POST, uri: "/")))
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(60))
        #expect(channel.isActive && sink.failure == nil, "60 ms after a write is not idle")
        try channel.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .ok)))
        channel.pipeline.fireChannelReadComplete()
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(99))
        #expect(channel.isActive && sink.failure == nil, "99 ms after a read is not idle")
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(sink.failedIdle, "100 ms without a read or write fails the exchange: \(String(describing: sink.failure))")
        #expect(!channel.isActive, "and closes the connection")
        #expect(sink.parts.count == 1)
    }

    @Test("between exchanges a connection is not timed out, and the next exchange gets the whole timeout")
    func noIdleTimeoutBetweenExchanges() throws {
        let (channel, handler) = try Self.makeChannel()
        let first = RecordingSink()
        try handler.beginRelay(to: first)
        try channel.writeInbound(HTTPClientResponsePart.head(HTTPResponseHead(version: .http1_1, status: .noContent)))
        try channel.writeInbound(HTTPClientResponsePart.end(nil))
        #expect(first.parts.count == 2 && first.failure == nil)
        channel.embeddedEventLoop.advanceTime(by: .seconds(5))
        #expect(channel.isActive, "an idle pooled connection is the pool's to time out")

        let second = RecordingSink()
        try handler.beginRelay(to: second)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(99))
        #expect(channel.isActive && second.failure == nil)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(second.failedIdle, "got \(String(describing: second.failure))")
        #expect(!channel.isActive)
        #expect(first.failure == nil, "the finished exchange hears nothing more")
    }

    @Test("the response head's timeout runs from the end of the request")
    func headTimeout() throws {
        let (channel, handler) = try Self.makeChannel(headTimeout: .milliseconds(50))
        let sink = RecordingSink()
        try handler.beginRelay(to: sink)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(30))
        handler.requestFinished()
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(49))
        #expect(channel.isActive && sink.failure == nil)
        channel.embeddedEventLoop.advanceTime(by: .milliseconds(1))
        #expect(sink.failedHead, "got \(String(describing: sink.failure))")
        #expect(!channel.isActive)
    }
}
