import AuthBrokerCore
import Foundation
import NIOHTTP1
import Testing

/// The cache-storage policy against RFC 9111's rules, a table each: what is stored, how fresh
/// it is, how old, when it may be reused, what a 304 changes, what an unsafe method invalidates.
struct CachePolicyTests {
    static let received = Date(timeIntervalSince1970: 1_800_000_000)
    static let timing = CachePolicy.Timing(requestTime: received.addingTimeInterval(-1), responseTime: received)

    static func headers(_ fields: [(String, String)]) -> HTTPHeaders { HTTPHeaders(fields) }
    static func date(_ offset: TimeInterval) -> String { HTTPDate.format(received.addingTimeInterval(offset)) }

    // MARK: Storage (§3)

    struct StorageCase: Sendable, CustomTestStringConvertible {
        var method = "GET"
        var request: [(String, String)] = []
        var credentials = false
        var status = 200
        var response: [(String, String)]
        var settings = CachePolicy.Settings()
        var expected: CachePolicy.StorageDecision
        var note: String
        var testDescription: String { self.note }
    }

    static let storageCases: [StorageCase] = {
        var disabled = CachePolicy.Settings()
        disabled.enabled = false
        var onlyCorp = CachePolicy.Settings()
        onlyCorp.hosts = [try! HostPattern(parsing: "*.corp.test")]  // a literal pattern that parses
        var small = CachePolicy.Settings()
        small.maxObjectBytes = 100
        return [
            StorageCase(response: [("Cache-Control", "max-age=60")], expected: .store(omitting: []), note: "max-age"),
            StorageCase(response: [], expected: .store(omitting: []), note: "200 without directives: heuristically cacheable"),
            StorageCase(status: 302, response: [], expected: .dontStore(.notCacheable), note: "302 without directives"),
            StorageCase(status: 302, response: [("Cache-Control", "max-age=60")], expected: .store(omitting: []), note: "302 with max-age"),
            StorageCase(status: 302, response: [("Expires", Self.date(60))], expected: .store(omitting: []), note: "302 with Expires"),
            StorageCase(status: 500, response: [("Cache-Control", "public")], expected: .store(omitting: []), note: "public allows a heuristic"),
            StorageCase(status: 404, response: [], expected: .store(omitting: []), note: "404 is heuristically cacheable"),
            StorageCase(method: "POST", response: [("Cache-Control", "max-age=60")], expected: .dontStore(.methodNotCached), note: "POST"),
            StorageCase(method: "HEAD", response: [("Cache-Control", "max-age=60")], expected: .dontStore(.methodNotCached), note: "HEAD"),
            StorageCase(status: 206, response: [("Cache-Control", "max-age=60")], expected: .dontStore(.statusNotStored), note: "206"),
            StorageCase(status: 304, response: [("Cache-Control", "max-age=60")], expected: .dontStore(.statusNotStored), note: "304"),
            StorageCase(status: 103, response: [], expected: .dontStore(.statusNotStored), note: "1xx"),
            StorageCase(status: 401, response: [("Cache-Control", "max-age=3600")], expected: .dontStore(.statusNotStored), note: "401"),
            StorageCase(
                status: 407, response: [("Cache-Control", "public, max-age=3600")], expected: .dontStore(.statusNotStored), note: "407"
            ),
            StorageCase(request: [("Cache-Control", "no-store")], response: [("Cache-Control", "max-age=60")], expected: .dontStore(.requestNoStore), note: "request no-store"),
            StorageCase(response: [("Cache-Control", "max-age=60, no-store")], expected: .dontStore(.responseNoStore), note: "response no-store"),
            StorageCase(response: [("Cache-Control", "NO-STORE")], expected: .dontStore(.responseNoStore), note: "directive names are case-insensitive"),
            StorageCase(response: [("Cache-Control", "must-understand, no-store, max-age=60")], expected: .store(omitting: []), note: "must-understand on a known status outranks no-store"),
            StorageCase(status: 299, response: [("Cache-Control", "must-understand, no-store, max-age=60")], expected: .dontStore(.notUnderstood), note: "must-understand on an unknown status"),
            StorageCase(
                response: [("Cache-Control", "max-age=60"), ("Transfer-Encoding", "gzip, chunked")], expected: .dontStore(.transferCoded),
                note: "a transfer coding the broker does not undo"
            ),
            StorageCase(
                response: [("Cache-Control", "max-age=60"), ("Transfer-Encoding", "chunked")], expected: .store(omitting: ["transfer-encoding"]),
                note: "chunked alone: undone, the field dropped"
            ),
            StorageCase(response: [("Cache-Control", "max-age=60"), ("Vary", "Accept, *")], expected: .dontStore(.varyAll), note: "Vary: *"),
            StorageCase(response: [("Cache-Control", "max-age=60"), ("Vary", "Accept-Encoding")], expected: .store(omitting: []), note: "Vary on a field"),
            StorageCase(
                request: [("Cookie", "sid=secret")], response: [("Cache-Control", "public, max-age=60"), ("Vary", "Accept, cookie")],
                expected: .dontStore(.variesOnCredential), note: "Vary on a cookie the request carried: its value would be kept on disk"
            ),
            StorageCase(
                request: [("Authorization", "Basic c2VjcmV0")], credentials: true,
                response: [("Cache-Control", "public, max-age=60"), ("Vary", "Authorization")],
                expected: .dontStore(.variesOnCredential), note: "Vary on the request's Authorization"
            ),
            StorageCase(
                response: [("Cache-Control", "max-age=60"), ("Vary", "Cookie")], expected: .store(omitting: []),
                note: "Vary on a cookie the request did not carry"
            ),
            StorageCase(credentials: true, response: [("Cache-Control", "max-age=60")], expected: .dontStore(.authorized), note: "credentials, max-age only"),
            StorageCase(credentials: true, response: [("Cache-Control", "private, max-age=60")], expected: .dontStore(.authorized), note: "credentials, private (one app's)"),
            StorageCase(credentials: true, response: [("Cache-Control", "public, max-age=60")], expected: .store(omitting: []), note: "credentials, public"),
            StorageCase(credentials: true, response: [("Cache-Control", "s-maxage=60")], expected: .store(omitting: []), note: "credentials, s-maxage"),
            StorageCase(credentials: true, response: [("Cache-Control", "must-revalidate, max-age=0")], expected: .store(omitting: []), note: "credentials, must-revalidate"),
            StorageCase(response: [("Cache-Control", "max-age=60"), ("Content-Length", "101")], settings: small, expected: .dontStore(.tooLarge), note: "too large"),
            StorageCase(response: [("Cache-Control", "max-age=60"), ("Content-Length", "100")], settings: small, expected: .store(omitting: []), note: "just fits"),
            StorageCase(response: [("Cache-Control", "max-age=60")], settings: disabled, expected: .dontStore(.cacheDisabled), note: "disabled"),
            StorageCase(response: [("Cache-Control", "max-age=60")], settings: onlyCorp, expected: .dontStore(.hostNotCached), note: "host not listed"),
            StorageCase(
                response: [("Cache-Control", "max-age=60"), ("Connection", "X-Trace, close"), ("X-Trace", "1"), ("Keep-Alive", "timeout=5")],
                expected: .store(omitting: ["connection", "keep-alive", "x-trace"]), note: "hop-by-hop fields and those Connection names"
            ),
            StorageCase(
                response: [("Cache-Control", "private=\"Set-Cookie\", max-age=60"), ("Set-Cookie", "sid=1")],
                expected: .store(omitting: ["set-cookie"]), note: "a qualified private drops its fields"
            ),
            StorageCase(
                response: [("Cache-Control", "max-age=60"), ("Set-Cookie", "sid=1")],
                expected: .store(omitting: ["set-cookie"]), note: "a cookie set for one app is never served to another"
            ),
        ]
    }()

