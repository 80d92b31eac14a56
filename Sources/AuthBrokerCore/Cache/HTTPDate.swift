import Foundation

/// HTTP's timestamps (RFC 9110 §5.6.7), read and written byte by byte.
///
/// Not DateFormatter: it is slow, depends on locale data, and accepts what the grammar does not.
/// The instant is computed with proleptic Gregorian arithmetic in UTC (the only zone HTTP dates
/// use), not Calendar, so the result depends on nothing but the input (and `now`, for RFC 850).
package enum HTTPDate {
    /// RFC 9110 §5.6.7: IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"), and the obsolete RFC 850
    /// ("Sunday, 06-Nov-94 08:49:37 GMT", two-digit year: RFC 9110 says a year more than 50 years
    /// in the future is taken as the most recent past year with those digits) and asctime
    /// ("Sun Nov  6 08:49:37 1994") forms. nil for anything else (invalid dates like 31 Feb too).
    ///
    /// Leniency, as §5.6.7 lets recipients be: day names, month names and "GMT" are matched
    /// case-insensitively (the grammar is case-sensitive), and whitespace (SP, HTAB) before and
    /// after the value is ignored. Within the value the grammar is exact: single spaces, two-digit
    /// day, hour, minute, second. The day name must be one, but it is not checked against the date
    /// (the date fields say which instant is meant). A leap second (:60) is read as :59. Years
    /// outside 1601...9999 give nil.
    ///
    /// RFC 850's two-digit year is taken as the year with those digits in the hundred years that
    /// end 50 years after `now`: one that would be more than 50 years ahead is a century earlier.
    package static func parse(_ text: some StringProtocol, now: Date = Date()) -> Date? {
        // The longest valid value, RFC 850 with "Wednesday", is 33 bytes.
        guard let bytes = trimmedBytes(text.utf8, limit: 40) else { return nil }
        var cursor = Cursor(bytes: bytes)
        let dayName = cursor.letters()
        let fields: Fields?
        if cursor.take(UInt8(ascii: ",")) {
            if dayName.count == 3, index(of: dayName, in: shortDayNames) != nil {
                fields = imfFixdate(&cursor)
            } else if index(of: dayName, in: longDayNames) != nil {
                fields = rfc850Date(&cursor, now: now)
            } else {
                fields = nil
            }
        } else if dayName.count == 3, index(of: dayName, in: shortDayNames) != nil, cursor.take(space) {
            fields = asctimeDate(&cursor)
        } else {
            fields = nil
        }
        guard let fields, cursor.isAtEnd else { return nil }
        return fields.date
    }

    /// IMF-fixdate, as senders must produce.
    ///
    /// Fractions of a second are dropped (rounded down). A date before 1601-01-01 or after
    /// 9999-12-31T23:59:59Z is clamped to that bound, since the form has a four-digit year and
    /// `parse` must read back what this writes; a NaN date is written as the Unix epoch.
    package static func format(_ date: Date) -> String {
        let lower = daysFromCivil(year: 1601, month: 1, day: 1) * secondsPerDay
        let upper = daysFromCivil(year: 10000, month: 1, day: 1) * secondsPerDay - 1
        let interval = date.timeIntervalSince1970
        // Clamped as a Double first: Int(_:) traps on values it cannot hold.
        let seconds = interval.isNaN ? 0 : Int(min(max(interval.rounded(.down), Double(lower)), Double(upper)))
        let days = floorDivision(seconds, secondsPerDay)
        let secondOfDay = seconds - days * secondsPerDay
        let civil = civilFromDays(days)
        // 1970-01-01 was a Thursday (index 4, counting from Sunday).
        let weekday = (days % 7 + 7 + 4) % 7
        let hour = secondOfDay / 3600
        let minute = secondOfDay / 60 % 60
        let second = secondOfDay % 60
        return "\(formatDayNames[weekday]), \(padded(civil.day, 2)) \(formatMonthNames[civil.month - 1]) "
            + "\(padded(civil.year, 4)) \(padded(hour, 2)):\(padded(minute, 2)):\(padded(second, 2)) GMT"
    }

    // MARK: - The three forms

    /// What a form yields before the calendar checks.
    private struct Fields {
        var year: Int
        var month: Int
        var day: Int
        var hour: Int
        var minute: Int
        var second: Int

        /// nil when the fields name no instant (31 Feb, hour 24, year 1600...).
        var date: Date? {
            guard (1601...9999).contains(year), (1...12).contains(month),
                (1...HTTPDate.daysInMonth(month, year: year)).contains(day), (0...23).contains(hour),
                (0...59).contains(minute), (0...60).contains(second)
            else { return nil }
            let days = HTTPDate.daysFromCivil(year: year, month: month, day: day)
            let seconds = days * HTTPDate.secondsPerDay + hour * 3600 + minute * 60 + min(second, 59)
            return Date(timeIntervalSince1970: TimeInterval(seconds))
        }
    }

    /// After "Sun,": ` 06 Nov 1994 08:49:37 GMT`.
    private static func imfFixdate(_ cursor: inout Cursor) -> Fields? {
        guard cursor.take(space), let day = cursor.digits(2), cursor.take(space), let month = month(&cursor),
            cursor.take(space), let year = cursor.digits(4), cursor.take(space), let time = timeOfDay(&cursor),
            cursor.take(space), gmt(&cursor)
        else { return nil }
        return Fields(year: year, month: month, day: day, hour: time.hour, minute: time.minute, second: time.second)
    }

    /// After "Sunday,": ` 06-Nov-94 08:49:37 GMT`.
    private static func rfc850Date(_ cursor: inout Cursor, now: Date) -> Fields? {
        guard cursor.take(space), let day = cursor.digits(2), cursor.take(UInt8(ascii: "-")), let month = month(&cursor),
            cursor.take(UInt8(ascii: "-")), let twoDigitYear = cursor.digits(2), cursor.take(space),
            let time = timeOfDay(&cursor), cursor.take(space), gmt(&cursor)
        else { return nil }
        var fields = Fields(year: 0, month: month, day: day, hour: time.hour, minute: time.minute, second: time.second)
        fields.year = rfc850Year(twoDigitYear, fields: fields, now: now)
        return fields
    }

    /// After "Sun ": `Nov  6 08:49:37 1994` (or `Nov 16`, `Nov 06`).
    private static func asctimeDate(_ cursor: inout Cursor) -> Fields? {
        guard let month = month(&cursor), cursor.take(space) else { return nil }
        // date3 = month SP ( 2DIGIT / ( SP DIGIT ) )
        let day: Int?
        if cursor.take(space) { day = cursor.digits(1) } else { day = cursor.digits(2) }
        guard let day, cursor.take(space), let time = timeOfDay(&cursor), cursor.take(space),
            let year = cursor.digits(4)
        else { return nil }
        return Fields(year: year, month: month, day: day, hour: time.hour, minute: time.minute, second: time.second)
    }

    private static func timeOfDay(_ cursor: inout Cursor) -> (hour: Int, minute: Int, second: Int)? {
        guard let hour = cursor.digits(2), cursor.take(UInt8(ascii: ":")), let minute = cursor.digits(2),
            cursor.take(UInt8(ascii: ":")), let second = cursor.digits(2)
        else { return nil }
        return (hour, minute, second)
    }

    /// 1...12, or nil.
    private static func month(_ cursor: inout Cursor) -> Int? {
        let name = cursor.letters()
        guard name.count == 3, let index = index(of: name, in: monthNames) else { return nil }
        return index + 1
    }

    private static func gmt(_ cursor: inout Cursor) -> Bool {
        let zone = cursor.letters()
        return index(of: zone, in: [Array("gmt".utf8)]) != nil
    }

    /// The full year for RFC 850's two digits: the one whose instant lies in the hundred years
    /// ending 50 years after `now` (RFC 9110 §5.6.7). Compared as instants, not just years, so
    /// "more than 50 years in the future" is exact at the boundary.
    private static func rfc850Year(_ twoDigits: Int, fields: Fields, now: Date) -> Int {
        // Clamped so a far-off or non-finite `now` cannot trap in Int(_:); ±10^13 s is ±300,000 years.
        let interval = now.timeIntervalSince1970
        let nowSeconds = interval.isNaN ? 0 : Int(min(max(interval.rounded(.down), -1e13), 1e13))
        let nowDays = floorDivision(nowSeconds, secondsPerDay)
        let nowCivil = civilFromDays(nowDays)
        let limitYear = nowCivil.year + 50
        // 29 Feb plus 50 years may not exist: use the month's last day.
        let limitDay = min(nowCivil.day, daysInMonth(nowCivil.month, year: limitYear))
        let limit = daysFromCivil(year: limitYear, month: nowCivil.month, day: limitDay) * secondsPerDay
            + (nowSeconds - nowDays * secondsPerDay)
        // Invalid days (29 Feb of a common year) still give an instant here (1 Mar); the
        // calendar check comes later, against the year chosen.
        func instant(_ year: Int) -> Int {
            daysFromCivil(year: year, month: fields.month, day: fields.day) * secondsPerDay
                + fields.hour * 3600 + fields.minute * 60 + min(fields.second, 59)
        }
        var year = nowCivil.year - floorModulo(nowCivil.year, 100) + twoDigits
        if instant(year) > limit {
            year -= 100
        } else if instant(year + 100) <= limit {
            year += 100
        }
        return year
    }

    // MARK: - Gregorian arithmetic (H. Hinnant, "chrono-Compatible Low-Level Date Algorithms")

    private static let secondsPerDay = 86_400

    /// Days since 1970-01-01 of a proleptic Gregorian date.
    private static func daysFromCivil(year: Int, month: Int, day: Int) -> Int {
        let shiftedYear = month <= 2 ? year - 1 : year  // years start in March, so leap days end them
        let era = floorDivision(shiftedYear, 400)
        let yearOfEra = shiftedYear - era * 400
        let dayOfYear = (153 * ((month + 9) % 12) + 2) / 5 + day - 1
        let dayOfEra = yearOfEra * 365 + yearOfEra / 4 - yearOfEra / 100 + dayOfYear
        return era * 146_097 + dayOfEra - 719_468
    }

    /// The proleptic Gregorian date of a count of days since 1970-01-01.
    private static func civilFromDays(_ days: Int) -> (year: Int, month: Int, day: Int) {
        let shifted = days + 719_468
        let era = floorDivision(shifted, 146_097)
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let shiftedMonth = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * shiftedMonth + 2) / 5 + 1
        let month = shiftedMonth < 10 ? shiftedMonth + 3 : shiftedMonth - 9
        return (yearOfEra + era * 400 + (month <= 2 ? 1 : 0), month, day)
    }

    private static func daysInMonth(_ month: Int, year: Int) -> Int {
        switch month {
        case 2: (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 ? 29 : 28
        case 4, 6, 9, 11: 30
        default: 31
        }
    }

    private static func floorDivision(_ value: Int, _ divisor: Int) -> Int {
        value >= 0 ? value / divisor : -((-value + divisor - 1) / divisor)
    }

    private static func floorModulo(_ value: Int, _ divisor: Int) -> Int {
        value - floorDivision(value, divisor) * divisor
    }

    // MARK: - Bytes

    private static let space = UInt8(ascii: " ")
    private static let shortDayNames = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"].map { Array($0.utf8) }
    private static let longDayNames = ["sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday"]
        .map { Array($0.utf8) }
    private static let monthNames = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
        .map { Array($0.utf8) }
    private static let formatDayNames = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
    private static let formatMonthNames = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// The position of `name` (ASCII letters, any case) among lowercase `names`.
    private static func index(of name: ArraySlice<UInt8>, in names: [[UInt8]]) -> Int? {
        names.firstIndex { candidate in
            candidate.count == name.count
                && zip(candidate, name).allSatisfy { expected, byte in
                    // Only letters reach here (Cursor.letters), so setting 0x20 lowercases them.
                    expected == byte | 0x20
                }
        }
    }

    /// The value without surrounding SP/HTAB, or nil when it is empty or longer than `limit`.
    /// Stops copying at `limit`, so a huge value costs one pass and no large allocation.
    private static func trimmedBytes(_ utf8: some Collection<UInt8>, limit: Int) -> [UInt8]? {
        let isWhitespace = { (byte: UInt8) in byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\t") }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(limit)
        for byte in utf8 {
            if bytes.isEmpty, isWhitespace(byte) { continue }
            if bytes.count < limit {
                bytes.append(byte)
            } else if !isWhitespace(byte) {
                return nil
            }
        }
        while let last = bytes.last, isWhitespace(last) { bytes.removeLast() }
        return bytes.isEmpty ? nil : bytes
    }

    private static func padded(_ value: Int, _ width: Int) -> String {
        let digits = String(value)
        return String(repeating: "0", count: max(0, width - digits.count)) + digits
    }

    /// A read position in the value's bytes; every read either matches and advances or fails.
    private struct Cursor {
        let bytes: [UInt8]
        var position = 0

        var isAtEnd: Bool { position == bytes.count }

        mutating func take(_ byte: UInt8) -> Bool {
            guard position < bytes.count, bytes[position] == byte else { return false }
            position += 1
            return true
        }

        /// Exactly `count` ASCII digits, as a number (at most 4, so it cannot overflow).
        mutating func digits(_ count: Int) -> Int? {
            guard bytes.count - position >= count else { return nil }
            var value = 0
            for byte in bytes[position..<position + count] {
                guard (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) else { return nil }
                value = value * 10 + Int(byte - UInt8(ascii: "0"))
            }
            position += count
            return value
        }

        /// The run of ASCII letters here, possibly empty.
        mutating func letters() -> ArraySlice<UInt8> {
            let start = position
            while position < bytes.count,
                (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(bytes[position] | 0x20)
            {
                position += 1
            }
            return bytes[start..<position]
        }
    }
}
