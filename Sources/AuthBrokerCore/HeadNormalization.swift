/// A message head made fit for SwiftNIO's decoder: values that are not UTF-8 read as
/// ISO-8859-1, whitespace after field values dropped, bare CRs refused.
///
/// RFC 9110 §5.5: field values are octets; "historically, HTTP allowed field content with text
/// in the ISO-8859-1 charset", and servers still send realms that way (`realm="foo-<0xE4>"`,
/// Basic's RFC 7617 §2.1 even says so). NIOHTTP1 turns header bytes into Strings as UTF-8,
/// replacing what is not with U+FFFD, so such a realm could never equal the `foo-ä` a person
/// stored after reading it in a browser's prompt. Transcoding the lines that are not valid UTF-8
/// from ISO-8859-1 to UTF-8 before the decoder keeps every valid UTF-8 line as it was.
package enum HeadNormalization {
    /// Why a head is refused before the decoder reads it.
    package enum Refusal: Error, Sendable, Hashable, CustomStringConvertible {
        /// A CR not followed by LF (RFC 9112 §2.2): SwiftNIO's bundled llhttp takes one after
        /// the status line as the line's end and reads what follows as fields.
        case bareCR

        package var description: String {
            switch self {
            case .bareCR: "a bare CR (not followed by LF) in the message head"
            }
        }
    }

    /// `head` (status line, fields, the empty line) as the decoder should read it, or nil when
    /// it needs no change: each line that is not valid UTF-8 transcoded from ISO-8859-1, and
    /// whitespace at the end of a field line removed (RFC 9110 §5.5: it is not part of the
    /// value; the bundled llhttp refuses a tab after `Content-Length` and misses `chunked`
    /// with whitespace after it). A line without a colon keeps its whitespace, so no line
    /// becomes the empty line that ends a head; the start line is left as it came.
    package static func normalized(_ head: [UInt8]) throws(Refusal) -> [UInt8]? {
        var output: [UInt8] = []
        output.reserveCapacity(head.count + 16)
        var changed = false
        var lineStart = 0
        while lineStart < head.count {
            var lineEnd = lineStart
            while lineEnd < head.count, head[lineEnd] != 0x0A { lineEnd += 1 }
            // A CR ends a line only before its LF.
            let endsWithCR = lineEnd < head.count && lineEnd > lineStart && head[lineEnd - 1] == 0x0D
            let contentEnd = endsWithCR ? lineEnd - 1 : lineEnd
            var line = head[lineStart..<contentEnd]
            if line.contains(0x0D) { throw .bareCR }
            // Field lines only: the start line's grammar has no OWS at its end.
            if lineStart > 0, line.contains(UInt8(ascii: ":")) {
                let trimmed = line.reversed().drop { $0 == 0x20 || $0 == 0x09 }.count
                if trimmed < line.count {
                    line = line.prefix(trimmed)
                    changed = true
                }
            }
            if let transcoded = Self.latin1Transcoded(line) {
                output.append(contentsOf: transcoded)
                changed = true
            } else {
                output.append(contentsOf: line)
            }
            if endsWithCR { output.append(0x0D) }
            if lineEnd < head.count { output.append(0x0A) }
            lineStart = lineEnd + 1
        }
        return changed ? output : nil
    }

    /// `line` transcoded from ISO-8859-1 when it is not valid UTF-8; nil when it is.
    private static func latin1Transcoded(_ line: ArraySlice<UInt8>) -> [UInt8]? {
        guard line.contains(where: { $0 >= 0x80 }), String(validating: line, as: UTF8.self) == nil else { return nil }
        var output: [UInt8] = []
        output.reserveCapacity(line.count * 2)
        for byte in line {
            if byte < 0x80 {
                output.append(byte)
            } else {
                // U+0080...U+00FF in UTF-8: two bytes.
                output.append(0xC0 | (byte >> 6))
                output.append(0x80 | (byte & 0x3F))
            }
        }
        return output
    }

    /// The index just past the `CRLF CRLF` that ends a head in `bytes`, or nil.
    package static func headEnd(in bytes: [UInt8]) -> Int? {
        guard bytes.count >= 4 else { return nil }
        for index in 0...(bytes.count - 4)
        where bytes[index] == 0x0D && bytes[index + 1] == 0x0A && bytes[index + 2] == 0x0D && bytes[index + 3] == 0x0A {
            return index + 4
        }
        return nil
    }
}
