import AuthBrokerCore
import Testing

@Suite("Header charset")
struct HeaderCharsetTests {
    @Test("a line that is not UTF-8 is read as ISO-8859-1; UTF-8 and ASCII lines are kept byte for byte")
    func transcodes() {
        var head = Array("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"foo-".utf8)
        head.append(0xE4)
        head += Array("\"\r\nX-Name: caf\u{E9}\r\n\r\n".utf8)  // é as UTF-8: valid, kept
        let result = HeaderCharset.transcodingLatin1Lines(of: head)
        let text = result.flatMap { String(validating: $0, as: UTF8.self) }
        #expect(text == "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"foo-\u{E4}\"\r\nX-Name: caf\u{E9}\r\n\r\n")
        #expect(HeaderCharset.transcodingLatin1Lines(of: Array("HTTP/1.1 200 OK\r\n\r\n".utf8)) == nil)
        #expect(HeaderCharset.transcodingLatin1Lines(of: Array("X: caf\u{E9}\r\n".utf8)) == nil, "valid UTF-8 is left alone")
        #expect(HeaderCharset.transcodingLatin1Lines(of: [0xFF, 0x0A, 0x80]) == [0xC3, 0xBF, 0x0A, 0xC2, 0x80])
        #expect(HeaderCharset.transcodingLatin1Lines(of: []) == nil)
    }

    @Test("the end of a head is found after its empty line, and not before")
    func headEnd() {
        #expect(HeaderCharset.headEnd(in: Array("HTTP/1.1 200 OK\r\n\r\nbody".utf8)) == 19)
        #expect(HeaderCharset.headEnd(in: Array("HTTP/1.1 200 OK\r\n".utf8)) == nil)
        #expect(HeaderCharset.headEnd(in: Array("\r\n\r".utf8)) == nil)
    }
}
