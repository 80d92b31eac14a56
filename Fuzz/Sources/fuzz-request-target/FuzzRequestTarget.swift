import AuthBrokerCore
import FuzzSupport
import NIOHTTP1

/// Fuzzes what a client's request head steers: the request target (`RequestTarget`,
/// `CanonicalOrigin`), the header rules of the proxy (`ProxyHeaders`) and the `Authbroker-*`
/// directives (`BrokerDirectives`).
///
/// Input: the first line is `METHOD target` (split at the first space), each further line a
/// header field `name: value`.
///
/// Invariants: an accepted absolute target's origin is canonical (parsing its text gives it
/// back, and so does re-parsing the whole target); errors are printable ASCII (safe to log);
/// no `Authbroker-*` or hop-by-hop field is forwarded, `Host` comes first and `Via` last;
/// an interactive wait is 1 to 600 s.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzRequestTarget(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    var lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    guard !lines.isEmpty else { return 0 }
    let requestLine = lines.removeFirst()
    let method: String
    let uri: String
    if let space = requestLine.firstIndex(of: " ") {
        method = String(requestLine[..<space])
        uri = String(requestLine[requestLine.index(after: space)...])
    } else {
        method = "GET"
        uri = requestLine
    }
    var headers = HTTPHeaders()
    for line in lines {
        // NIOHTTP1's parser hands over only token names (RFC 9110 §5.1); `add` traps on others.
        guard let colon = line.firstIndex(of: ":"), isToken(line[..<colon]) else { continue }
        headers.add(name: String(line[..<colon]), value: String(line[line.index(after: colon)...]).trimmingBlanks())
    }

    var origin = try! CanonicalOrigin(scheme: .http, host: "fallback.test", port: nil)  // A valid literal.
    switch RequestTarget.parse(method: method, uri: uri) {
    case .success(.absolute(let parsedOrigin, let pathAndQuery)):
        origin = parsedOrigin
        Fuzz.check((1...65535).contains(origin.port), "port out of range: \(origin.port)")
        Fuzz.check(pathAndQuery.hasPrefix("/"), "path does not start with /: \(pathAndQuery)")
        let reparsed = try? CanonicalOrigin(parsing: origin.description)
        Fuzz.check(reparsed == origin, "the origin's text does not parse back to it: \(origin)")
        let rebuilt = try? CanonicalOrigin(scheme: origin.scheme, host: origin.host, port: origin.port)
        Fuzz.check(rebuilt == origin, "the origin's parts do not validate back to it: \(origin)")
        let again = RequestTarget.parse(method: method, uri: origin.description + pathAndQuery)
        Fuzz.check(again == .success(.absolute(origin: origin, pathAndQuery: pathAndQuery)), "canonical target parses differently: \(origin)\(pathAndQuery)")
    case .success(.control(let path, _)):
        Fuzz.check(path == "/v1" || path.hasPrefix("/v1/"), "control path outside /v1: \(path)")
    case .success(.authority(let host, let port)):
        Fuzz.check((0...65535).contains(port) && !host.isEmpty, "bad authority: \(host):\(port)")
    case .success(.asterisk):
        Fuzz.check(method == "OPTIONS", "asterisk-form for \(method)")
    case .failure(let error):
        Fuzz.check(isLoggable(error.message), "error message is not printable ASCII: \(error.code)")
        Fuzz.check(!error.code.isEmpty, "error without a code")
    }

    let upstream = ProxyHeaders.upstreamRequestHeaders(headers, hostHeader: origin.hostHeader)
    Fuzz.check(upstream.first?.name == "Host" && upstream.first?.value == origin.hostHeader, "Host is not first")
    Fuzz.check(upstream[canonicalForm: "host"].count == 1, "more than one Host")
    Fuzz.check(upstream.last?.name == "Via", "Via is not last")
    let named = connectionOptions(headers)
    for (name, value) in upstream {
        let lower = name.lowercased()
        Fuzz.check(!lower.hasPrefix(ProxyHeaders.directivePrefix), "an Authbroker-* field is forwarded: \(name)")
        Fuzz.check(!hopByHop.contains(lower), "a hop-by-hop field is forwarded: \(name)")
        if lower == "via" {
            // The broker's own entry is always added; the client's entries go when Connection names Via.
            Fuzz.check(!named.contains(lower) || value == ProxyHeaders.via, "a Via named in Connection is forwarded: \(value)")
        } else {
            Fuzz.check(!named.contains(lower) || protected.contains(lower), "a field named in Connection is forwarded: \(name)")
        }
    }
    let toClient = ProxyHeaders.clientResponseHeaders(headers, requestID: "0123456789abcdef")
    Fuzz.check(
        toClient.last?.name == BrokerHeaders.requestID && toClient.last?.value == "0123456789abcdef",
        "the broker's request id is not last in a response"
    )
    Fuzz.check(toClient[canonicalForm: BrokerHeaders.requestID].count == 1, "more than one request id in a response")
    Fuzz.check(toClient.dropLast().last?.name == "Via", "Via is not just before the request id in a response")
    // Transfer-Encoding passes to the client's framer, which keeps the codings and ends with
    // one chunked, never beside a Content-Length.
    var framed = toClient
    let framing = OutboundBodyFraming.prepare(&framed, mayHaveBody: true, bodyWithoutFraming: true)
    let framedCodings = ((try? TransferCodings(framed)) ?? nil)
    Fuzz.check(framing == .length || framedCodings?.isChunked == true, "a response body without framing: \(framing)")
    Fuzz.check(framedCodings == nil || !framed.contains(name: "content-length"), "Transfer-Encoding beside Content-Length")
    // A request's framing is decided once, and agrees with the list.
    if let requestFraming = try? RequestBodyFraming.of(headers) {
        Fuzz.check((requestFraming == .chunked) == ProxyHeaders.isChunked(headers), "framing and isChunked disagree")
    }
    for (name, value) in toClient {
        Fuzz.check(name.lowercased() != "connection", "a hop-by-hop field reaches the client: \(name)")
        Fuzz.check(
            !name.lowercased().hasPrefix("authbroker-") || name == BrokerHeaders.requestID,
            "an upstream Authbroker-* field reaches the client: \(name)"
        )
        if name.lowercased() == "proxy-status" {
            Fuzz.check(
                ProxyStatusField.brokerError(in: value) == nil && !value.isEmpty,
                "an upstream Proxy-Status member naming the broker reaches the client"
            )
        }
    }

    let directives = BrokerDirectives(headers: headers)
    if let wait = directives.interactiveWait {
        Fuzz.check(wait >= .seconds(1) && wait <= .seconds(BrokerDirectives.maxInteractiveSeconds), "interactive wait out of range: \(wait)")
    }
    _ = UpstreamRoute(origin, clientIdentity: directives.identity).description
    return 0
}

