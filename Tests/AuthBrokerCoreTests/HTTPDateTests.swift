import AuthBrokerCore
import Foundation
import Testing

/// HTTP dates (RFC 9110 §5.6.7): the three forms, RFC 850's century, calendar checks, formatting.
struct HTTPDateTests {
    /// 2025-01-01T00:00:00Z, so RFC 850 years do not depend on the day the tests run.
    static let now = Date(timeIntervalSince1970: 1_735_689_600)
    /// 1994-11-06T08:49:37Z, RFC 9110's example.
    static let example: TimeInterval = 784_111_777

    @Test(arguments: [
        ("Sun, 06 Nov 1994 08:49:37 GMT", example),
        ("Sunday, 06-Nov-94 08:49:37 GMT", example),
        ("Sun Nov  6 08:49:37 1994", example),
        ("Sun Nov 06 08:49:37 1994", example),
        ("Wed Nov 16 08:49:37 1994", example + 10 * 86_400),
        // Names in any case (RFC 9110's grammar is case-sensitive; recipients may be lenient).
        ("sun, 06 nov 1994 08:49:37 gmt", example),
        ("SUNDAY, 06-NOV-94 08:49:37 GMT", example),
        ("sUN nOV  6 08:49:37 1994", example),
        // Surrounding whitespace.
        (" \t Sun, 06 Nov 1994 08:49:37 GMT \t ", example),
        // The day name is not checked against the date.
        ("Mon, 06 Nov 1994 08:49:37 GMT", example),
        ("Tue, 29 Feb 2000 00:00:00 GMT", 951_782_400),
        ("Sun, 20 Jul 1969 20:17:40 GMT", -14_182_940),
        ("Mon, 01 Jan 1601 00:00:00 GMT", -11_644_473_600),
        ("Fri, 31 Dec 9999 23:59:59 GMT", 253_402_300_799),
        // A leap second is read as :59.
        ("Sat, 31 Dec 2016 23:59:60 GMT", 1_483_228_799),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0),
    ])
    func parses(text: String, seconds: TimeInterval) {
        #expect(HTTPDate.parse(text, now: Self.now) == Date(timeIntervalSince1970: seconds))
    }

    @Test func parsesSubstrings() {
        let field = "Date: Sun, 06 Nov 1994 08:49:37 GMT"
        let value = field.dropFirst("Date:".count)
        #expect(HTTPDate.parse(value, now: Self.now) == Date(timeIntervalSince1970: Self.example))
    }

    /// RFC 850's two-digit year: the year with those digits in the hundred years ending 50 years
    /// after `now`. Expected values are the same instant in IMF-fixdate.
    @Test(arguments: [
        ("Sunday, 06-Nov-94 08:49:37 GMT", "2025-01-01T00:00:00Z", "Sun, 06 Nov 1994 08:49:37 GMT"),
        ("Wednesday, 01-Jan-25 00:00:00 GMT", "2025-01-01T00:00:00Z", "Wed, 01 Jan 2025 00:00:00 GMT"),
        ("Saturday, 01-Jan-00 00:00:00 GMT", "2025-01-01T00:00:00Z", "Sat, 01 Jan 2000 00:00:00 GMT"),
        ("Sunday, 01-Jan-74 00:00:00 GMT", "2025-01-01T00:00:00Z", "Mon, 01 Jan 2074 00:00:00 GMT"),
        // Exactly 50 years ahead is not "more than 50 years in the future"; a second later is.
        ("Tuesday, 01-Jan-75 00:00:00 GMT", "2025-01-01T00:00:00Z", "Tue, 01 Jan 2075 00:00:00 GMT"),
        ("Tuesday, 01-Jan-75 00:00:01 GMT", "2025-01-01T00:00:00Z", "Wed, 01 Jan 1975 00:00:01 GMT"),
        ("Thursday, 01-Jan-76 00:00:00 GMT", "2025-01-01T00:00:00Z", "Thu, 01 Jan 1976 00:00:00 GMT"),
        ("Friday, 31-Dec-99 23:59:59 GMT", "2025-01-01T00:00:00Z", "Fri, 31 Dec 1999 23:59:59 GMT"),
        // Across a century: late in the 2000s, small digits are the next century.
        ("Monday, 01-Jan-20 00:00:00 GMT", "2080-06-15T12:00:00Z", "Mon, 01 Jan 2120 00:00:00 GMT"),
        ("Monday, 01-Jan-31 00:00:00 GMT", "2080-06-15T12:00:00Z", "Mon, 01 Jan 2031 00:00:00 GMT"),
        ("Saturday, 01-Jan-00 00:00:00 GMT", "1999-12-31T23:59:59Z", "Sat, 01 Jan 2000 00:00:00 GMT"),
        ("Friday, 01-Jan-49 00:00:00 GMT", "1999-12-31T23:59:59Z", "Fri, 01 Jan 2049 00:00:00 GMT"),
        ("Friday, 01-Jan-50 00:00:00 GMT", "1999-12-31T23:59:59Z", "Fri, 01 Jan 1950 00:00:00 GMT"),
        // The leap day follows the year chosen: 2000 is a leap year.
        ("Tuesday, 29-Feb-00 00:00:00 GMT", "2025-01-01T00:00:00Z", "Tue, 29 Feb 2000 00:00:00 GMT"),
    ])
    func rfc850Century(text: String, now: String, expected: String) throws {
        let nowDate = try #require(ISO8601DateFormatter().date(from: now))
        let expectedDate = try #require(HTTPDate.parse(expected))
        #expect(HTTPDate.parse(text, now: nowDate) == expectedDate)
    }

    @Test func rfc850LeapDayOfAYearThatIsNot() throws {
        // In 2060 "00" is 2100 (within 50 years ahead), which has no 29 Feb.
        let now = try #require(ISO8601DateFormatter().date(from: "2060-01-01T00:00:00Z"))
        #expect(HTTPDate.parse("Monday, 29-Feb-00 00:00:00 GMT", now: now) == nil)
        #expect(HTTPDate.parse("Monday, 28-Feb-00 00:00:00 GMT", now: now) == HTTPDate.parse("Sun, 28 Feb 2100 00:00:00 GMT"))
    }

    /// Any `now`, however odd, gives a result (RFC 850 is the only form that reads it).
    /// Seconds, not Dates, as arguments: Foundation's Date.description traps on a non-finite
    /// date, and Swift Testing describes each argument.
    @Test(arguments: [
        Date.distantPast.timeIntervalSince1970, Date.distantFuture.timeIntervalSince1970, .infinity, -.infinity, .nan,
        -1e300, 1e300,
    ])
    func oddNow(seconds: TimeInterval) {
        let now = Date(timeIntervalSince1970: seconds)
        _ = HTTPDate.parse("Sunday, 06-Nov-94 08:49:37 GMT", now: now)
        #expect(HTTPDate.parse("Sun, 06 Nov 1994 08:49:37 GMT", now: now) == Date(timeIntervalSince1970: Self.example))
    }

    @Test(arguments: [
        "", " ", "\t \t", "GMT", ",",
        // Calendar: days past the month's end, 29 Feb of common years, zero day and month fields.
        "Wed, 30 Feb 1994 08:49:37 GMT", "Thu, 29 Feb 1900 00:00:00 GMT", "Sat, 31 Apr 1994 08:49:37 GMT",
        "Sun, 00 Nov 1994 08:49:37 GMT", "Sun, 32 Jan 1994 08:49:37 GMT", "Sunday, 31-Jun-94 08:49:37 GMT",
        "Sun Feb 30 08:49:37 1994", "Sun Nov  0 08:49:37 1994",
        // Time of day out of range.
        "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 06 Nov 1994 08:60:00 GMT", "Sun, 06 Nov 1994 08:49:61 GMT",
        "Sun, 06 Nov 1994 99:99:99 GMT",
        // Years out of range.
        "Sun, 31 Dec 1600 23:59:59 GMT", "Sun, 06 Nov 0000 08:49:37 GMT", "Sun Nov  6 08:49:37 1600",
        // Zones and the lack of one.
        "Sun, 06 Nov 1994 08:49:37 PST", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 06 Nov 1994 08:49:37 +0000",
        "Sun, 06 Nov 1994 08:49:37", "Sun, 06 Nov 1994 08:49:37 ", "Sunday, 06-Nov-94 08:49:37",
        "Sun, 06 Nov 1994 08:49:37 GMTX", "Sun, 06 Nov 1994 08:49:37 GM",
        // Extra text.
        "Sun, 06 Nov 1994 08:49:37 GMT extra", "Sun, 06 Nov 1994 08:49:37 GMT,", "Sun Nov  6 08:49:37 1994 GMT",
        "xSun, 06 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 19940 08:49:37 GMT",
        // Field widths and separators.
        "Sun, 6 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 94 08:49:37 GMT", "Sun, 06 Nov 1994 8:49:37 GMT",
        "Sun, 06 Nov 1994 08:49 GMT", "Sun,  06 Nov 1994 08:49:37 GMT", "Sun 06 Nov 1994 08:49:37 GMT",
        "Sun,06 Nov 1994 08:49:37 GMT", "Sun, 06  Nov 1994 08:49:37 GMT", "Sun, 06\tNov 1994 08:49:37 GMT",
        "Sun, 06-Nov-1994 08:49:37 GMT", "Sunday, 06-Nov-1994 08:49:37 GMT", "Sunday, 06 Nov 94 08:49:37 GMT",
        "Sun Nov 6 08:49:37 1994", "Sun Nov   6 08:49:37 1994", "Sun Nov  6 08:49:37 94", "Sun, Nov  6 08:49:37 1994",
        // Names: wrong form for the day name, unknown names, abbreviations that are not three letters.
        "Sunday, 06 Nov 1994 08:49:37 GMT", "Sun, 06-Nov-94 08:49:37 GMT", "Sunday Nov  6 08:49:37 1994",
        "Xyz, 06 Nov 1994 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT", "Sun, 06 November 1994 08:49:37 GMT",
        "Su, 06 Nov 1994 08:49:37 GMT", "Sundae, 06-Nov-94 08:49:37 GMT",
        // Other date formats.
        "1994-11-06T08:49:37Z", "784111777", "Sun, 06 Nov 1994", "08:49:37",
        // Control characters, non-ASCII, line breaks (only SP and HTAB are trimmed).
        "Sun, 06 Nov 1994 08:49:37 GMT\u{0}", "\u{0}Sun, 06 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 1994 08:49:37 GMT\r\n",
        "Sun,\u{7F}06 Nov 1994 08:49:37 GMT", "Sün, 06 Nov 1994 08:49:37 GMT", "Sun, ٠٦ Nov 1994 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 ＧＭＴ", "Sun, 06 Nov 1994 08\u{2236}49:37 GMT",
        // Long input, including a valid date followed by more than the copy limit.
        String(repeating: "Sun, ", count: 100_000), String(repeating: "9", count: 100_000),
        "Sun, 06 Nov 1994 08:49:37 GMT" + String(repeating: " ", count: 50) + "x",
    ])
    func refuses(text: String) {
        #expect(HTTPDate.parse(text, now: Self.now) == nil)
    }

    @Test func longWhitespaceAroundIsTrimmed() {
        let padding = String(repeating: " ", count: 100_000)
        #expect(HTTPDate.parse(padding + "Sun, 06 Nov 1994 08:49:37 GMT" + padding) == Date(timeIntervalSince1970: Self.example))
    }

    @Test(arguments: [
        (example, "Sun, 06 Nov 1994 08:49:37 GMT"),
        (example + 0.999, "Sun, 06 Nov 1994 08:49:37 GMT"),
        (0, "Thu, 01 Jan 1970 00:00:00 GMT"),
        (-0.5, "Wed, 31 Dec 1969 23:59:59 GMT"),
        (951_782_400, "Tue, 29 Feb 2000 00:00:00 GMT"),
        (-14_182_940, "Sun, 20 Jul 1969 20:17:40 GMT"),
        // Clamped to what a four-digit year and `parse` allow.
        (-1e300, "Mon, 01 Jan 1601 00:00:00 GMT"),
        (1e300, "Fri, 31 Dec 9999 23:59:59 GMT"),
        (.infinity, "Fri, 31 Dec 9999 23:59:59 GMT"),
        (-.infinity, "Mon, 01 Jan 1601 00:00:00 GMT"),
        (.nan, "Thu, 01 Jan 1970 00:00:00 GMT"),
    ])
    func formats(seconds: TimeInterval, text: String) {
        #expect(HTTPDate.format(Date(timeIntervalSince1970: seconds)) == text)
    }

    @Test func formatsTheFoundationBounds() {
        #expect(HTTPDate.format(.distantPast) == "Mon, 01 Jan 1601 00:00:00 GMT")
        #expect(HTTPDate.format(.distantFuture) == "Mon, 01 Jan 4001 00:00:00 GMT")
    }

    /// format then parse gives the same whole second, across the whole range; and the weekday
    /// written agrees with Foundation's Gregorian calendar.
    @Test func roundTrip() throws {
        var random = CacheSyntaxRandom(seed: 0xDA7E)
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = try #require(TimeZone(identifier: "UTC"))
        let lower: Int64 = -11_644_473_600
        let upper: Int64 = 253_402_300_799
        let weekdays = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        for index in 0..<5000 {
            // Half over the whole range, half near now, where the real traffic is.
            let range = index.isMultiple(of: 2) ? lower...upper : 0...4_102_444_800
            let seconds = Int64.random(in: range, using: &random)
            let date = Date(timeIntervalSince1970: TimeInterval(seconds))
            let text = HTTPDate.format(date)
            #expect(HTTPDate.parse(text) == date, "\(text)")
            let weekday = weekdays[calendar.component(.weekday, from: date) - 1]
            #expect(text.hasPrefix(weekday + ", "), "\(text)")
        }
    }

    /// Random bytes and mutations of valid dates: every input gives a result, and what parses
    /// formats back to an IMF-fixdate that parses to the same instant.
    @Test func hostileInputs() {
        var random = CacheSyntaxRandom(seed: 0xBAD_DA7E)
        let seeds = ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"]
        let alphabet = Array("0123456789 ,:-GMTSunNovFebday\t\"\u{0}".utf8) + [0xC3, 0xBC, 0xFF]
        for index in 0..<5000 {
            var bytes: [UInt8]
            if index.isMultiple(of: 2) {
                bytes = (0..<Int.random(in: 0...48, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
            } else {
                bytes = Array(seeds[index % 3].utf8)
                for _ in 0..<Int.random(in: 1...3, using: &random) {
                    let position = Int.random(in: 0..<bytes.count, using: &random)
                    switch Int.random(in: 0..<3, using: &random) {
                    case 0: bytes[position] = alphabet.randomElement(using: &random) ?? 0
                    case 1: bytes.remove(at: position)
                    default: bytes.insert(alphabet.randomElement(using: &random) ?? 0, at: position)
                    }
                    if bytes.isEmpty { break }
                }
            }
            let text = String(decoding: bytes, as: UTF8.self)
            if let date = HTTPDate.parse(text, now: Self.now) {
                #expect(HTTPDate.parse(HTTPDate.format(date)) == date, "\(text)")
            }
        }
    }
}
