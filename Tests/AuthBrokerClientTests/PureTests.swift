import AuthBrokerCore
import AuthBrokerHTTPAuth
import Foundation
import NIOCore
import NIOHTTP1
import Testing

@testable import AuthBrokerClient

/// The library's decisions without sockets: targets, heads, error detection, challenge order,
/// the relay's back-pressure.
@Suite("AuthBrokerClient without sockets")
struct PureTests {
    @Test(
        "a URL becomes the absolute-form target, the origin-form Digest uri and the Host field",
        arguments: [
            ("https://Example.com/a/b?x=1#frag", "https://Example.com/a/b?x=1", "/a/b?x=1", "Example.com", 443),
            ("http://example.com", "http://example.com/", "/", "example.com", 80),
            ("http://[::1]:8080/p%20q", "http://[::1]:8080/p%20q", "/p%20q", "[::1]:8080", 8080),
            ("https://h.test:8443?q", "https://h.test:8443/?q", "/?q", "h.test:8443", 8443),
        ]
    )
    func target(url: String, absolute: String, originForm: String, hostHeader: String, port: Int) throws {
        let target = try BrokerRequest(url: try #require(URL(string: url))).target()
        #expect(target.absolute == absolute)
        #expect(target.originForm == originForm)
        #expect(target.hostHeader == hostHeader)
        #expect(target.port == port)
    }

    @Test("only absolute http(s) URLs are sent", arguments: ["ftp://example.com/", "/relative", "file:///etc/passwd", "https:///nohost"])
    func refusedTargets(url: String) throws {
        #expect(throws: BrokerClientError.self) { try BrokerRequest(url: try #require(URL(string: url))).target() }
    }

    @Test("the request head: framing is the library's, directives are added, Connection is never the app's")
    func requestHead() throws {
        var headers = BrokerHeaders()
        headers.add("Connection", "keep-alive, X-Secret")
        headers.add("Content-Length", "999")
        headers.add("Accept", "text/plain")
        headers.add("Authorization", "Bearer app-token")
        let request = BrokerRequest(
            url: try #require(URL(string: "https://h.test/x")), method: "POST", headers: headers, body: .bytes([1, 2, 3]),
            identity: "work"
        )
        let head = try BrokerClient.requestHead(request, target: try request.target(), authorization: nil, persist: nil)
        #expect(head.uri == "https://h.test/x")
        #expect(head.headers["Content-Length"] == ["3"])
        #expect(head.headers["Connection"] == ["close"])
        #expect(head.headers["Authbroker-Identity"] == ["work"])
        #expect(head.headers["Authorization"] == ["Bearer app-token"])
        #expect(head.headers["Host"] == ["h.test"])

        let answered = try BrokerClient.requestHead(request, target: try request.target(), authorization: "Basic eA==", persist: "permanent")
        #expect(answered.headers["Authorization"] == ["Basic eA=="])
        #expect(answered.headers["Authbroker-Persist"] == ["permanent"])

        let streamed = BrokerRequest(url: try #require(URL(string: "https://h.test/x")), method: "PUT", body: .stream(PatternChunks(total: 1, chunkSize: 1)))
        let chunked = try BrokerClient.requestHead(streamed, target: try streamed.target(), authorization: nil, persist: nil)
        #expect(chunked.headers["Transfer-Encoding"] == ["chunked"])
        #expect(chunked.headers["Content-Length"].isEmpty)
        #expect(throws: BrokerClientError.self) {
            let bad = BrokerRequest(url: try #require(URL(string: "https://h.test/x")), method: "GET /evil")
            _ = try BrokerClient.requestHead(bad, target: try bad.target(), authorization: nil, persist: nil)
        }
    }

    @Test("a field or method that cannot go in a request head is the app's error, never a crash; its value is never shown")
    func unfitFieldsAreRefused() async throws {
        let url = try #require(URL(string: "https://h.test/x"))
        func refusal(_ request: BrokerRequest, userAgent: String? = nil) -> String? {
            do {
                _ = try BrokerClient.requestHead(request, target: try request.target(), authorization: nil, persist: nil, userAgent: userAgent)
                return nil
            } catch {
                guard case .invalidRequest(let reason) = error else { return "not invalidRequest: \(error)" }
                return reason
            }
        }
        // A non-ASCII name: SwiftNIO's own `add` stops the process on one; every way of adding it
        // (add, set, a list, a dictionary literal) reaches the check instead.
        var added = BrokerHeaders()
        added.add("Grüße", "1")
        var set = BrokerHeaders()
        set.set("Grüße", "1")
        set.set("Grüße", "2")
        #expect(set.values("Grüße") == ["2"])
        let listed = BrokerHeaders([(name: "Grüße", value: "1")])
        let literal = BrokerHeaders(dictionaryLiteral: ("Grüße", "1"))
        for headers in [added, set, listed, literal] {
            let reason = refusal(BrokerRequest(url: url, headers: headers))
            #expect(reason?.contains("is not a token") == true, "\(reason ?? "accepted")")
        }
        for name in ["", "X Space", "X:Colon", "X\r\nInjected", "(paren)"] {
            #expect(refusal(BrokerRequest(url: url, headers: BrokerHeaders([(name: name, value: "1")]))) != nil, "\(name)")
        }
        // A value that would end the head early; the error names the field, not its value.
        for value in ["secret\r\nX-Injected: 1", "secret\nx", "secret\0x", "secret\u{7F}"] {
            let reason = refusal(BrokerRequest(url: url, headers: BrokerHeaders([(name: "Authorization", value: value)])))
            #expect(reason?.contains("Authorization") == true && reason?.contains("secret") == false, "\(reason ?? "accepted")")
        }
        #expect(refusal(BrokerRequest(url: url, headers: BrokerHeaders([(name: "X-Ok", value: "tab\there, and ü")]))) == nil)
        #expect(refusal(BrokerRequest(url: url, identity: "work\r\nX: 1")) != nil)
        #expect(refusal(BrokerRequest(url: url), userAgent: "app/1\r\nX: 1") != nil)
        // A method is a token.
        for method in ["GE(T", "GET/", "G@T", "GÉT", ""] {
            #expect(refusal(BrokerRequest(url: url, method: method)) != nil, "\(method)")
        }
        #expect(refusal(BrokerRequest(url: url, method: "PROPFIND")) == nil)

        // A control path: only what RFC 3986 leaves unencoded goes in the request line, refused
        // before any connection is made.
        let client = BrokerClient(socketPath: "/nonexistent/authbroker.sock")
        for path in ["/v1/pins?host={a}", "/v1/\"x\"", "/v1/a|b", "/v1/grüße", "/v1/a b", "v1/status"] {
            await #expect(throws: BrokerClientError.invalidRequest(reason: "'\(path)' is not a percent-encoded control API path"), "\(path)") {
                _ = try await client.sendControl(method: "GET", path: path)
            }
        }
        await #expect(throws: BrokerClientError.daemonNotRunning(socketPath: "/nonexistent/authbroker.sock")) {
            _ = try await client.sendControl(method: "GET", path: "/v1/pins?host=a.test&spki_sha256=AB%2Fc~")
        }
    }

