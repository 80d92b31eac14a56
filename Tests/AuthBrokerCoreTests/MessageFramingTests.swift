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
        #expect(try TransferCodings(Self.headers(("Transfer-Encoding", "gzip, chunked")))?.codingsOtherThanChunked == ["gzip"])
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

@Suite("Outbound framing")
struct OutboundFramingTests {
    static func prepared(_ pairs: [(String, String)], mayHaveBody: Bool = true, bodyWithoutFraming: Bool = true)
        -> (OutboundBodyFraming, [String])
    {
        var headers = HTTPHeaders(pairs)
        let framing = OutboundBodyFraming.prepare(&headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming)
        return (framing, headers.map { "\($0.name): \($0.value)" })
    }

    @Test("codings before chunked are kept and framed by the broker; chunked alone by the encoder")
    func codings() {
        #expect(Self.prepared([("Transfer-Encoding", "gzip, chunked")]) == (.chunkedAfterCodings, ["Transfer-Encoding: gzip, chunked"]))
        #expect(Self.prepared([("Transfer-Encoding", "gzip")]) == (.chunkedAfterCodings, ["Transfer-Encoding: gzip, chunked"]))
        #expect(Self.prepared([("Transfer-Encoding", "xchunked"), ("Content-Length", "4")]) == (.chunkedAfterCodings, ["Transfer-Encoding: xchunked, chunked"]))
        #expect(Self.prepared([("Transfer-Encoding", "chunked")]) == (.chunked, ["Transfer-Encoding: chunked"]))
        #expect(Self.prepared([("transfer-encoding", "Chunked ")]) == (.chunked, ["Transfer-Encoding: chunked"]))
        #expect(Self.prepared([("Transfer-Encoding", "chunked, chunked")]) == (.chunked, ["Transfer-Encoding: chunked"]))
        #expect(Self.prepared([("Transfer-Encoding", "chunked, gzip")]) == (.chunkedAfterCodings, ["Transfer-Encoding: gzip, chunked"]))
        #expect(Self.prepared([("Transfer-Encoding", "\"bad")]) == (.chunked, ["Transfer-Encoding: chunked"]), "an unreadable list keeps no codings")
    }

    @Test("a length wins over chunked alone; a response without either is chunked, a request without either has no body")
    func lengths() {
        #expect(Self.prepared([("Content-Length", "5"), ("Transfer-Encoding", "chunked")]) == (.length, ["Content-Length: 5"]))
        #expect(Self.prepared([("X", "1")]) == (.chunked, ["X: 1", "Transfer-Encoding: chunked"]))
        #expect(Self.prepared([("X", "1")], bodyWithoutFraming: false) == (.none, ["X: 1"]))
    }

    @Test("1xx, 204 and 304 carry no framing fields")
    func noBody() {
        #expect(Self.prepared([("Content-Length", "5"), ("Transfer-Encoding", "gzip, chunked"), ("X", "1")], mayHaveBody: false) == (.none, ["X: 1"]))
    }
}

@Suite("Outbound framing: the no-rewrite check")
struct OutboundFramingUnchangedTests {
    static let cases: [[(String, String)]] = [
        [], [("Content-Length", "5")], [("Transfer-Encoding", "chunked")], [("transfer-encoding", "chunked")],
        [("Transfer-Encoding", "Chunked")], [("Transfer-Encoding", "gzip, chunked")], [("Transfer-Encoding", "gzip"), ("Transfer-Encoding", "chunked")],
        [("Content-Length", "5"), ("Transfer-Encoding", "chunked")], [("X", "1"), ("Content-Length", "0")],
    ]

    @Test("whenever it says a head needs no rewrite, prepare agrees and changes nothing")
    func agreesWithPrepare() {
        for pairs in Self.cases {
            for (mayHaveBody, bodyWithoutFraming) in [(true, true), (true, false), (false, true)] {
                let headers = HTTPHeaders(pairs)
                var prepared = headers
                let framing = OutboundBodyFraming.prepare(&prepared, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming)
                if let unchanged = OutboundBodyFraming.unchanged(headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming) {
                    #expect(unchanged == framing, "\(pairs)")
                    #expect(prepared == headers, "\(pairs) was changed")
                }
            }
        }
        #expect(OutboundBodyFraming.unchanged(HTTPHeaders([("Content-Length", "5")]), mayHaveBody: true, bodyWithoutFraming: true) == .length)
        #expect(OutboundBodyFraming.unchanged(HTTPHeaders(), mayHaveBody: true, bodyWithoutFraming: false) == OutboundBodyFraming.none)
    }
}
