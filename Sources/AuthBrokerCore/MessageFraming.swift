import NIOHTTP1

/// A message's `Transfer-Encoding` as RFC 9112 §6.1 defines it: a list of codings, in the
/// order they were applied, across every field line of that name.
///
/// Read as a list, not searched as text: `xchunked` and `"chunked"` are not `chunked`, and
/// only a final `chunked` frames a message (§6.3).
package struct TransferCodings: Sendable, Hashable {
    /// The codings' names, lower-cased, in the order applied (parameters dropped).
    package let names: [String]

    /// Why a `Transfer-Encoding` cannot frame a request.
    package enum ParseError: Error, Sendable, Hashable, CustomStringConvertible {
        /// A list element that is not `token *( OWS ";" OWS name = value )`.
        case notACoding(String)
        /// The field names no coding at all (only commas and whitespace).
        case empty
        /// `chunked` is not the last coding (or is applied twice): the body's end cannot be found.
        case chunkedNotFinal

        package var description: String {
            switch self {
            case .notACoding(let element): "Transfer-Encoding element \(element.debugDescription) is not a transfer coding"
            case .empty: "Transfer-Encoding names no coding"
            case .chunkedNotFinal: "Transfer-Encoding does not end with a single chunked coding, so the body's length is unknown"
            }
        }
    }

    /// The codings of every `Transfer-Encoding` field in `headers`; nil when there is none.
    package init?(_ headers: HTTPHeaders) throws(ParseError) {
        var names: [String] = []
        var present = false
        for (name, value) in headers where ProxyHeaders.fieldName(name, is: "transfer-encoding") {
            present = true
            names += try Self.parse(value)
        }
        guard present else { return nil }
        guard !names.isEmpty else { throw .empty }
        self.names = names
    }

    /// Whether the last coding is `chunked` (and the only one of that name).
    package var isChunked: Bool {
        self.names.last == "chunked" && self.names.dropLast().allSatisfy { $0 != "chunked" }
    }

    /// The codings other than `chunked`: what a proxy that re-frames the body with one final
    /// `chunked` must keep (§6.1). (A `chunked` that is not final leaves a response running to
    /// the close; dropping it keeps the broker's own framing valid.)
    package var codingsOtherThanChunked: [String] {
        self.names.filter { $0 != "chunked" }
    }

    /// The names in one field value: `#transfer-coding` with empty elements allowed (RFC 9110
    /// §5.6.1), each `token *( OWS ";" OWS token BWS "=" BWS ( token / quoted-string ) )`.
    static func parse(_ value: String) throws(ParseError) -> [String] {
        var names: [String] = []
        var scanner = FieldScanner(Array(value.utf8))
        while true {
            scanner.skipOWS()
            if scanner.atEnd { break }
            if scanner.consume(UInt8(ascii: ",")) { continue }
            let start = scanner.position
            guard let name = scanner.token() else { throw .notACoding(scanner.rest(from: start)) }
            scanner.skipOWS()
            while scanner.consume(UInt8(ascii: ";")) {
                scanner.skipOWS()
                guard scanner.token() != nil else { throw .notACoding(scanner.rest(from: start)) }
                scanner.skipOWS()
                guard scanner.consume(UInt8(ascii: "=")) else { throw .notACoding(scanner.rest(from: start)) }
                scanner.skipOWS()
                guard scanner.token() != nil || scanner.quotedString() else { throw .notACoding(scanner.rest(from: start)) }
                scanner.skipOWS()
            }
            guard scanner.atEnd || scanner.consume(UInt8(ascii: ",")) else { throw .notACoding(scanner.rest(from: start)) }
            names.append(name.lowercased())
        }
        return names
    }
}

