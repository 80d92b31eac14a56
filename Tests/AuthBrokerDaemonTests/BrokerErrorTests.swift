import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import Foundation
import NIOCore
import NIOHTTP1
import Testing

@Suite("Broker errors")
struct BrokerErrorTests {
    @Test("an upstream error renders status, Proxy-Status and a problem body with the request id")
    func rendering() throws {
        let origin = try CanonicalOrigin(scheme: .https, host: "api.corp.test", port: 8443)
        let (head, body) = BrokerError.connectTimeout(origin: origin, milliseconds: 250).response(requestID: "abc")
        #expect(head.status == .gatewayTimeout)
        #expect(head.headers.first(name: "Proxy-Status")?.hasPrefix("authbrokerd; error=connection_timeout") == true)
        #expect(head.headers.first(name: "Authbroker-Request-Id") == "abc")
        let problem = try BrokerJSON.decoder().decode(ProblemDetails.self, from: Data(body.readableBytesView))
        #expect(problem.code == "connection_timeout")
        #expect(problem.instance == "abc")
        #expect(problem.detail.contains("connect_timeout_ms"))
        #expect(head.headers.first(name: "Content-Length") == String(body.readableBytes))
    }

    @Test(
        "the suggested anchor scope is the parent domain for deep names, the host otherwise",
        arguments: [
            ("self-signed.internal.test", "*.internal.test"), ("example.com", "example.com"),
            ("127.0.0.1", "127.0.0.1"), ("::1", "::1"), ("a.b.c.d", "*.b.c.d"),
        ]
    )
    func scope(host: String, expected: String) {
        #expect(HostScope.suggestedPattern(for: host) == expected)
    }

    @Test("client-side errors carry no Proxy-Status")
    func clientErrors() {
        let (head, _) = BrokerError.requestHeadTooLarge(limit: 10).response(requestID: nil)
        #expect(head.status == .requestHeaderFieldsTooLarge)
        #expect(head.headers.first(name: "Proxy-Status") == nil)
    }
}

@Suite("Upstream exchange errors")
struct UpstreamExchangeErrorTests {
    @Test("a reset is a closed connection, an oversized head is too large, an end inside a head is incomplete")
    func classification() {
        func name(_ error: UpstreamExchangeError) -> String {
            switch error {
            case .connectionClosed: "closed"
            case .responseHeadTooLarge: "too large"
            case .responseIncomplete: "incomplete"
            case .protocolError: "protocol"
            case .responseHeadTimeout, .idleTimeout, .busy: "other"
            }
        }
        #expect(name(UpstreamExchangeHandler.exchangeError(for: IOError(errnoCode: ECONNRESET, reason: "read"))) == "closed")
        #expect(name(UpstreamExchangeHandler.exchangeError(for: IOError(errnoCode: EPIPE, reason: "write"))) == "closed")
        #expect(name(UpstreamExchangeHandler.exchangeError(for: IOError(errnoCode: EBADF, reason: "read"))) == "protocol")
        #expect(name(UpstreamExchangeHandler.exchangeError(for: HTTPParserError.headerOverflow)) == "too large")
        #expect(name(UpstreamExchangeHandler.exchangeError(for: HTTPParserError.invalidEOFState)) == "incomplete")
        #expect(name(UpstreamExchangeHandler.exchangeError(for: HTTPParserError.invalidChunkSize)) == "protocol")
    }

    @Test("an incomplete response head is 502 http_response_incomplete")
    func incomplete() throws {
        let origin = try CanonicalOrigin(scheme: .http, host: "origin.test", port: 80)
        let (head, _) = BrokerError.responseIncomplete(origin: origin).response(requestID: nil)
        #expect(head.status == .badGateway)
        #expect(head.headers.first(name: "Proxy-Status")?.hasPrefix("authbrokerd; error=http_response_incomplete") == true)
    }
}
