import AuthBrokerCore
import NIOCore
import NIOHTTP1
import Testing

@Suite("Response heads on the wire (RFC 9112 §4, §5)")
struct ResponseHeadEncodingTests {
    static func encode(
        _ status: HTTPResponseStatus, _ fields: [(String, String)], version: HTTPVersion = .http1_1
    ) -> Result<String, ResponseHeadEncoding.Refusal> {
        var buffer = ByteBuffer(string: "before|")
        do {
            try ResponseHeadEncoding.write(version: version, status: status, headers: HTTPHeaders(fields), to: &buffer)
            return .success(String(buffer: buffer))
        } catch {
            // Nothing of a refused head stays in the buffer.
            #expect(String(buffer: buffer) == "before|")
            return .failure(error)
        }
    }

    @Test("a head is its status line, its fields in order and as given, and the empty line")
    func encodesAsGiven() {
        #expect(
            Self.encode(.ok, [("Content-Length", "5"), ("x-Mixed", "a\tb  c"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")])
                == .success("before|HTTP/1.1 200 OK\r\nContent-Length: 5\r\nx-Mixed: a\tb  c\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n")
        )
        #expect(Self.encode(.notModified, []) == .success("before|HTTP/1.1 304 Not Modified\r\n\r\n"))
        #expect(Self.encode(.ok, [], version: .http1_0) == .success("before|HTTP/1.0 200 OK\r\n\r\n"))
        #expect(Self.encode(.custom(code: 599, reasonPhrase: ""), []) == .success("before|HTTP/1.1 599 \r\n\r\n"))
        #expect(Self.encode(.custom(code: 100, reasonPhrase: "Go on"), []) == .success("before|HTTP/1.1 100 Go on\r\n\r\n"))
        // obs-text (here UTF-8 of a realm a server sent in ISO-8859-1 and the broker read) passes.
        #expect(Self.encode(.unauthorized, [("WWW-Authenticate", "Basic realm=\"foo-ä\"")]) == .success(
            "before|HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"foo-ä\"\r\n\r\n"
        ))
        // Every token character, and an empty value.
        let token = "!#$%&'*+-.^_`|~09azAZ"
        #expect(Self.encode(.ok, [(token, "")]) == .success("before|HTTP/1.1 200 OK\r\n\(token): \r\n\r\n"))
    }

    @Test("a value with CR, LF, NUL or another control character is refused, and so is the head")
    func refusesControlCharactersInValues() {
        for bad in ["a\r\nSet-Cookie: evil=1", "a\nb", "a\rb", "a\u{0}b", "a\u{1}b", "a\u{7F}b", "\r\n\r\nHTTP/1.1 200 OK"] {
            #expect(Self.encode(.ok, [("A", "fine"), ("X-Echo", bad)]) == .failure(.fieldValue(position: 1)))
        }
    }

    @Test("a name that is not a token is refused: empty, with a space, a colon, a separator, CR or LF")
    func refusesNamesThatAreNotTokens() {
        for bad in ["", "X Name", "X:Name", "X-Name:", "(x)", "a\r\nb", "a\nb", "é", "a\"b", "a/b", "a\u{0}"] {
            #expect(Self.encode(.ok, [(bad, "v")]) == .failure(.fieldName(position: 0)), "\(bad.debugDescription)")
        }
    }

    @Test("a reason phrase with a line break, or a status code that is not three digits, is refused")
    func refusesBadStatusLines() {
        #expect(Self.encode(.custom(code: 200, reasonPhrase: "OK\r\nSet-Cookie: a=1"), []) == .failure(.reasonPhrase))
        #expect(Self.encode(.custom(code: 1000, reasonPhrase: "Big"), []) == .failure(.statusCode(1000)))
        #expect(Self.encode(.custom(code: 99, reasonPhrase: "Small"), []) == .failure(.statusCode(99)))
    }

    @Test("a refusal names positions, never a value")
    func refusalsNameNoValues() {
        let secret = "Bearer s3cr3t\r\n"
        guard case .failure(let refusal) = Self.encode(.ok, [("Authorization", secret)]) else {
            Issue.record("the value with CRLF was sent")
            return
        }
        #expect(!refusal.description.contains("s3cr3t"))
        #expect(!String(describing: refusal).contains("Authorization"))
        #expect(refusal.description.contains("field 1"))
    }
}