    @Test(arguments: Self.storageCases)
    func storage(_ test: StorageCase) {
        let decision = CachePolicy.storage(
            method: test.method, host: "www.example.test", requestHeaders: Self.headers(test.request),
            requestCarriedCredentials: test.credentials, status: test.status, responseHeaders: Self.headers(test.response),
            settings: test.settings
        )
        #expect(decision == test.expected)
    }

    @Test func storedHeadersLeaveOutWhatThePolicySays() {
        let stored = CachePolicy.storedHeaders(
            Self.headers([("Content-Type", "text/plain"), ("Connection", "close"), ("Set-Cookie", "a=1")]), omitting: ["connection", "set-cookie"]
        )
        #expect(stored.map(\.name) == ["Content-Type"])
    }

    // MARK: Freshness and age (§4.2)

    @Test(arguments: [
        ([("Cache-Control", "max-age=60")], 200, 60, false),
        ([("Cache-Control", "max-age=60, s-maxage=5")], 200, 60, false),
        ([("Cache-Control", "max-age=abc")], 200, 0, false),
        ([("Cache-Control", "max-age=60"), ("Cache-Control", "max-age=120")], 200, 0, false),
        ([("Cache-Control", "max-age=60, \"garbled")], 200, 0, false),
        ([("Cache-Control", "max-age=60"), ("Expires", Self.date(3600)), ("Date", Self.date(0))], 200, 60, false),
        ([("Expires", Self.date(100)), ("Date", Self.date(0))], 200, 100, false),
        ([("Expires", Self.date(100)), ("Date", Self.date(-50))], 200, 150, false),
        ([("Expires", Self.date(100))], 200, 100, false),
        ([("Expires", "0"), ("Last-Modified", Self.date(-864_000))], 200, 0, false),
        ([("Expires", Self.date(-10)), ("Date", Self.date(0))], 200, 0, false),
        ([("Last-Modified", Self.date(-432_000)), ("Date", Self.date(0))], 200, 43_200, true),
        ([("Last-Modified", Self.date(-86_400_000)), ("Date", Self.date(0))], 200, 86_400, true),
        ([("Last-Modified", Self.date(-432_000))], 302, 0, true),
        ([("Last-Modified", Self.date(-432_000)), ("Cache-Control", "public")], 302, 43_200, true),
        ([], 200, 0, true),
    ] as [([(String, String)], Int, Int, Bool)])
    func freshnessLifetime(fields: [(String, String)], status: Int, seconds: Int, heuristic: Bool) {
        let lifetime = CachePolicy.freshnessLifetime(status: status, headers: Self.headers(fields), timing: Self.timing)
        #expect(lifetime.seconds == seconds)
        #expect(lifetime.heuristic == heuristic)
    }

