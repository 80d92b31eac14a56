import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import Foundation
import NIOCore
import NIOHTTP1
import Testing

@Suite("Broker errors")
struct BrokerErrorTests {
    /// The fix offered for an untrusted server follows from its reasons.
    @Test(
        "an anchor is offered only when the issuer is the problem; an exception whenever no pin refused",
        arguments: [
            ([TrustFailure.selfSigned], true, true),
            ([.unknownIssuer(issuer: "CN=Corp CA")], true, true),
            ([.hostnameMismatch(host: "nas.test", names: ["other.test"])], false, true),
            ([.selfSigned, .hostnameMismatch(host: "nas.test", names: ["localhost"])], false, true),
            ([.expired(notAfter: .now - 86400)], false, true),
            ([.unfitForServer(certificate: "The certificate 'CN=x'", reason: "it is for client authentication only")], false, true),
            ([.pinMismatch(host: "nas.test", pinned: ["A"], presented: ["B"])], false, false),
            ([.anchorOutOfScope(anchorID: "1c903d0b", hosts: [try! HostPattern(parsing: "*.internal.test")]), .hostnameMismatch(host: "nas.test", names: ["other.test"])], false, true),  // try!: a valid literal
        ] as [([TrustFailure], Bool, Bool)]
    )
    func untrustedServerFix(failures: [TrustFailure], offersAnchor: Bool, offersException: Bool) throws {
        let leaf = CertificateInfo(
            subject: "CN=nas.test", issuer: "CN=nas.test", notBefore: .now - 86400, notAfter: .now + 86400, sha256: "AB:CD",
            spkiSHA256: "spki", dnsNames: ["nas.test"], ipAddresses: [], isSelfSigned: true, isCA: false
        )
        let decision = TrustDecision(isTrusted: false, failures: failures, chain: [leaf], fromCache: false)
        let error = BrokerError.untrustedServer(origin: try CanonicalOrigin(parsing: "https://nas.test:5001"), decision: decision)
        let fix = error.fix ?? []
        #expect(fix.contains { $0.hasPrefix("authbrokerctl anchors ") } == offersAnchor, "\(fix)")
        #expect(fix.contains("authbrokerctl exceptions add nas.test:5001 AB:CD") == offersException, "\(fix)")
        #expect(error.detail.contains("An anchor would not change that") == (!offersAnchor && offersException))
        // The detail never points at a `fix` there is not, and when no anchor helps it never
        // leads with advice about anchors (an out-of-scope anchor beside a name mismatch).
        #expect(!error.detail.contains("see `fix`") || !fix.isEmpty, "\(error.detail)")
        if !offersAnchor { #expect(!error.detail.contains("limited to"), "\(error.detail)") }
        if !offersException { #expect(error.detail.contains("pins remove"), "\(error.detail)") }
    }

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

    @Test("upstream proxy errors name the proxy as next-hop; an unanswered 407 carries the proxy's challenges")
    func proxyErrors() throws {
        let origin = try CanonicalOrigin(scheme: .https, host: "api.corp.test", port: 443)
        let proxy = try CanonicalOrigin(scheme: .http, host: "proxy.corp.test", port: 3128)
        let unreachable = BrokerError.proxyUnreachable(.connectionRefused(origin: proxy), proxy: proxy, origin: origin)
        let (head, _) = unreachable.response(requestID: nil)
        #expect(head.status == .badGateway)
        let status = try #require(head.headers.first(name: "Proxy-Status"))
        #expect(status.hasPrefix("authbrokerd; error=connection_refused; next-hop=\"proxy.corp.test:3128\"; details="))
        #expect(unreachable.detail.contains("[upstream] proxy"))
        #expect(unreachable.detail.contains("no_proxy"))

        let denied = BrokerError.proxyRefusedTunnel(proxy: proxy, origin: origin, status: .forbidden)
        #expect(denied.proxyErrorType == .httpRequestDenied)
        #expect(BrokerError.proxyRefusedTunnel(proxy: proxy, origin: origin, status: .badGateway).proxyErrorType == .destinationUnavailable)
        #expect(denied.detail.contains("CONNECT api.corp.test:443"))

        let challenge = BrokerError.proxyAuthenticationRequired(
            proxy: proxy, origin: origin, challenges: [#"Basic realm="corp""#, #"Digest realm="corp", nonce="n""#]
        )
        let (challengeHead, body) = challenge.response(requestID: "r")
        #expect(challengeHead.status == .proxyAuthenticationRequired)
        #expect(challengeHead.headers["Proxy-Authenticate"] == [#"Basic realm="corp""#, #"Digest realm="corp", nonce="n""#])
        #expect(challengeHead.headers.first(name: "Proxy-Status") == nil)
        let problem = try BrokerJSON.decoder().decode(ProblemDetails.self, from: Data(body.readableBytesView))
        #expect(problem.fix == ["authbrokerctl passwords add http://proxy.corp.test:3128 --user NAME"])
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
