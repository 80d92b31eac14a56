import AuthBrokerCore
import Testing

@Suite("Head normalization")
struct HeadNormalizationTests {
    @Test("a line that is not UTF-8 is read as ISO-8859-1; UTF-8 and ASCII lines are kept byte for byte")
    func transcodes() throws {
        var head = Array("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"foo-".utf8)
        head.append(0xE4)
        head += Array("\"\r\nX-Name: caf\u{E9}\r\n\r\n".utf8)  // é as UTF-8: valid, kept
        let result = try HeadNormalization.normalized(head)
        let text = result.flatMap { String(validating: $0, as: UTF8.self) }
        #expect(text == "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"foo-\u{E4}\"\r\nX-Name: caf\u{E9}\r\n\r\n")
        #expect(try HeadNormalization.normalized(Array("HTTP/1.1 200 OK\r\n\r\n".utf8)) == nil)
        #expect(try HeadNormalization.normalized(Array("X: caf\u{E9}\r\n".utf8)) == nil, "valid UTF-8 is left alone")
        #expect(try HeadNormalization.normalized([0xFF, 0x0A, 0x80]) == [0xC3, 0xBF, 0x0A, 0xC2, 0x80])
        #expect(try HeadNormalization.normalized([]) == nil)
    }

    @Test("whitespace after a field value is dropped; a line without a colon keeps it, so no line becomes the head's end")
    func trimsFieldLines() throws {
        let head = Array("HTTP/1.1 200 OK\r\nContent-Length: 5\t\r\nTransfer-Encoding: chunked \t\r\nX:  \r\n \t\r\n\r\n".utf8)
        let result = try #require(try HeadNormalization.normalized(head))
        #expect(String(decoding: result, as: UTF8.self) == "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nX:\r\n \t\r\n\r\n")
        #expect(try HeadNormalization.normalized(Array("HTTP/1.1 200 OK\r\nX: a b\r\n\r\n".utf8)) == nil)
        #expect(try HeadNormalization.normalized(Array("GET http://a.test/ HTTP/1.1 \r\nX: 1\r\n\r\n".utf8)) == nil, "the start line is not trimmed")
    }

    @Test("a bare CR anywhere in a head is refused", arguments: [
        "HTTP/1.1 200 OK\r\rX-Injected: yes\r\n\r\n", "HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", "\r", "HTTP/1.1 200 OK\r\nX\r: 1\r\n\r\n",
    ])
    func refusesBareCR(_ head: String) {
        #expect(throws: HeadNormalization.Refusal.bareCR) { try HeadNormalization.normalized(Array(head.utf8)) }
    }

    @Test("the end of a head is found after its empty line, and not before")
    func headEnd() {
        #expect(HeadNormalization.headEnd(in: Array("HTTP/1.1 200 OK\r\n\r\nbody".utf8)) == 19)
        #expect(HeadNormalization.headEnd(in: Array("HTTP/1.1 200 OK\r\n".utf8)) == nil)
        #expect(HeadNormalization.headEnd(in: Array("\r\n\r".utf8)) == nil)
    }
}