    @Test(arguments: [
        // Date 10 s before arrival; the request took 1 s; 30 s in the cache.
        ([("Date", Self.date(-10))], 30.0, 40),
        // An Age larger than the apparent age wins, plus the response delay.
        ([("Date", Self.date(-10)), ("Age", "100")], 30.0, 131),
        // A Date from the future is no negative age.
        ([("Date", Self.date(500))], 0.0, 1),
        ([("Age", "garbage")], 5.0, 6),
        ([("Age", "-40")], 5.0, 6),
        // Hostile ages saturate at 2^31 (§1.2.2) instead of overflowing the sums.
        ([("Age", "9223372036854775807")], 30.0, 2_147_483_648),
        ([("Age", "99999999999999999999999999999999")], 0.0, 2_147_483_648),
        ([("Age", "2147483647")], 30.0, 2_147_483_648),
        ([("Age", " 100 ")], 0.0, 101),
        ([("Age", "1e9")], 0.0, 1),
    ] as [([(String, String)], TimeInterval, Int)])
    func currentAge(fields: [(String, String)], resident: TimeInterval, age: Int) {
        let now = Self.received.addingTimeInterval(resident)
        #expect(CachePolicy.currentAge(headers: Self.headers(fields), timing: Self.timing, now: now) == age)
    }

