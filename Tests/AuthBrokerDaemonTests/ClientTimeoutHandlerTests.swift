import AuthBrokerCore
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing

@testable import AuthBrokerDaemon

/// The client connection's head and idle timers, on an embedded event loop whose clock the test
/// moves. The timer is scheduled lazily (left to fire when a deadline moves later), so these pin
/// that every deadline still holds to the millisecond.
@Suite("Client connection timers")
struct ClientTimeoutHandlerTests {
    static let headTimeout = 100
    static let idleTimeout = 300

    struct Connection {
        let channel: EmbeddedChannel
        let timeouts: ClientTimeoutHandler
        let expired: NIOLockedValueBox<[ClientWaitState.Deadline]>

        func advance(to milliseconds: Int64) {
            let loop = self.channel.embeddedEventLoop
            loop.advanceTime(to: NIODeadline.uptimeNanoseconds(0) + .milliseconds(milliseconds))
        }

        /// Bytes from the client in one read, as the socket delivers them.
        func send(_ text: String) throws {
            try self.channel.writeInbound(ByteBuffer(string: text))
            self.channel.pipeline.fireChannelReadComplete()
        }

        /// What reached the handler behind the timers.
        func requestParts() throws -> [HTTPServerRequestPart] {
            var parts: [HTTPServerRequestPart] = []
            while let part = try self.channel.readInbound(as: HTTPServerRequestPart.self) { parts.append(part) }
            return parts
        }
    }

    static func connect() throws -> Connection {
        var limits = BrokerSettings.Limits()
        limits.requestHeadTimeoutMilliseconds = Self.headTimeout
        limits.clientIdleTimeoutMilliseconds = Self.idleTimeout
        let terms = ClientConnectionTerms(limits: limits, controlOnly: false)
        let expired = NIOLockedValueBox<[ClientWaitState.Deadline]>([])
        let state = ClientTimeoutState()
        let timeouts = ClientTimeoutHandler(terms: terms, state: state) { deadline in expired.withLockedValue { $0.append(deadline) } }
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandlers([
            ClientBytesObserver(state: state, timeouts: timeouts),
            ByteToMessageHandler(HTTPRequestDecoder()),
            timeouts,
        ])
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 80)).wait()
        return Connection(channel: channel, timeouts: timeouts, expired: expired)
    }

    @Test("a connection busy past its first idle deadline is closed only a whole idle timeout after its last response")
    func idleCountsFromTheLastResponse() throws {
        let connection = try Self.connect()
        connection.advance(to: 200)
        try connection.send("GET http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n\r\n")
        #expect(try connection.requestParts().count == 2)
        connection.advance(to: 250)
        connection.timeouts.responseEnded()
        connection.advance(to: 310)
        #expect(connection.channel.isActive, "the first idle deadline (300 ms) was moved by the request")
        connection.advance(to: 549)
        #expect(connection.channel.isActive)
        connection.advance(to: 550)
        #expect(!connection.channel.isActive, "300 ms after the response ended, the idle connection is closed")
        #expect(connection.expired.withLockedValue { $0 } == [.idle])
    }

    @Test("a head begun while the idle timer runs gets the shorter head timeout, counted from its first bytes")
    func headTimeoutCutsInBeforeTheIdleTimer() throws {
        let connection = try Self.connect()
        connection.advance(to: 10)
        try connection.send("GET http://origin.test/ HTTP/1.1\r\n")
        connection.advance(to: 109)
        #expect(connection.channel.isActive)
        connection.advance(to: 110)
        #expect(connection.expired.withLockedValue { $0 } == [.head])
        let answer = try connection.channel.readOutbound(as: HTTPServerResponsePart.self)
        guard case .head(let head)? = answer else {
            Issue.record("expected a response head, got \(String(describing: answer))")
            return
        }
        #expect(head.status == .requestTimeout)
    }

    @Test("a head completed in the read that began it leaves the idle deadline to the next response")
    func wholeHeadInOneRead() throws {
        let connection = try Self.connect()
        connection.advance(to: 50)
        try connection.send("GET http://origin.test/ HTTP/1.1\r\nHost: origin.test\r\n\r\n")
        // The request is in flight: no deadline at all, however long the response takes.
        connection.advance(to: 5_000)
        #expect(connection.channel.isActive)
        #expect(connection.expired.withLockedValue { $0 }.isEmpty)
        connection.timeouts.responseEnded()
        connection.advance(to: 5_299)
        #expect(connection.channel.isActive)
        connection.advance(to: 5_300)
        #expect(!connection.channel.isActive)
        #expect(connection.expired.withLockedValue { $0 } == [.idle])
    }

    @Test("the rest of a head arriving in a later read stops the head timer")
    func headCompletedLater() throws {
        let connection = try Self.connect()
        try connection.send("GET http://origin.test/ HTTP/1.1\r\n")
        connection.advance(to: 90)
        try connection.send("Host: origin.test\r\n\r\n")
        connection.advance(to: 1_000)
        #expect(connection.channel.isActive, "a complete head in flight has no deadline")
        #expect(connection.expired.withLockedValue { $0 }.isEmpty)
    }
}