/// How a request's body is framed, from its head alone (RFC 9112 §6.3).
package enum RequestBodyFraming: Sendable, Hashable {
    /// No body (no `Content-Length` above 0, not chunked).
    case none
    /// `Content-Length` bytes.
    case length(Int)
    /// Chunked: the length is known only at the end.
    case chunked

    /// Why a request head leaves its body's length unknown: the server must answer 400 and close.
    package enum FramingError: Error, Sendable, Hashable, CustomStringConvertible {
        case transferEncoding(TransferCodings.ParseError)
        /// `Content-Length` that is not one decimal number (the same in every field line).
        case contentLength(String)

        package var description: String {
            switch self {
            case .transferEncoding(let error): "\(error)"
            case .contentLength(let value): "Content-Length \(value.debugDescription) is not a single decimal length"
            }
        }
    }

    /// The framing of a request with `headers`, or why it has none.
    ///
    /// `Transfer-Encoding` wins over `Content-Length` (§6.3 rule 3; the decoder refuses a request
    /// with both before this). Whitespace around a value is not part of it (RFC 9110 §5.5).
    package static func of(_ headers: HTTPHeaders) throws(FramingError) -> RequestBodyFraming {
        let codings: TransferCodings?
        do {
            codings = try TransferCodings(headers)
        } catch {
            throw .transferEncoding(error)
        }
        if let codings {
            guard codings.isChunked else { throw .transferEncoding(.chunkedNotFinal) }
            return .chunked
        }
        guard let length = try Self.contentLength(headers) else { return .none }
        return length > 0 ? .length(length) : .none
    }

    /// The request's `Content-Length`, OWS trimmed; nil when there is none. Several field lines
    /// (or a list) must all name the same number (RFC 9110 §8.6).
    static func contentLength(_ headers: HTTPHeaders) throws(FramingError) -> Int? {
        var length: Int?
        for (name, value) in headers where ProxyHeaders.fieldName(name, is: "content-length") {
            for element in value.split(separator: ",", omittingEmptySubsequences: false) {
                let digits = element.utf8.drop { $0 == 0x20 || $0 == 0x09 }.reversed().drop { $0 == 0x20 || $0 == 0x09 }.reversed()
                guard !digits.isEmpty, digits.count <= 18, digits.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }),
                    let parsed = Int(String(decoding: digits, as: UTF8.self)), length == nil || length == parsed
                else { throw .contentLength(value) }
                length = parsed
            }
        }
        return length
    }

    /// The framing of a head that already passed `of` (the client pipeline checks every head):
    /// a head that did not is read as having no body.
    package init(_ head: HTTPRequestHead) {
        self = (try? Self.of(head.headers)) ?? .none
    }

    /// Whether the body may be larger than `bound` bytes (a chunked one always may).
    package func mayExceed(_ bound: Int) -> Bool {
        switch self {
        case .none: false
        case .length(let length): length > bound
        case .chunked: true
        }
    }
}

/// A cursor over a field value's bytes, for the list grammars of RFC 9110 §5.6.
private struct FieldScanner {
    let bytes: [UInt8]
    var position = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    var atEnd: Bool { self.position == self.bytes.count }

    mutating func skipOWS() {
        while !self.atEnd, self.bytes[self.position] == 0x20 || self.bytes[self.position] == 0x09 { self.position += 1 }
    }

    mutating func consume(_ byte: UInt8) -> Bool {
        guard !self.atEnd, self.bytes[self.position] == byte else { return false }
        self.position += 1
        return true
    }

    /// A token (RFC 9110 §5.6.2), or nil (nothing consumed).
    mutating func token() -> String? {
        let start = self.position
        while !self.atEnd, HTTPSyntax.isTChar(self.bytes[self.position]) { self.position += 1 }
        guard self.position > start else { return nil }
        return String(decoding: self.bytes[start..<self.position], as: UTF8.self)
    }

    /// A quoted-string (RFC 9110 §5.6.4); false (nothing consumed) when there is none or it
    /// does not end.
    mutating func quotedString() -> Bool {
        guard !self.atEnd, self.bytes[self.position] == UInt8(ascii: "\"") else { return false }
        var index = self.position + 1
        while index < self.bytes.count {
            switch self.bytes[index] {
            case UInt8(ascii: "\""):
                self.position = index + 1
                return true
            case UInt8(ascii: "\\"):
                guard index + 1 < self.bytes.count else { return false }
                index += 2
            case 0x00..<0x09, 0x0A..<0x20, 0x7F:
                return false
            default:
                index += 1
            }
        }
        return false
    }

    func rest(from start: Int) -> String {
        String(decoding: self.bytes[start...], as: UTF8.self)
    }
}