    @Test("an origin's Age of Int.max makes the stored response stale, and never traps on reuse")
    func hostileAgeIsStale() {
        let stored: HTTPHeaders = ["Cache-Control": "max-age=60", "Age": "9223372036854775807", "ETag": "\"v1\""]
        let reuse = CachePolicy.reuse(
            requestHeaders: [:], status: 200, storedHeaders: stored, timing: Self.timing, now: Self.received.addingTimeInterval(1e12)
        )
        #expect(reuse == .validate([.init(name: "If-None-Match", value: "\"v1\"")]))
    }

    // MARK: Reuse (§4)

    static let validated: [CachePolicy.ConditionalField] = [
        .init(name: "If-None-Match", value: "\"v1\""), .init(name: "If-Modified-Since", value: Self.date(-3600)),
    ]

    @Test(arguments: [
        ([], [("Cache-Control", "max-age=60")], 10.0, CachePolicy.Reuse.fresh(age: 11)),
        ([], [("Cache-Control", "max-age=60")], 100.0, .validate(Self.validated)),
        ([("Cache-Control", "max-age=5")], [("Cache-Control", "max-age=60")], 10.0, .validate(Self.validated)),
        ([("Cache-Control", "min-fresh=55")], [("Cache-Control", "max-age=60")], 10.0, .validate(Self.validated)),
        ([("Cache-Control", "min-fresh=40")], [("Cache-Control", "max-age=60")], 10.0, .fresh(age: 11)),
        ([("Cache-Control", "max-stale")], [("Cache-Control", "max-age=60")], 100.0, .staleAllowed(age: 101)),
        ([("Cache-Control", "max-stale=30")], [("Cache-Control", "max-age=60")], 100.0, .validate(Self.validated)),
        ([("Cache-Control", "max-stale=50")], [("Cache-Control", "max-age=60")], 100.0, .staleAllowed(age: 101)),
        ([("Cache-Control", "max-stale")], [("Cache-Control", "max-age=60, must-revalidate")], 100.0, .validate(Self.validated)),
        ([], [("Cache-Control", "max-age=60, no-cache")], 1.0, .validate(Self.validated)),
        ([("Cache-Control", "no-cache")], [("Cache-Control", "max-age=60")], 1.0, .validate(Self.validated)),
        ([("Pragma", "no-cache")], [("Cache-Control", "max-age=60")], 1.0, .validate(Self.validated)),
        ([("Pragma", "no-cache"), ("Cache-Control", "max-age=600")], [("Cache-Control", "max-age=60")], 1.0, .fresh(age: 2)),
    ] as [([(String, String)], [(String, String)], TimeInterval, CachePolicy.Reuse)])
    func reuse(request: [(String, String)], stored: [(String, String)], resident: TimeInterval, expected: CachePolicy.Reuse) {
        let storedHeaders = Self.headers(stored + [("ETag", "\"v1\""), ("Last-Modified", Self.date(-3600)), ("Date", Self.date(0))])
        let reuse = CachePolicy.reuse(
            requestHeaders: Self.headers(request), status: 200, storedHeaders: storedHeaders, timing: Self.timing,
            now: Self.received.addingTimeInterval(resident)
        )
        #expect(reuse == expected)
    }

    @Test func withoutValidatorsAStaleResponseIsFetchedAgainPlainly() {
        let reuse = CachePolicy.reuse(
            requestHeaders: [:], status: 200, storedHeaders: Self.headers([("Cache-Control", "max-age=1")]), timing: Self.timing,
            now: Self.received.addingTimeInterval(10)
        )
        #expect(reuse == .validate([]))
    }

    struct StaleCase: Sendable, CustomTestStringConvertible {
        var occasion: CachePolicy.StaleOccasion
        var stored: [(String, String)]
        var request: [(String, String)] = []
        /// Seconds since the response arrived.
        var after: TimeInterval = 100
        var expected: Bool
        var note: String
        var testDescription: String { self.note }
    }

