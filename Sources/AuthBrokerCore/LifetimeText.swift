/// A lifetime as a user writes one on the command line or in the API: a positive whole number
/// and a unit, `90m`, `12h`, `30d`, `2w` (also `s`, and the units spelled out:
/// `30days`, `12 hours`). Total: every input gives a number of seconds or an `Invalid` that
/// says what to write instead. At most ten years: an exception that should never end needs no expiry.
package enum LifetimeText {
    package static let maximumSeconds: Int64 = 10 * 366 * 86_400

    package struct Invalid: Error, Equatable, Sendable {
        package var message: String
    }

    package static func seconds(_ text: String) throws(Invalid) -> Int64 {
        let trimmed = text.filter { $0 != " " }.lowercased()
        let digits = trimmed.prefix { $0.isASCII && $0.isNumber }
        let unit = trimmed.dropFirst(digits.count)
        let shown = String(text.prefix(40))
        guard !digits.isEmpty, digits.count <= 9, let value = Int64(digits), value > 0 else {
            throw Invalid(
                message: "'\(shown)' is not a lifetime. Write a positive number and a unit: 90m, 12h, 30d or 2w."
            )
        }
        let multiplier: Int64
        switch unit {
        case "s", "sec", "secs", "second", "seconds": multiplier = 1
        case "m", "min", "mins", "minute", "minutes": multiplier = 60
        case "h", "hour", "hours": multiplier = 3_600
        case "d", "day", "days": multiplier = 86_400
        case "w", "week", "weeks": multiplier = 7 * 86_400
        default:
            throw Invalid(
                message: "'\(shown)' has no known unit. Write a positive number and one of s, m, h, d, w: 90m, 12h, 30d or 2w."
            )
        }
        let (seconds, overflow) = value.multipliedReportingOverflow(by: multiplier)
        guard !overflow, seconds <= Self.maximumSeconds else {
            throw Invalid(message: "'\(shown)' is longer than ten years, the longest lifetime accepted.")
        }
        return seconds
    }
}
