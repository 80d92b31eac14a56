import AuthBrokerCore
import Foundation
import NIOHTTP1
import Testing

/// The flow log's pure parts: the bounded ring, masking of secret header values, and the HAR
/// document built from flows.
struct FlowLogTests {
    static func flow(_ url: String = "https://x.test/a?b=1", request: [(String, String)] = [], response: [(String, String)] = []) -> FlowRecord {
        var flow = FlowRecord(
            requestID: "0123456789abcde", started: Date(timeIntervalSince1970: 1_700_000_000.25), method: "GET", url: url,
            httpVersion: "HTTP/1.1", requestHeaders: HTTPHeaders(request)
        )
        flow.status = 200
        flow.responseHeaders = HTTPHeaders(response)
        flow.responseBodyBytes = 5
        flow.totalMicroseconds = 12_500
        flow.waitMicroseconds = 10_000
        return flow
    }

    // MARK: Ring

    @Test func ringKeepsTheLatestInOrder() {
        var ring = FlowRing(capacity: 3, maxHeldBytes: 1 << 20)
        for index in 1...3 { #expect(ring.append(Self.flow("https://x.test/\(index)")) == nil) }
        // Full: each new one pushes the oldest out, and hands it back.
        for index in 4...7 { #expect(ring.append(Self.flow("https://x.test/\(index)"))?.url == "https://x.test/\(index - 3)") }
        #expect(ring.recent().map(\.url) == ["https://x.test/5", "https://x.test/6", "https://x.test/7"])
        #expect(ring.recent().map(\.sequence) == [5, 6, 7])
        #expect(ring.recent(2).map(\.sequence) == [6, 7])
        #expect(ring.recent(0).isEmpty)
        #expect(ring.recent(99).count == 3)
        #expect(ring.lastSequence == 7)
    }

    @Test func ringOfNothingKeepsNothingButStillNumbers() {
        var ring = FlowRing(capacity: 0, maxHeldBytes: 1 << 20)
        #expect(ring.append(Self.flow()) == nil)
        #expect(ring.lastSequence == 1)
        #expect(ring.recent().isEmpty)
    }

    @Test func ringDropsTheOldestPastItsByteBudget() {
        var ring = FlowRing(capacity: 100, maxHeldBytes: 10_000)
        var big = Self.flow("https://x.test/big")
        big.responseBody = CapturedBody(bytes: Array(repeating: 0x41, count: 6_000))
        ring.append(big)
        ring.append(big)
        // Two do not fit: the older went.
        #expect(ring.count == 1)
        for _ in 0..<5 { ring.append(Self.flow()) }
        #expect(ring.count == 6)
        #expect(ring.recent().first?.url == "https://x.test/big")
        // The newest alone over budget is still kept: one flow is always there to see.
        var huge = Self.flow("https://x.test/huge")
        huge.responseBody = CapturedBody(bytes: Array(repeating: 0x41, count: 20_000))
        ring.append(huge)
        #expect(ring.recent().map(\.url) == ["https://x.test/huge"])
    }

    @Test func headersCountOnlyWhereTheyCouldPassTheBudget() {
        #expect(FlowRing(capacity: 500, maxHeldBytes: 64 << 20, maxHeadBytes: 128 << 10).countsHeaders == false)
        #expect(FlowRing(capacity: 5000, maxHeldBytes: 64 << 20, maxHeadBytes: 128 << 10).countsHeaders == true)
        #expect(FlowRing(capacity: 500, maxHeldBytes: 64 << 20).countsHeaders == true)
        #expect(FlowRing(capacity: .max, maxHeldBytes: 64 << 20, maxHeadBytes: 1 << 20).countsHeaders == true)
    }

    @Test func capturedBodyStopsAtItsLimit() {
        var body = CapturedBody()
        body.append(Array("hello ".utf8), limit: 8)
        #expect(!body.truncated)
        body.append(Array("world".utf8), limit: 8)
        #expect(body.bytes == Array("hello wo".utf8))
        #expect(body.truncated)
        body.append(Array("more".utf8), limit: 8)
        #expect(body.bytes.count == 8)
    }

    // MARK: Masking

    @Test(arguments: [
        ("Authorization", "Basic YWxpY2U6c2VjcmV0", "Basic [masked]"),
        ("authorization", "Digest username=\"alice\", response=\"abc\"", "Digest [masked]"),
        ("Proxy-Authorization", "Bearer tok", "Bearer [masked]"),
        ("Authorization", "justatoken", "[masked]"),
        ("Authorization", "", "[masked]"),
        ("Authorization", "   ", "[masked]"),
        ("Authorization", "a=secret; b", "[masked]"),
        ("Cookie", "sid=abc; theme=dark", "sid=[masked]; theme=[masked]"),
        ("Cookie", "novalue; =onlyvalue; a=; ;;", "[masked]; [masked]; a=[masked]"),
        ("Cookie", "", ""),
        ("Set-Cookie", "sid=abc; Path=/; HttpOnly; Secure", "sid=[masked]; Path=/; HttpOnly; Secure"),
        ("Set-Cookie", "=x", "[masked]"),
        ("Set-Cookie", ";;;", "[masked]"),
        ("X-Api-Key", "k-123", "[masked]"),
        ("x-api-key", "k-123", "[masked]"),
        ("Content-Type", "text/plain", "text/plain"),
    ])
    func masking(name: String, value: String, masked: String) {
        let masking = FlowMasking(extraNames: ["X-API-Key"])
        #expect(masking.masked(name: name, value: value) == masked)
    }

    @Test func maskedValuesNeverHoldTheSecret() {
        let masking = FlowMasking()
        let secret = "S3CR3T"
        for value in ["Basic \(secret)", "a=\(secret)", "a=\(secret); b=\(secret)", "\(secret)", "x=1; Path=/; a=\(secret)"] {
            #expect(!masking.masked(name: "Authorization", value: value).contains(secret))
            #expect(!masking.masked(name: "Cookie", value: value).contains(secret))
        }
        // A Set-Cookie keeps its attributes, which carry no secret; the value goes.
        #expect(!masking.masked(name: "Set-Cookie", value: "a=\(secret); Path=/").contains(secret))
    }

    // MARK: HAR

    @Test func harEntryFromAFlow() throws {
        var flow = Self.flow(
            "https://x.test/search?q=a%20b&empty=&flag#frag",
            request: [("Host", "x.test"), ("Cookie", "sid=SECRET1; t=2"), ("Authorization", "Basic SECRET2")],
            response: [("Content-Type", "text/plain"), ("Set-Cookie", "sid=SECRET3; Path=/; Expires=Wed, 21 Oct 2015 07:28:00 GMT; HttpOnly"), ("Location", "/next")]
        )
        flow.app = Requester(pid: 42, uid: 1000, executable: "/usr/bin/curl")
        flow.applied.credentials = [FlowApplied.Credential(user: "alice", realm: "r", scheme: "basic", proxy: false)]
        flow.responseBody = CapturedBody(bytes: Array("hello".utf8))
        flow.requestBody = CapturedBody(bytes: [0xFF, 0x00, 0x01])
        flow.requestBodyBytes = 3
        let data = try HTTPArchive(flows: [flow], masking: FlowMasking(), creatorVersion: "9.9").encoded()
        let text = String(decoding: data, as: UTF8.self)
        for secret in ["SECRET1", "SECRET2", "SECRET3"] { #expect(!text.contains(secret)) }
        let json = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let log = try #require(json["log"] as? [String: Any])
        #expect(log["version"] as? String == "1.2")
        let entry = try #require((log["entries"] as? [[String: Any]])?.first)
        #expect(entry["startedDateTime"] as? String == "2023-11-14T22:13:20.250Z")
        #expect(entry["time"] as? Double == 12.5)
        let timings = try #require(entry["timings"] as? [String: Double])
        #expect(timings == ["send": 0, "wait": 10, "receive": 2.5])
        let request = try #require(entry["request"] as? [String: Any])
        #expect(request["url"] as? String == "https://x.test/search?q=a%20b&empty=&flag")
        let query = try #require(request["queryString"] as? [[String: String]])
        #expect(query == [["name": "q", "value": "a b"], ["name": "empty", "value": ""], ["name": "flag", "value": ""]])
        #expect(request["cookies"] as? [[String: String]] == [["name": "sid", "value": "[masked]"], ["name": "t", "value": "[masked]"]])
        let postData = try #require(request["postData"] as? [String: String])
        #expect(postData["text"] == "/wAB")
        #expect(postData["_encoding"] == "base64")
        let response = try #require(entry["response"] as? [String: Any])
        #expect(response["statusText"] as? String == "OK")
        #expect(response["redirectURL"] as? String == "/next")
        let cookie = try #require((response["cookies"] as? [[String: Any]])?.first)
        #expect(cookie["value"] as? String == "[masked]")
        #expect(cookie["path"] as? String == "/")
        #expect(cookie["expires"] as? String == "2015-10-21T07:28:00.000Z")
        #expect(cookie["httpOnly"] as? Bool == true)
        #expect((response["content"] as? [String: Any])?["text"] as? String == "hello")
        let extra = try #require(entry["_authbroker"] as? [String: Any])
        #expect(extra["masked"] as? Bool == true)
        #expect((extra["app"] as? [String: Any])?["executable"] as? String == "/usr/bin/curl")
        #expect(((extra["applied"] as? [String: Any])?["credentials"] as? [[String: Any]])?.first?["user"] as? String == "alice")

        // Unmasked, for a user who re-authenticated and asked.
        let revealed = String(decoding: try HTTPArchive(flows: [flow], masking: nil, creatorVersion: "9.9").encoded(), as: UTF8.self)
        for secret in ["SECRET1", "SECRET2", "SECRET3"] { #expect(revealed.contains(secret)) }
    }

    @Test func harURLOfAConnectIsAbsolute() throws {
        var flow = Self.flow("git.corp.test:443")
        flow.method = "CONNECT"
        let data = try HTTPArchive(flows: [flow], masking: FlowMasking(), creatorVersion: "1").encoded()
        #expect(String(decoding: data, as: UTF8.self).contains("\"url\" : \"https://git.corp.test:443\""))
    }

    @Test func harOfAFlowWithNoResponse() throws {
        var flow = Self.flow()
        flow.status = 0
        flow.responseBodyBytes = 0
        flow.waitMicroseconds = nil
        flow.brokerError = "client_closed"
        let data = try HTTPArchive(flows: [flow], masking: FlowMasking(), creatorVersion: "1").encoded()
        let json = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        let entry = try #require(((json["log"] as? [String: Any])?["entries"] as? [[String: Any]])?.first)
        let response = try #require(entry["response"] as? [String: Any])
        #expect(response["status"] as? Int == 0)
        #expect(response["statusText"] as? String == "")
        #expect(response["bodySize"] as? Int == -1)
        #expect((entry["timings"] as? [String: Double])?["receive"] == 0)
    }

    @Test(arguments: [
        ("Wed, 21 Oct 2015 07:28:00 GMT", "2015-10-21T07:28:00.000Z"),
        // RFC 850, its two-digit year read by RFC 9110's 50-year rule.
        ("Wednesday, 21-Oct-15 07:28:00 GMT", "2015-10-21T07:28:00.000Z"),
        ("Wed, 21-Oct-1500 07:28:00 GMT", nil),
        ("Wed, 21-Oct-2015 07:28:00 GMT", "2015-10-21T07:28:00.000Z"),
        ("tomorrow", nil), ("", nil), ("Wed, 99 Oct 2015 07:28:00 GMT", nil),
    ] as [(String, String?)])
    func cookieExpiry(text: String, iso: String?) {
        #expect(HTTPArchive.cookieExpiry(text) == iso)
    }

    @Test func summaryRoundTrips() throws {
        var flow = Self.flow()
        flow.sequence = 9
        flow.applied.identity = "laptop"
        flow.applied.rule = "respond config.toml:3"
        let summary = FlowSummary(flow)
        let data = try BrokerJSON.encoder().encode(summary)
        let text = String(decoding: data, as: UTF8.self)
        #expect(text.contains("\"duration_ms\":12.5"))
        #expect(text.contains("\"request_id\":\"0123456789abcde\""))
        #expect(!text.contains("relayed_directly"))
        #expect(try BrokerJSON.decoder().decode(FlowSummary.self, from: data) == summary)
    }
}