    /// Each stored response is fresh for 60 s; 100 s after it arrived it is 101 s old (a second in
    /// transit), so 41 s stale.
    static let staleCases: [StaleCase] = [
        StaleCase(occasion: .disconnected, stored: [("Cache-Control", "max-age=60")], expected: true, note: "disconnected: any staleness"),
        StaleCase(
            occasion: .disconnected, stored: [("Cache-Control", "max-age=60, must-revalidate")], expected: false,
            note: "disconnected, must-revalidate"
        ),
        StaleCase(occasion: .disconnected, stored: [("Cache-Control", "no-cache")], expected: false, note: "disconnected, no-cache"),
        StaleCase(
            occasion: .disconnected, stored: [("Cache-Control", "max-age=60, proxy-revalidate")], expected: true,
            note: "proxy-revalidate binds shared caches only"
        ),
        StaleCase(
            occasion: .originAnswered(status: 503), stored: [("Cache-Control", "max-age=60")], expected: false,
            note: "an error without stale-if-error goes to the client"
        ),
        StaleCase(
            occasion: .originAnswered(status: 503), stored: [("Cache-Control", "max-age=60, stale-if-error=41")], expected: true,
            note: "stale-if-error in the response, within it"
        ),
        StaleCase(
            occasion: .originAnswered(status: 500), stored: [("Cache-Control", "max-age=60, stale-if-error=40")], expected: false,
            note: "stale-if-error in the response, staler than it"
        ),
        StaleCase(
            occasion: .originAnswered(status: 502), stored: [("Cache-Control", "max-age=60")], request: [("Cache-Control", "stale-if-error=300")],
            expected: true, note: "stale-if-error in the request"
        ),
        StaleCase(
            occasion: .originAnswered(status: 504), stored: [("Cache-Control", "max-age=60")], request: [("Cache-Control", "stale-if-error=10")],
            expected: false, note: "stale-if-error in the request, staler than it"
        ),
        StaleCase(
            occasion: .originAnswered(status: 503), stored: [("Cache-Control", "max-age=60, stale-if-error")], expected: false,
            note: "stale-if-error without a value permits nothing"
        ),
        StaleCase(
            occasion: .originAnswered(status: 503), stored: [("Cache-Control", "max-age=60, must-revalidate, stale-if-error=600")],
            expected: false, note: "must-revalidate outranks stale-if-error"
        ),
        StaleCase(
            occasion: .originAnswered(status: 503), stored: [("Cache-Control", "no-cache, stale-if-error=600")], expected: false,
            note: "no-cache outranks stale-if-error"
        ),
        StaleCase(
            occasion: .originAnswered(status: 501), stored: [("Cache-Control", "max-age=60, stale-if-error=600")], expected: false,
            note: "501 is not an error RFC 5861 covers"
        ),
        StaleCase(
            occasion: .originAnswered(status: 404), stored: [("Cache-Control", "max-age=60, stale-if-error=600")], expected: false,
            note: "a 4xx is the origin's answer"
        ),
        StaleCase(
            occasion: .originAnswered(status: 503), stored: [("Cache-Control", "max-age=600")], request: [("Cache-Control", "no-cache, stale-if-error=0")],
            expected: true, note: "still fresh (the client asked to validate): within any window"
        ),
    ]

    @Test(arguments: staleCases)
    func whenAStaleResponseMayAnswer(_ example: StaleCase) {
        let served = CachePolicy.mayServeStale(
            example.occasion, storedStatus: 200, storedHeaders: Self.headers(example.stored), timing: Self.timing,
            requestHeaders: Self.headers(example.request), now: Self.received.addingTimeInterval(example.after)
        )
        #expect(served == example.expected)
    }

    // MARK: Vary (§4.1)