/// How the broker frames a message it sends, decided from the head once (RFC 9112 §6), for
/// both directions: requests upstream and responses to clients.
///
/// The head given lists in `Transfer-Encoding` the codings already applied to the body bytes
/// that follow (`gzip`, say); a final `chunked` there is framing, which the broker redoes. A
/// proxy that does not decode a coding must keep it (§6.1): `gzip, chunked` stays so.
package enum OutboundBodyFraming: Sendable, Hashable {
    /// No body follows; the head has neither `Content-Length` nor `Transfer-Encoding`.
    case none
    /// `Content-Length` bytes follow.
    case length
    /// `Transfer-Encoding: chunked` alone: the HTTP encoder writes the chunk framing.
    case chunked
    /// Codings precede `chunked`: the broker writes the chunk framing itself (the encoder frames
    /// only a field that is exactly `chunked`).
    case chunkedAfterCodings

    /// What `prepare` would return when it would leave `headers` as they are; nil when it would
    /// change them. The usual message (a length, or `chunked` alone, or no body) needs no
    /// rewrite, and a rewrite copies the head, so the caller asks this first.
    package static func unchanged(_ headers: HTTPHeaders, mayHaveBody: Bool, bodyWithoutFraming: Bool) -> OutboundBodyFraming? {
        var transferEncodings = 0
        var chunkedAlone = false
        var hasLength = false
        for (name, value) in headers {
            if ProxyHeaders.fieldName(name, is: "content-length") {
                hasLength = true
            } else if ProxyHeaders.fieldName(name, is: "transfer-encoding") {
                transferEncodings += 1
                chunkedAlone = value == "chunked"
            }
        }
        guard mayHaveBody else { return transferEncodings == 0 && !hasLength ? OutboundBodyFraming.none : nil }
        if transferEncodings > 0 { return transferEncodings == 1 && chunkedAlone && !hasLength ? .chunked : nil }
        if hasLength { return .length }
        return bodyWithoutFraming ? nil : OutboundBodyFraming.none
    }

    /// `prepare`, asking `unchanged` first so that the usual head is not copied.
    package static func apply(to headers: inout HTTPHeaders, mayHaveBody: Bool, bodyWithoutFraming: Bool) -> OutboundBodyFraming {
        Self.unchanged(headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming)
            ?? Self.prepare(&headers, mayHaveBody: mayHaveBody, bodyWithoutFraming: bodyWithoutFraming)
    }

    /// Sets `headers`' framing fields and says who frames the body.
    ///
    /// - Parameters:
    ///   - mayHaveBody: false for a 1xx, 204 or 304 response, whose framing fields are removed.
    ///   - bodyWithoutFraming: a body follows even when the head names no length (a response
    ///     of unknown length); false for a request, which without framing fields has no body.
    package static func prepare(_ headers: inout HTTPHeaders, mayHaveBody: Bool, bodyWithoutFraming: Bool) -> OutboundBodyFraming {
        let hasTransferEncoding = headers.contains(name: "transfer-encoding")
        guard mayHaveBody else {
            if hasTransferEncoding { headers.remove(name: "transfer-encoding") }
            headers.remove(name: "content-length")
            return .none
        }
        // A list this broker cannot read names no codings it could keep.
        let codings = hasTransferEncoding ? (((try? TransferCodings(headers)) ?? nil)?.codingsOtherThanChunked ?? []) : []
        if !codings.isEmpty {
            headers.remove(name: "content-length")
            headers.replaceOrAdd(name: "Transfer-Encoding", value: (codings + ["chunked"]).joined(separator: ", "))
            return .chunkedAfterCodings
        }
        if headers.contains(name: "content-length") {
            if hasTransferEncoding { headers.remove(name: "transfer-encoding") }
            return .length
        }
        if hasTransferEncoding || bodyWithoutFraming {
            headers.replaceOrAdd(name: "Transfer-Encoding", value: "chunked")
            return .chunked
        }
        return .none
    }
}

extension NIOHTTPDecoderLimitConfiguration {
    /// A decoder's limits for heads of up to `maxHeadBytes` (`max_response_head_bytes`), enforced
    /// while the head still arrives (an endless header line is never buffered until a timeout),
    /// interim heads included; SwiftNIO's default (80 KiB) would cut a raised setting short.
    package static func heads(upTo maxHeadBytes: Int) -> Self {
        var limits = Self()
        limits.maxHeaderFieldSize = maxHeadBytes
        limits.maxHeaderListSize = maxHeadBytes
        return limits
    }

    /// For a client's requests (`max_request_head_bytes`): as `heads(upTo:)`, but never below
    /// SwiftNIO's own 80 KiB, so that a head a little over the setting is decoded and refused by
    /// the broker's check after the decoder, with its own 431 on a connection still in step.
    package static func requestHeads(upTo maxHeadBytes: Int) -> Self {
        .heads(upTo: max(maxHeadBytes, Self().maxHeaderListSize))
    }
}
