import AuthBrokerCore
import NIOHTTP1
import Testing

@Suite("Message framing (RFC 9112 §6)")
struct MessageFramingTests {
    static func headers(_ pairs: (String, String)...) -> HTTPHeaders { HTTPHeaders(pairs) }

    @Test("Transfer-Encoding is a list across field lines, read by token, with OWS and empty elements")
    func codingLists() throws {
        let cases: [(HTTPHeaders, [String], Bool)] = [
            (Self.headers(("Transfer-Encoding", "chunked")), ["chunked"], true),
            (Self.headers(("Transfer-Encoding", "gzip, chunked")), ["gzip", "chunked"], true),
            (Self.headers(("Transfer-Encoding", "GZip"), ("transfer-encoding", " Chunked \t")), ["gzip", "chunked"], true),
            (Self.headers(("Transfer-Encoding", ",, chunked ,")), ["chunked"], true),
            (Self.headers(("Transfer-Encoding", "foo;q=\"a,b\";x=1 , chunked")), ["foo", "chunked"], true),
            (Self.headers(("Transfer-Encoding", "xchunked")), ["xchunked"], false),
            (Self.headers(("Transfer-Encoding", "chunked, gzip")), ["chunked", "gzip"], false),
            (Self.headers(("Transfer-Encoding", "chunked, chunked")), ["chunked", "chunked"], false),
        ]
        for (headers, names, chunked) in cases {
            let codings = try #require(try TransferCodings(headers))
            #expect(codings.names == names)
            #expect(codings.isChunked == chunked, "\(names)")
        }
        #expect(try TransferCodings(Self.headers(("Content-Length", "3"))) == nil)
        #expect(try TransferCodings(Self.headers(("Transfer-Encoding", "gzip, chunked")))?.codingsBeforeChunked == ["gzip"])
    }

    @Test("hostile Transfer-Encoding values are typed errors", arguments: [
        "\"chunked\"", "chunked;", "chunked;a", "chunked;a=", "chunked;a=\"open", "chunk ed", "chunked\u{0}", "é", " , ",
        "gzip;a=\"\\", "chunked/1",
    ])
    func hostileCodings(_ value: String) {
        #expect(throws: TransferCodings.ParseError.self) { try TransferCodings(Self.headers(("Transfer-Encoding", value))) }
    }

    @Test("a request's framing: chunked wins, Content-Length is one number with OWS around it, anything else is refused")
    func requestFraming() throws {
        #expect(try RequestBodyFraming.of(Self.headers()) == .none)
        #expect(try RequestBodyFraming.of(Self.headers(("Content-Length", "0"))) == .none)
        #expect(try RequestBodyFraming.of(Self.headers(("Content-Length", " 42\t"))) == .length(42))
        #expect(try RequestBodyFraming.of(Self.headers(("Content-Length", "5, 5"), ("Content-Length", "5"))) == .length(5))
        #expect(try RequestBodyFraming.of(Self.headers(("Transfer-Encoding", "gzip, chunked"))) == .chunked)
        for bad in ["-1", "+5", "0x10", "5 5", "", "5, 6", "99999999999999999999", "٣"] {
            #expect(throws: RequestBodyFraming.FramingError.self, "\(bad.debugDescription)") {
                try RequestBodyFraming.of(Self.headers(("Content-Length", bad)))
            }
        }
        #expect(throws: RequestBodyFraming.FramingError.transferEncoding(.chunkedNotFinal)) {
            try RequestBodyFraming.of(Self.headers(("Transfer-Encoding", "gzip")))
        }
        #expect(throws: RequestBodyFraming.FramingError.transferEncoding(.chunkedNotFinal)) {
            try RequestBodyFraming.of(Self.headers(("Transfer-Encoding", "xchunked")))
        }
        #expect(throws: RequestBodyFraming.FramingError.transferEncoding(.empty)) {
            try RequestBodyFraming.of(Self.headers(("Transfer-Encoding", ",")))
        }
    }

    @Test("ProxyHeaders.isChunked reads the list, not the text")
    func isChunkedByList() {
        #expect(ProxyHeaders.isChunked(Self.headers(("Transfer-Encoding", "gzip, chunked"))))
        #expect(!ProxyHeaders.isChunked(Self.headers(("Transfer-Encoding", "xchunked"))))
        #expect(!ProxyHeaders.isChunked(Self.headers(("Transfer-Encoding", "\"chunked\""))))
        #expect(!ProxyHeaders.isChunked(Self.headers(("Content-Length", "chunked"))))
    }
}