    @Test func variantsByTheFieldsTheResponseVariesOn() {
        #expect(CachePolicy.varyFields(Self.headers([("Vary", "Accept-Encoding, accept-language"), ("Vary", "Accept-Encoding")])) == ["accept-encoding", "accept-language"])
        #expect(CachePolicy.varyFields(Self.headers([])) == [])
        #expect(CachePolicy.varyFields(Self.headers([("Vary", " , ")])) == [])
        #expect(CachePolicy.varyFields(Self.headers([("Vary", "*")])) == nil)
        let fields = ["accept-encoding"]
        let gzip = CachePolicy.variantKey(varyingOn: fields, request: Self.headers([("Accept-Encoding", "gzip,  br")]))
        #expect(gzip == CachePolicy.variantKey(varyingOn: fields, request: Self.headers([("accept-encoding", "gzip"), ("Accept-Encoding", "br")])))
        #expect(gzip != CachePolicy.variantKey(varyingOn: fields, request: Self.headers([("Accept-Encoding", "br, gzip")])))
        #expect(gzip != CachePolicy.variantKey(varyingOn: fields, request: Self.headers([])))
        #expect(CachePolicy.variantKey(varyingOn: [], request: Self.headers([("Accept", "x")])) == "")
    }

    // MARK: Validation answers (§4.3)

    @Test func aNotModifiedSelectsByStrongTagThenByDate() {
        let stored = Self.headers([("ETag", "\"v1\""), ("Last-Modified", Self.date(-3600))])
        #expect(CachePolicy.notModifiedSelects(storedHeaders: stored, notModified: Self.headers([("ETag", "\"v1\"")])))
        #expect(!CachePolicy.notModifiedSelects(storedHeaders: stored, notModified: Self.headers([("ETag", "\"v2\"")])))
        #expect(CachePolicy.notModifiedSelects(storedHeaders: stored, notModified: Self.headers([("ETag", "W/\"v1\""), ("Last-Modified", Self.date(-3600))])))
        #expect(!CachePolicy.notModifiedSelects(storedHeaders: stored, notModified: Self.headers([("Last-Modified", Self.date(-10))])))
        #expect(CachePolicy.notModifiedSelects(storedHeaders: stored, notModified: Self.headers([("Date", Self.date(0))])))
        // A weak tag is compared weakly, and must match too: the date alone does not select.
        #expect(!CachePolicy.notModifiedSelects(storedHeaders: stored, notModified: Self.headers([("ETag", "W/\"v2\""), ("Last-Modified", Self.date(-3600))])))
        #expect(CachePolicy.notModifiedSelects(storedHeaders: Self.headers([("ETag", "W/\"v1\"")]), notModified: Self.headers([("ETag", "W/\"v1\"")])))
        // A strong tag never selects a weak one (the strong comparison).
        #expect(!CachePolicy.notModifiedSelects(storedHeaders: Self.headers([("ETag", "W/\"v1\"")]), notModified: Self.headers([("ETag", "\"v1\"")])))
        #expect(!CachePolicy.notModifiedSelects(storedHeaders: Self.headers([]), notModified: Self.headers([("ETag", "\"v1\"")])))
    }

    struct ValidationCase: Sendable, CustomTestStringConvertible {
        var status: Int
        var response: [(String, String)]
        /// The stored response the cache validated; nil: the request's conditions were the client's.
        var validated: [(String, String)]?
        var expected: CachePolicy.ValidationAnswer
        var note: String
        var testDescription: String { self.note }
    }

