import AuthBrokerCore
import NIOHTTP1
import Testing

@Suite("ProxyHeaders")
struct ProxyHeadersTests {
    static func pairs(_ headers: HTTPHeaders) -> [String] { headers.map { "\($0.name): \($0.value)" } }

    @Test func upstreamRequestDropsHopByHopAndSteering() throws {
        let origin = try CanonicalOrigin(scheme: .https, host: "Example.com", port: 8443)
        let input = HTTPHeaders([
            ("Host", "evil.test"),
            ("Connection", "close"),
            ("X-Custom", "1"),
            ("connection", "Keep-Alive, X-Hop ,, "),
            ("Keep-Alive", "timeout=5"),
            ("X-Hop", "secret-for-this-hop"),
            ("Proxy-Connection", "keep-alive"),
            ("Proxy-Authorization", "Basic cHJveHk6cHc="),
            ("TE", "trailers"),
            ("Trailer", "X-Checksum"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "h2c"),
            ("Authbroker-Identity", "work"),
            ("AUTHBROKER-Request-Id", "42"),
            ("Content-Length", "4"),
            ("Expect", "100-continue"),
            ("Authorization", "Basic dXNlcjpwdw=="),
            ("Via", "1.0 fred"),
            ("X-Keep", "a"),
            ("via", "1.1 p.example (Proxy/1.0)"),
            ("X-Keep", "b"),
        ])
        #expect(
            Self.pairs(ProxyHeaders.upstreamRequestHeaders(input, hostHeader: origin.hostHeader)) == [
                "Host: example.com:8443",
                "X-Custom: 1",
                "Content-Length: 4",
                "Expect: 100-continue",
                "Authorization: Basic dXNlcjpwdw==",
                "X-Keep: a",
                "X-Keep: b",
                "Via: 1.0 fred, 1.1 p.example (Proxy/1.0), 1.1 authbrokerd",
            ]
        )
    }

    @Test func upstreamRequestAddsHostAndViaWhenAbsent() throws {
        let origin = try CanonicalOrigin(parsing: "http://[::1]:8080/")
        let output = ProxyHeaders.upstreamRequestHeaders(["Accept": "*/*"], hostHeader: origin.hostHeader)
        #expect(Self.pairs(output) == ["Host: [::1]:8080", "Accept: */*", "Via: 1.1 authbrokerd"])
        let https = try CanonicalOrigin(parsing: "https://example.com:443/")
        #expect(ProxyHeaders.upstreamRequestHeaders([:], hostHeader: https.hostHeader)["Host"] == ["example.com"])
    }

    @Test(
        "each hop-by-hop request field is dropped",
        arguments: [
            "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "TE", "Trailer",
            "Transfer-Encoding", "Upgrade", "Authbroker-Anything", "authbroker-", "CONNECTION", "te",
        ]
    )
    func hopByHopRequestField(_ name: String) throws {
        let origin = try CanonicalOrigin(parsing: "https://example.com/")
        let output = ProxyHeaders.upstreamRequestHeaders([name: "x", "Accept": "*/*"], hostHeader: origin.hostHeader)
        #expect(Self.pairs(output) == ["Host: example.com", "Accept: */*", "Via: 1.1 authbrokerd"])
    }

    /// `Connection: content-length` would unframe the body upstream (request smuggling); naming a
    /// protected field in `Connection` removes only `Connection` itself.
    @Test func connectionCannotRemoveFraming() throws {
        let origin = try CanonicalOrigin(parsing: "https://example.com/")
        let input: HTTPHeaders = ["Connection": "Content-Length, Host", "Content-Length": "4", "Host": "x"]
        #expect(
            Self.pairs(ProxyHeaders.upstreamRequestHeaders(input, hostHeader: origin.hostHeader)) == [
                "Host: example.com", "Content-Length: 4", "Via: 1.1 authbrokerd",
            ]
        )
        #expect(
            Self.pairs(ProxyHeaders.clientResponseHeaders(["Connection": "content-length", "Content-Length": "9"], requestID: "r")) == [
                "Content-Length: 9", "Via: 1.1 authbrokerd", "Authbroker-Request-Id: r",
            ]
        )
    }

    /// Field names compare up to ASCII case only: no other byte folds (`[` is not `{`, `K` with a
    /// combining mark is not `k`), and lengths must match.
    @Test func fieldNamesCompareByASCIICaseOnly() {
        #expect(ProxyHeaders.fieldName("CoNNecTion", is: "connection"))
        #expect(ProxyHeaders.fieldName("te", is: "te"))
        #expect(!ProxyHeaders.fieldName("connection ", is: "connection"))
        #expect(!ProxyHeaders.fieldName("connectio", is: "connection"))
        #expect(!ProxyHeaders.fieldName("[", is: "{"))
        #expect(!ProxyHeaders.fieldName("@", is: "`"))
        #expect(!ProxyHeaders.fieldName("Kéep-Alive", is: "keep-alive"))
        #expect(!ProxyHeaders.fieldName("\u{212A}eep-alive", is: "keep-alive"), "KELVIN SIGN is not K")
        #expect(!ProxyHeaders.fieldName("", is: "te"))
        // Longer than a small string, and a substring: both compared in place.
        #expect(ProxyHeaders.fieldName("PROXY-AUTHENTICATE", is: "proxy-authenticate"))
        #expect(!ProxyHeaders.fieldName("PROXY-AUTHENTICATF", is: "proxy-authenticate"))
        #expect(ProxyHeaders.fieldName("x: Transfer-Encoding".dropFirst(3), is: "transfer-encoding"))
        #expect(!ProxyHeaders.fieldName("x: Transfer-Encodinf".dropFirst(3), is: "transfer-encoding"))
        #expect(ProxyHeaders.isDirective("AUTHBROKER-x") && ProxyHeaders.isDirective("authbroker-"))
        #expect(!ProxyHeaders.isDirective("authbroker") && !ProxyHeaders.isDirective("authbrokér-x"))
    }

    /// `Connection` tokens are split by hand: OWS, empty members, several fields, non-ASCII bytes.
    @Test func connectionTokensInAnyShape() {
        let input = HTTPHeaders([
            ("Connection", " ,\tX-One ,, x-two\t"),
            ("X-One", "1"),
            ("X-Two", "2"),
            ("CONNECTION", "x-thréé,"),
            ("X-Thréé", "3"),
            ("x-thrEE", "kept: a different name"),
            ("Connection", ""),
            ("Close", "named by no token, kept"),
            ("X-Keep", "k"),
        ])
        #expect(
            Self.pairs(ProxyHeaders.clientResponseHeaders(input, requestID: "r")) == [
                "x-thrEE: kept: a different name", "Close: named by no token, kept", "X-Keep: k", "Via: 1.1 authbrokerd",
                "Authbroker-Request-Id: r",
            ]
        )
    }

    @Test func clientResponseDropsHopByHop() {
        let input = HTTPHeaders([
            ("Content-Type", "text/plain"),
            ("Connection", "keep-alive, X-Internal"),
            ("X-Internal", "1"),
            ("Keep-Alive", "timeout=5, max=100"),
            ("Proxy-Connection", "keep-alive"),
            ("Proxy-Authenticate", "Basic realm=\"proxy\""),
            ("WWW-Authenticate", "Basic realm=\"site\""),
            ("Trailer", "X-Checksum"),
            ("Transfer-Encoding", "chunked"),
            ("Upgrade", "websocket"),
            ("Set-Cookie", "a=1, b"),
            ("Set-Cookie", "c=2"),
            ("TE", "kept (not a response field, passed as is)"),
            ("Authbroker-Echo", "upstream may send it; only requests are steering"),
            ("Via", "1.1 origin-cache"),
            ("AUTHBROKER-request-ID", "the origin's, replaced by the broker's"),
        ])
        #expect(
            Self.pairs(ProxyHeaders.clientResponseHeaders(input, requestID: "0123abcd")) == [
                "Content-Type: text/plain",
                "WWW-Authenticate: Basic realm=\"site\"",
                "Transfer-Encoding: chunked",
                "Set-Cookie: a=1, b",
                "Set-Cookie: c=2",
                "TE: kept (not a response field, passed as is)",
                "Via: 1.1 origin-cache, 1.1 authbrokerd",
                "Authbroker-Request-Id: 0123abcd",
            ]
        )
    }

    @Test("an origin cannot pass for the broker: Authbroker-* fields, and Proxy-Status and Cache-Status members naming it, are removed")
    func forgedBrokerMarks() {
        let input = HTTPHeaders([
            ("Authbroker-Error", "untrusted_server"),
            ("authbroker-error", "again"),
            ("Proxy-Status", #"authbrokerd; error=tls_certificate_error; details="a, b", cdn; error=dns_error"#),
            ("Proxy-Status", #""authbrokerd"; error=dns_timeout"#),
            ("Proxy-Status", #"upstream-proxy; error=connection_refused; details="authbrokerd, said nobody""#),
            ("Cache-Status", "authbrokerd; hit, origin-cache; fwd=miss"),
            ("cache-status", "authbrokerd; fwd=stale; fwd-status=304"),
            ("Content-Type", "application/problem+json"),
        ])
        #expect(
            Self.pairs(ProxyHeaders.clientResponseHeaders(input, requestID: "r")) == [
                "Proxy-Status: cdn; error=dns_error",
                #"Proxy-Status: upstream-proxy; error=connection_refused; details="authbrokerd, said nobody""#,
                "Cache-Status: origin-cache; fwd=miss",
                "Content-Type: application/problem+json",
                "Via: 1.1 authbrokerd",
                "Authbroker-Request-Id: r",
            ]
        )
    }

    @Test func chunkedRequestsByTransferEncoding() {
        #expect(ProxyHeaders.isChunked(["Transfer-Encoding": "chunked"]))
        #expect(ProxyHeaders.isChunked(["transfer-encoding": "gzip, CHUNKED"]))
        #expect(ProxyHeaders.isChunked(HTTPHeaders([("Transfer-Encoding", "gzip"), ("TRANSFER-ENCODING", "chunked")])))
        #expect(!ProxyHeaders.isChunked(["Transfer-Encoding": "gzip"]))
        #expect(!ProxyHeaders.isChunked(["X-Transfer-Encoding": "chunked", "Content-Length": "5"]))
        #expect(!ProxyHeaders.isChunked([:]))
    }

    @Test func brokerDirectivesAreLowerCasedInOrder() {
        let input = HTTPHeaders([
            ("Accept", "*/*"),
            ("Authbroker-Identity", "Work"),
            ("X-Authbroker-Not", "no"),
            ("AUTHBROKER-TIMEOUT", "5"),
            ("authbroker-identity", "second"),
        ])
        let directives = ProxyHeaders.brokerDirectives(input)
        #expect(directives.map(\.name) == ["authbroker-identity", "authbroker-timeout", "authbroker-identity"])
        #expect(directives.map(\.value) == ["Work", "5", "second"])
        #expect(ProxyHeaders.brokerDirectives(["Accept": "*/*"]).isEmpty)
    }

    @Test func viaToken() {
        #expect(ProxyHeaders.via == "1.1 authbrokerd")
    }
}

@Suite("DirectRelayPolicy")
struct DirectRelayPolicyTests {
    private func head(
        _ fields: [(String, String)] = [], method: HTTPMethod = .GET, version: HTTPVersion = .http1_1
    ) -> HTTPRequestHead {
        HTTPRequestHead(version: version, method: method, uri: "http://example.test/a", headers: HTTPHeaders(fields))
    }

    @Test func plainKeepAliveGetAndHeadAreAllowed() {
        #expect(DirectRelayPolicy.headAllows(self.head()))
        #expect(DirectRelayPolicy.headAllows(self.head([("Accept", "*/*"), ("Connection", "keep-alive")], method: .HEAD)))
    }

    @Test func otherMethodsVersionsAndClosingRequestsTakeTheFullPath() {
        for method: HTTPMethod in [.POST, .PUT, .DELETE, .OPTIONS, .PATCH, .CONNECT, .RAW(value: "BREW")] {
            #expect(!DirectRelayPolicy.headAllows(self.head(method: method)))
        }
        #expect(!DirectRelayPolicy.headAllows(self.head(version: .http1_0)))
        #expect(!DirectRelayPolicy.headAllows(self.head(version: HTTPVersion(major: 2, minor: 0))))
        #expect(!DirectRelayPolicy.headAllows(self.head([("Connection", "close")])))
    }

    @Test func fieldsThatNeedTheBrokerTakeTheFullPath() {
        let fields = [
            ("Authorization", "Basic dTpw"), ("proxy-authorization", "Basic dTpw"), ("EXPECT", "100-continue"),
            ("Upgrade", "websocket"), ("Content-Length", "0"), ("Transfer-Encoding", "chunked"),
            ("Authbroker-Identity", "work"), ("authbroker-interactive", "5"), ("AuthBroker-Anything", ""),
        ]
        for field in fields {
            #expect(!DirectRelayPolicy.headAllows(self.head([("Accept", "*/*"), field])), "\(field.0)")
        }
    }

    @Test func hostileFieldNamesAreJudgedWithoutCrashing() {
        let odd = [("", ""), ("\u{0}", "x"), ("Authorization ", "x"), (String(repeating: "a", count: 70_000), "v"), ("é", "ü")]
        for field in odd {
            _ = DirectRelayPolicy.headAllows(self.head([field]))
        }
        // A near-miss of a listed name is an ordinary field.
        #expect(DirectRelayPolicy.headAllows(self.head([("Authorizations", "x"), ("X-Authbroker-Identity", "y")])))
    }
}