private let hopByHop: Set<String> = [
    "connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
]
private let protected: Set<String> = ["content-length", "host"]

/// The field names the `Connection` fields list, lower-cased (an independent reading of RFC 9110 §7.6.1).
private func connectionOptions(_ headers: HTTPHeaders) -> Set<String> {
    Set(headers[canonicalForm: "connection"].map { $0.trimmingBlanks().lowercased() })
}

private func isToken(_ name: Substring) -> Bool {
    !name.isEmpty && name.utf8.allSatisfy { byte in
        (byte >= 0x30 && byte <= 0x39) || (byte | 0x20 >= 0x61 && byte | 0x20 <= 0x7A) || "!#$%&'*+-.^_`|~".utf8.contains(byte)
    }
}

/// Printable ASCII, plus the two non-ASCII characters of the messages' own text (the ellipsis
/// `HostSyntax.text` appends to a shortened input, and "§" of RFC citations): the input itself
/// must arrive escaped.
private func isLoggable(_ text: String) -> Bool {
    text.unicodeScalars.allSatisfy { ($0.value >= 0x20 && $0.value < 0x7F) || $0 == "…" || $0 == "§" }
}

extension StringProtocol {
    fileprivate func trimmingBlanks() -> String {
        var slice = Substring(self)
        while let first = slice.first, first == " " || first == "\t" { slice = slice.dropFirst() }
        while let last = slice.last, last == " " || last == "\t" { slice = slice.dropLast() }
        return String(slice)
    }
}
