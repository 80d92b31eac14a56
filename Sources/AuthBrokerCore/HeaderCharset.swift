/// Header field values that are not UTF-8, read as ISO-8859-1.
///
/// RFC 9110 §5.5: field values are octets; "historically, HTTP allowed field content with text
/// in the ISO-8859-1 charset", and servers still send realms that way (`realm="foo-<0xE4>"`,
/// Basic's RFC 7617 §2.1 even says so). NIOHTTP1 turns header bytes into Strings as UTF-8,
/// replacing what is not with U+FFFD, so such a realm could never equal the `foo-ä` a person
/// stored after reading it in a browser's prompt. Transcoding the lines that are not valid UTF-8
/// from ISO-8859-1 to UTF-8 before the decoder keeps every valid UTF-8 line as it was.
package enum HeaderCharset {
    /// `head` (a response head: status line, fields, the empty line) with each line that is not
    /// valid UTF-8 transcoded from ISO-8859-1; nil when every line is valid UTF-8 already.
    package static func transcodingLatin1Lines(of head: [UInt8]) -> [UInt8]? {
        guard head.contains(where: { $0 >= 0x80 }) else { return nil }
        var output: [UInt8] = []
        output.reserveCapacity(head.count + 16)
        var changed = false
        var lineStart = 0
        while lineStart < head.count {
            var lineEnd = lineStart
            while lineEnd < head.count, head[lineEnd] != 0x0A { lineEnd += 1 }
            let line = head[lineStart..<lineEnd]
            if line.contains(where: { $0 >= 0x80 }), String(validating: line, as: UTF8.self) == nil {
                changed = true
                for byte in line {
                    if byte < 0x80 {
                        output.append(byte)
                    } else {
                        // U+0080...U+00FF in UTF-8: two bytes.
                        output.append(0xC0 | (byte >> 6))
                        output.append(0x80 | (byte & 0x3F))
                    }
                }
            } else {
                output.append(contentsOf: line)
            }
            if lineEnd < head.count { output.append(0x0A) }
            lineStart = lineEnd + 1
        }
        return changed ? output : nil
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