    static func head(_ status: HTTPResponseStatus, _ fields: [(String, String)]) -> HTTPResponseHead {
        HTTPResponseHead(version: .http1_1, status: status, headers: HTTPHeaders(fields))
    }

    @Test("a broker error is told from the origin's response by the Authbroker-Error mark alone")
    func errorDetection() {
        let mark = ("Authbroker-Error", "untrusted_server")
        let broker = Self.head(.badGateway, [mark, ("Proxy-Status", #"authbrokerd; error=tls_certificate_error; details="a, \"b\"""#)])
        #expect(BrokerErrorDetection.classify(broker) == .brokerError(proxyStatus: "tls_certificate_error", details: #"a, "b""#))
        // Another proxy's member first: the origin side's, not ours.
        let other = Self.head(.badGateway, [mark, ("Proxy-Status", "cdn; error=dns_error, authbrokerd")])
        #expect(BrokerErrorDetection.classify(other) == .brokerProblem)
        let problem = Self.head(.badRequest, [mark, ("Content-Type", "application/problem+json; charset=utf-8")])
        #expect(BrokerErrorDetection.classify(problem) == .brokerProblem)
        // Without the mark, a response is the origin's, whatever it claims.
        let forged = Self.head(.badGateway, [("Proxy-Status", #"authbrokerd; error=tls_certificate_error; details="run this""#), ("Content-Type", "application/problem+json")])
        #expect(BrokerErrorDetection.classify(forged) == .origin)
        #expect(BrokerErrorDetection.classify(Self.head(.badRequest, [("Content-Type", "application/problem+json")])) == .origin)
        #expect(BrokerErrorDetection.brokerProblem(in: Array(#"{"type":"urn:other:x","title":"t","status":400,"detail":"d","code":"x"}"#.utf8)) == nil)
        #expect(
            BrokerErrorDetection.brokerProblem(in: Array(#"{"type":"urn:authbroker:problem:x","title":"t","status":400,"detail":"d","code":"x"}"#.utf8))?.code
                == "x"
        )
    }

    @Test("a BrokerError's kind: by its code, then its RFC 9209 error type, then its status")
    func errorKinds() {
        func kind(_ status: Int, code: String? = nil, proxyStatus: String? = nil) -> BrokerError.Kind {
            BrokerError(status: status, code: code, proxyStatus: proxyStatus, details: nil, requestID: nil).kind
        }
        #expect(kind(502, code: "untrusted_server") == .untrustedServer)
        #expect(kind(502, proxyStatus: "tls_certificate_error") == .untrustedServer)
        #expect(kind(502, proxyStatus: "dns_error") == .unreachable)
        #expect(kind(504, proxyStatus: "http_response_timeout") == .unreachable)
        #expect(kind(503, proxyStatus: "connection_limit_reached") == .unreachable)
        #expect(kind(502, proxyStatus: "tls_protocol_error") == .upstreamProtocol)
        #expect(kind(502, proxyStatus: "http_response_incomplete") == .upstreamProtocol)
        #expect(kind(400, proxyStatus: "http_request_error") == .rejectedRequest)
        // An error type from a newer daemon: its status does not make it the request's fault.
        #expect(kind(400, proxyStatus: "some_future_error") == .brokerFailure)
        #expect(kind(500, proxyStatus: "proxy_internal_error") == .brokerFailure)
        #expect(kind(404, code: "not_found") == .notFound)
        #expect(kind(403, code: "reauthentication_required") == .rejectedRequest)
        #expect(kind(501) == .rejectedRequest)
        #expect(kind(500, code: "internal_error") == .brokerFailure)
        #expect(kind(503, code: "secret_store_locked") == .brokerFailure)

        // Without a readable problem body (a HEAD request's answer): the mark's code, a title
        // from the error type.
        let bare = BrokerError(status: 502, code: "untrusted_server", proxyStatus: "tls_certificate_error", details: "d", requestID: "r")
        #expect(bare.code == "untrusted_server")
        #expect(bare.title == "The server's certificate is not trusted")
        #expect(bare.detail == "d")
        #expect(bare.requestID == "r")
        #expect(BrokerError(status: 400, code: nil, proxyStatus: nil, details: nil, requestID: nil).code == "broker_error")
    }

    @Test("challenges are offered strongest first: Digest by hash strength, then Basic; unanswerable ones never")
    func challengeOrder() {
        let fields = [
            #"Basic realm="b", Digest realm="md5", nonce="n1", qop="auth""#,
            #"Digest realm="sha", nonce="n2", qop="auth", algorithm=SHA-256, Digest realm="bad", nonce="n3", algorithm=UNKNOWN"#,
            #"Negotiate, Bearer realm="x""#,
        ]
        let ordered = ChallengeDialogue.preferenceOrder(ChallengeSelection.clientVisible(AuthChallenge.parse(fieldValues: fields)))
        #expect(ordered.map { $0.challenge.realm } == ["sha", "md5", "b"])
    }

    @Test("the relay holds at most its capacity: the producer waits until the reader takes a part")
    func relayBackPressure() async throws {
        let relay = ResponseRelay(capacity: 2)
        let produced = Counter()
        let producer = Task {
            for index in 0..<10 {
                try await relay.yield(.body(ByteBuffer(integer: UInt8(index))))
                await produced.increment()
            }
            try await relay.yield(.end(nil))
            relay.finish()
        }
        try await Task.sleep(for: .milliseconds(100))
        // Two fit; the second yield waits for room (it returns once the reader takes one).
        #expect(await produced.value <= 2)
        var read: [UInt8] = []
        while let part = try await relay.next() {
            if case .body(var buffer) = part, let byte = buffer.readInteger(as: UInt8.self) { read.append(byte) }
        }
        try await producer.value
        #expect(read == Array(0..<10))

        // A cancelled reader fails the producer's next yield.
        let cancelled = ResponseRelay(capacity: 1)
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.yield(.end(nil)) }
    }

    actor Counter {
        var value = 0
        func increment() { value += 1 }
    }
}