    static let validationCases: [ValidationCase] = [
        ValidationCase(
            status: 304, response: [("ETag", "\"v1\"")], validated: [("ETag", "\"v1\"")], expected: .serveStored,
            note: "the cache's validation, a 304 naming the stored tag"
        ),
        ValidationCase(
            status: 304, response: [("ETag", "\"v2\"")], validated: [("ETag", "\"v1\"")], expected: .repeatUnconditionally,
            note: "the cache's validation, a 304 naming another tag: never to the client"
        ),
        ValidationCase(
            status: 304, response: [("Last-Modified", date(-10))], validated: [("Last-Modified", date(-3600))],
            expected: .repeatUnconditionally, note: "the cache's validation, a 304 with another date"
        ),
        ValidationCase(
            status: 304, response: [("ETag", "\"v2\"")], validated: nil, expected: .forward,
            note: "the client's own conditional request: its 304, whatever it names"
        ),
        ValidationCase(
            status: 200, response: [("ETag", "\"v2\"")], validated: [("ETag", "\"v1\"")], expected: .forward,
            note: "a full response to the cache's validation goes on"
        ),
        ValidationCase(status: 200, response: [], validated: nil, expected: .forward, note: "no validation at all"),
    ]

    @Test(arguments: validationCases)
    func answersToTheCachesValidation(_ example: ValidationCase) {
        let answer = CachePolicy.validationAnswer(
            status: example.status, headers: Self.headers(example.response), validated: example.validated.map { Self.headers($0) }
        )
        #expect(answer == example.expected)
    }

