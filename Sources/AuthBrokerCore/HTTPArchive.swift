import Foundation
import NIOHTTP1

/// Flows as an HTTP Archive (HAR 1.2, http://www.softwareishard.com/blog/har-12-spec/), the
/// format browsers' developer tools and HAR viewers read. The broker's own facts about each
/// flow go in the custom `_authbroker` field the format allows.
package struct HTTPArchive: Encodable, Sendable {
    package var log: Log

    /// - Parameters:
    ///   - masking: which header values are masked; nil when the user re-authenticated and asked
    ///     for them as they were.
    package init(flows: [FlowRecord], masking: FlowMasking?, creatorVersion: String) {
        self.log = Log(
            creator: Creator(name: "authbrokerd", version: creatorVersion),
            entries: flows.map { Entry($0, masking: masking) }
        )
    }

    package func encoded() throws -> Data {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        return try encoder.encode(self)
    }

    package struct Log: Encodable, Sendable {
        var version = "1.2"
        var creator: Creator
        var entries: [Entry]
    }

    package struct Creator: Encodable, Sendable {
        var name: String
        var version: String
    }

    package struct NameValue: Encodable, Sendable, Equatable {
        var name: String
        var value: String
    }

    package struct Cookie: Encodable, Sendable, Equatable {
        var name: String
        var value: String
        var path: String?
        var domain: String?
        var expires: String?
        var httpOnly: Bool?
        var secure: Bool?
    }

    package struct Entry: Encodable, Sendable {
        var startedDateTime: String
        /// Milliseconds, the sum of the timings.
        var time: Double
        var request: Request
        var response: Response
        var cache = Cache()
        var timings: Timings
        var authbroker: Extra

        enum CodingKeys: String, CodingKey {
            case startedDateTime, time, request, response, cache, timings
            case authbroker = "_authbroker"
        }

        init(_ flow: FlowRecord, masking: FlowMasking?) {
            self.startedDateTime = HTTPArchive.timestamp(flow.started)
            let total = Double(flow.totalMicroseconds) / 1000
            let wait = flow.waitMicroseconds.map { Double($0) / 1000 } ?? total
            // The broker sees when the head came and when the response began and ended; sending
            // the request upstream is inside `wait`.
            self.timings = Timings(send: 0, wait: max(0, wait), receive: max(0, total - wait))
            self.time = self.timings.send + self.timings.wait + self.timings.receive
            self.request = Request(flow, masking: masking)
            self.response = Response(flow, masking: masking)
            self.authbroker = Extra(
                requestID: flow.requestID, app: flow.app, applied: flow.applied, error: flow.brokerError,
                requestBodyTruncated: flow.requestBody?.truncated == true ? true : nil,
                responseBodyTruncated: flow.responseBody?.truncated == true ? true : nil,
                masked: masking != nil
            )
        }
    }

    package struct Request: Encodable, Sendable {
        var method: String
        var url: String
        var httpVersion: String
        var cookies: [Cookie]
        var headers: [NameValue]
        var queryString: [NameValue]
        var postData: PostData?
        var headersSize = -1
        var bodySize: Int

        init(_ flow: FlowRecord, masking: FlowMasking?) {
            self.method = flow.method
            self.url = HTTPArchive.absoluteURL(of: flow)
            self.httpVersion = flow.httpVersion
            self.headers = HTTPArchive.headers(flow.requestHeaders, masking: masking)
            self.cookies = flow.requestHeaders["cookie"].flatMap { header in
                CookieSyntax.pairs(inCookieHeader: header).map {
                    Cookie(name: $0.name, value: masking == nil ? $0.value : FlowMasking.mask)
                }
            }
            self.queryString = HTTPArchive.queryString(of: flow.url)
            self.bodySize = flow.requestBodyBytes
            if let body = flow.requestBody, flow.requestBodyBytes > 0 {
                let (text, base64) = HTTPArchive.text(of: body.bytes)
                self.postData = PostData(
                    mimeType: flow.requestHeaders.first(name: "content-type") ?? "", text: text, encoding: base64 ? "base64" : nil
                )
            }
        }
    }

    package struct PostData: Encodable, Sendable {
        var mimeType: String
        /// HAR 1.2 has no encoding for postData: a body that is not UTF-8 is given as base64 and
        /// `_encoding` says so.
        var text: String
        var encoding: String?

        enum CodingKeys: String, CodingKey {
            case mimeType, text
            case encoding = "_encoding"
        }
    }

    package struct Response: Encodable, Sendable {
        var status: Int
        var statusText: String
        var httpVersion = "HTTP/1.1"
        var cookies: [Cookie]
        var headers: [NameValue]
        var content: Content
        var redirectURL: String
        var headersSize = -1
        var bodySize: Int

        init(_ flow: FlowRecord, masking: FlowMasking?) {
            self.status = flow.status
            self.statusText = flow.status == 0 ? "" : HTTPResponseStatus(statusCode: flow.status).reasonPhrase
            self.headers = HTTPArchive.headers(flow.responseHeaders, masking: masking)
            self.cookies = flow.responseHeaders["set-cookie"].map { header in
                let cookie = CookieSyntax.setCookie(header)
                return Cookie(
                    name: cookie.name, value: masking == nil ? cookie.value : FlowMasking.mask, path: cookie.attribute("path"),
                    domain: cookie.attribute("domain"), expires: cookie.attribute("expires").flatMap(HTTPArchive.cookieExpiry),
                    httpOnly: cookie.has("httponly") ? true : nil, secure: cookie.has("secure") ? true : nil
                )
            }
            self.redirectURL = flow.responseHeaders.first(name: "location") ?? ""
            // `bodySize` counts the bytes as they went (compressed, if the origin compressed
            // them); the broker does not decode, so `content.size` is the same.
            self.bodySize = flow.status == 0 ? -1 : flow.responseBodyBytes
            self.content = Content(size: flow.responseBodyBytes, mimeType: flow.responseHeaders.first(name: "content-type") ?? "")
            if let body = flow.responseBody {
                let (text, base64) = HTTPArchive.text(of: body.bytes)
                self.content.text = text
                self.content.encoding = base64 ? "base64" : nil
            }
        }
    }

    package struct Content: Encodable, Sendable {
        var size: Int
        var mimeType: String
        var text: String?
        var encoding: String?
    }

    package struct Cache: Encodable, Sendable {}

    package struct Timings: Encodable, Sendable {
        var send: Double
        var wait: Double
        var receive: Double
    }

    /// The broker's own facts about a flow.
    package struct Extra: Encodable, Sendable {
        var requestID: String
        var app: Requester?
        var applied: FlowApplied
        var error: String?
        var requestBodyTruncated: Bool?
        var responseBodyTruncated: Bool?
        /// Whether secret header values were masked in this entry.
        var masked: Bool

        enum CodingKeys: String, CodingKey {
            case app, applied, error, masked
            case requestID = "request_id"
            case requestBodyTruncated = "request_body_truncated"
            case responseBodyTruncated = "response_body_truncated"
        }
    }

    // MARK: Pieces

    static func headers(_ headers: HTTPHeaders, masking: FlowMasking?) -> [NameValue] {
        headers.map { name, value in
            NameValue(name: name, value: masking?.masked(name: name, value: value) ?? value)
        }
    }

    /// HAR's URL: absolute, without a fragment. A CONNECT's `host:port` goes to a TLS server
    /// (the only kind the broker connects to for one), so it is `https://host:port`.
    static func absoluteURL(of flow: FlowRecord) -> String {
        var url = flow.url.prefix { $0 != "#" }
        if flow.method == "CONNECT", !url.contains("://") { url = "https://" + url }
        return String(url)
    }

    /// The query's `name=value` pairs, percent-decoded where they decode (`+` stays: it is a space
    /// only in forms, which HAR's `postData.params` would hold).
    static func queryString(of url: String) -> [NameValue] {
        guard let question = url.firstIndex(of: "?") else { return [] }
        var query = url[url.index(after: question)...]
        if let fragment = query.firstIndex(of: "#") { query = query[..<fragment] }
        return query.split(separator: "&").map { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            let name = String(parts[0])
            let value = parts.count > 1 ? String(parts[1]) : ""
            return NameValue(name: name.removingPercentEncoding ?? name, value: value.removingPercentEncoding ?? value)
        }
    }

    /// A body as HAR text: itself when it is UTF-8, else base64 (and true).
    static func text(of bytes: [UInt8]) -> (text: String, base64: Bool) {
        if let text = String(validating: bytes, as: UTF8.self) { return (text, false) }
        return (Data(bytes).base64EncodedString(), true)
    }

    /// A cookie's `Expires` (an HTTP date, or the Netscape form with dashes, `21-Oct-2015`) in
    /// ISO 8601, as HAR wants it; nil when it is neither.
    package static func cookieExpiry(_ text: String) -> String? {
        (HTTPDate.parse(text) ?? HTTPDate.parse(text.replacingOccurrences(of: "-", with: " "))).map(Self.timestamp)
    }

    /// ISO 8601 with milliseconds, in UTC, as HAR's `startedDateTime` wants.
    package static func timestamp(_ date: Date) -> String {
        date.formatted(Date.ISO8601FormatStyle(includingFractionalSeconds: true, timeZone: .gmt))
    }
}
