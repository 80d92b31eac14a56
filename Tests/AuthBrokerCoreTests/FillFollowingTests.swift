import AuthBrokerCore
import Foundation
import NIOHTTP1
import Testing

/// Which collapsed misses may be answered from another request's response while it is stored.
struct FillFollowingTests {
    static let received = Date(timeIntervalSince1970: 1_800_000_000)
    static let timing = CachePolicy.Timing(requestTime: received.addingTimeInterval(-1), responseTime: received)

    struct Case: Sendable, CustomTestStringConvertible {
        var method = "GET"
        var request: [(String, String)] = []
        var response: [(String, String)] = [("Cache-Control", "max-age=600")]
        /// The request the response was fetched for (its variant is stored under that one's fields).
        var filler: [(String, String)] = []
        var expected: Bool
        var note: String
        var testDescription: String { self.note }
    }

    static let cases: [Case] = [
        Case(expected: true, note: "a plain GET for a fresh response follows"),
        Case(method: "HEAD", expected: false, note: "HEAD does not follow (only GET fills)"),
        Case(request: [("If-None-Match", "\"v1\"")], expected: false, note: "the app's own conditional request goes to the origin"),
        Case(request: [("Range", "bytes=0-9")], expected: false, note: "a range request goes to the origin"),
        Case(request: [("Authbroker-Cache", "no-store")], expected: false, note: "no-store neither reads nor stores"),
        Case(request: [("Authbroker-Cache", "refresh")], expected: false, note: "refresh asks the origin"),
        Case(request: [("Cache-Control", "no-cache")], expected: false, note: "a request that wants validation does not follow"),
        Case(request: [("Cache-Control", "max-age=0")], expected: false, note: "a request's max-age the response exceeds"),
        Case(response: [("Cache-Control", "no-cache")], expected: false, note: "a response to be validated before each reuse"),
        Case(
            request: [("Accept-Language", "de")], response: [("Cache-Control", "max-age=600"), ("Vary", "Accept-Language")],
            filler: [("Accept-Language", "de")], expected: true, note: "the same variant follows"
        ),
        Case(
            request: [("Accept-Language", "fr")], response: [("Cache-Control", "max-age=600"), ("Vary", "Accept-Language")],
            filler: [("Accept-Language", "de")], expected: false, note: "another variant goes to the origin"
        ),
        Case(
            request: [], response: [("Cache-Control", "max-age=600"), ("Vary", "Accept-Language")], filler: [("Accept-Language", "de")],
            expected: false, note: "a request without the varying field is another variant"
        ),
        Case(response: [("Cache-Control", "max-age=600"), ("Vary", "*")], expected: false, note: "Vary: * never matches"),
    ]

    @Test(arguments: cases)
    func mayFollowFill(_ test: Case) {
        let response = HTTPHeaders(test.response)
        let variantKey = CachePolicy.variantKey(varyingOn: CachePolicy.varyFields(response) ?? [], request: HTTPHeaders(test.filler))
        let follows = CachePolicy.mayFollowFill(
            method: test.method, requestHeaders: HTTPHeaders(test.request), status: 200, responseHeaders: response, variantKey: variantKey,
            timing: Self.timing, now: Self.received.addingTimeInterval(1)
        )
        #expect(follows == test.expected)
    }
}