    @Test func aNotModifiedUpdatesTheStoredFieldsButNotTheLength() {
        let stored = Self.headers([
            ("Content-Type", "text/plain"), ("Cache-Control", "max-age=60"), ("Content-Length", "5"), ("ETag", "\"x\""), ("X-Old", "1"),
        ])
        let notModified = Self.headers([
            ("Cache-Control", "max-age=120"), ("Content-Length", "0"), ("Connection", "close, X-Hop"), ("X-Hop", "h"), ("Date", Self.date(0)),
        ])
        let updated = CachePolicy.updatedHeaders(stored: stored, from: notModified)
        #expect(updated.map { "\($0.name): \($0.value)" } == [
            "Content-Type: text/plain", "Content-Length: 5", "ETag: \"x\"", "X-Old: 1", "Cache-Control: max-age=120", "Date: \(Self.date(0))",
        ])
    }

    @Test func whatAnUpdateKeepsLeavesOutTheCookieAndPrivateFields() {
        let stored = Self.headers([("Content-Type", "text/plain"), ("Cache-Control", "max-age=60"), ("X-Token", "old")])
        let notModified = Self.headers([
            ("Cache-Control", "max-age=120, private=\"X-Token\""), ("Set-Cookie", "session=app-a"), ("X-Token", "new"), ("X-New", "1"),
        ])
        // The app that asked sees all of it...
        #expect(CachePolicy.updatedHeaders(stored: stored, from: notModified).contains(name: "set-cookie"))
        // ...the entry keeps neither its cookie nor the fields it made private.
        let kept = CachePolicy.updatedStoredHeaders(stored: stored, from: notModified)
        #expect(kept.map { "\($0.name): \($0.value)" } == [
            "Content-Type: text/plain", "Cache-Control: max-age=120, private=\"X-Token\"", "X-New: 1",
        ])
        // A field the response's Connection names was for that message alone: the stored one stays.
        let hopByHop = Self.headers([("Connection", "ETag"), ("ETag", "\"hop\""), ("X-New", "2")])
        let withTag = Self.headers([("ETag", "\"a\""), ("Content-Type", "text/plain")])
        #expect(CachePolicy.updatedStoredHeaders(stored: withTag, from: hopByHop).map { "\($0.name): \($0.value)" } == [
            "ETag: \"a\"", "Content-Type: text/plain", "X-New: 2",
        ])
    }

    struct HeadCase: Sendable, CustomTestStringConvertible {
        var status = 200
        var mayKeep = true
        var response: [(String, String)]
        var expected: CachePolicy.HeadResponseEffect
        var note: String
        var testDescription: String { self.note }
    }

    /// Against a stored GET with `ETag: "a"`, a `Last-Modified` and a 5-byte body.
    static let headCases: [HeadCase] = [
        HeadCase(response: [("ETag", "\"a\""), ("Content-Length", "5")], expected: .update, note: "same tag and length"),
        HeadCase(response: [("Last-Modified", date(-3600))], expected: .update, note: "same date, no length"),
        HeadCase(
            response: [("ETag", "\"a\""), ("Last-Modified", date(-3600)), ("Content-Length", " 5")], expected: .update,
            note: "every validator the same"
        ),
        HeadCase(response: [("ETag", "\"b\""), ("Content-Length", "5")], expected: .invalidate, note: "another tag"),
        HeadCase(response: [("ETag", "W/\"a\"")], expected: .invalidate, note: "a weak tag is not the stored strong one"),
        HeadCase(response: [("ETag", "\"a\""), ("Last-Modified", date(-10))], expected: .invalidate, note: "same tag, another date"),
        HeadCase(response: [("ETag", "\"a\""), ("Content-Length", "6")], expected: .invalidate, note: "same tag, another length"),
        HeadCase(response: [("Last-Modified", "yesterday")], expected: .invalidate, note: "a date that does not parse"),
        HeadCase(response: [("Content-Length", "5")], expected: .invalidate, note: "no validator: nothing ties it to the stored body"),
        HeadCase(
            mayKeep: false, response: [("ETag", "\"a\"")], expected: .none,
            note: "a response the cache may not keep (no-store, credentials): nothing of it is kept"
        ),
        HeadCase(
            mayKeep: false, response: [("ETag", "\"b\"")], expected: .invalidate,
            note: "a response the cache may not keep still lets a changed resource's entry go"
        ),
        HeadCase(status: 404, response: [("ETag", "\"b\"")], expected: .none, note: "not a 200"),
        HeadCase(status: 304, response: [("ETag", "\"a\"")], expected: .none, note: "a 304 is the validation's (§4.3.4), not this"),
    ]

    @Test(arguments: headCases)
    func aHeadResponseUpdatesOrInvalidatesTheStoredGet(_ example: HeadCase) {
        let stored = Self.headers([("ETag", "\"a\""), ("Last-Modified", Self.date(-3600)), ("Cache-Control", "max-age=60")])
        let effect = CachePolicy.headResponseEffect(
            status: example.status, headers: Self.headers(example.response), storedHeaders: stored, storedBodyLength: 5,
            mayKeep: example.mayKeep
        )
        #expect(effect == example.expected)
    }

    // MARK: Invalidation (§4.4)

    @Test func unsafeMethodsInvalidateTheTargetAndWhatTheyPointAtOnTheSameOrigin() throws {
        let origin = try CanonicalOrigin(scheme: .https, host: "api.test", port: 443)
        let created = CachePolicy.invalidatedURLs(
            method: "POST", status: 201, origin: origin, pathAndQuery: "/items",
            responseHeaders: Self.headers([("Location", "/items/7"), ("Content-Location", "https://api.test/items/7?v=1")])
        )
        #expect(created == ["https://api.test/items", "https://api.test/items/7", "https://api.test/items/7?v=1"])
        let elsewhere = CachePolicy.invalidatedURLs(
            method: "PUT", status: 204, origin: origin, pathAndQuery: "/a",
            responseHeaders: Self.headers([("Location", "https://other.test/a"), ("Content-Location", "relative/b")])
        )
        #expect(elsewhere == ["https://api.test/a"])
        #expect(CachePolicy.invalidatedURLs(method: "GET", status: 200, origin: origin, pathAndQuery: "/a", responseHeaders: [:]).isEmpty)
        #expect(CachePolicy.invalidatedURLs(method: "DELETE", status: 500, origin: origin, pathAndQuery: "/a", responseHeaders: [:]).isEmpty)
        #expect(CachePolicy.invalidatedURLs(method: "DELETE", status: 404, origin: origin, pathAndQuery: "/a", responseHeaders: [:]).isEmpty)
        #expect(CachePolicy.invalidatedURLs(method: "PATCH", status: 302, origin: origin, pathAndQuery: "/a", responseHeaders: [:]) == ["https://api.test/a"])
    }
}
