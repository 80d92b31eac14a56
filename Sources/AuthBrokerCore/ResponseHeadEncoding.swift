import NIOCore
import NIOHTTP1

/// A response head as it goes on the wire (RFC 9112 §4, §5): the status line, each field as
/// `name: value`, and the empty line.
///
/// Every byte is checked as it is copied: a field name must be a token, and a value or reason
/// phrase may hold no control character but HTAB (CR, LF and NUL above all: they would end a
/// field or the head early, and what follows would be read as fields or a response of its own).
/// One pass instead of a check and then a copy; the client connection's encoder sends nothing of
/// a head that fails it.
package enum ResponseHeadEncoding {
    /// Why a head cannot be sent. Positions only: a field's value may be a secret, and a name
    /// that fails may hold anything.
    package enum Refusal: Error, Hashable, Sendable, CustomStringConvertible {
        /// The status code is not three digits.
        case statusCode(UInt)
        /// The reason phrase holds a control character.
        case reasonPhrase
        /// The field at this position (0 for the first) has a name that is not a token.
        case fieldName(position: Int)
        /// The field at this position has a value with a control character.
        case fieldValue(position: Int)

        package var description: String {
            switch self {
            case .statusCode(let code): "the response's status code \(code) is not three digits"
            case .reasonPhrase: "the response's reason phrase holds a control character"
            case .fieldName(let position): "the response's field \(position + 1) has a name that is not an HTTP token"
            case .fieldValue(let position): "the response's field \(position + 1) has a value with a control character"
            }
        }
    }

    /// Bytes a head of these fields may take, for a buffer's first capacity.
    package static func estimatedSize(_ headers: HTTPHeaders, reasonPhrase: String) -> Int {
        var size = 16 + reasonPhrase.utf8.count
        for (name, value) in headers { size += name.utf8.count + value.utf8.count + 4 }
        return size
    }

    /// Appends the head to `buffer`; on a refusal `buffer` is left as it was.
    package static func write(
        version: HTTPVersion, status: HTTPResponseStatus, headers: HTTPHeaders, to buffer: inout ByteBuffer
    ) throws(Refusal) {
        let start = buffer.writerIndex
        do {
            try self.writeUnchecked(version: version, status: status, headers: headers, to: &buffer)
        } catch {
            buffer.moveWriterIndex(to: start)
            throw error
        }
    }

    private static func writeUnchecked(
        version: HTTPVersion, status: HTTPResponseStatus, headers: HTTPHeaders, to buffer: inout ByteBuffer
    ) throws(Refusal) {
        if version == .http1_1 {
            buffer.writeStaticString("HTTP/1.1 ")
        } else {
            buffer.writeString("HTTP/\(version.major).\(version.minor) ")
        }
        let code = status.code
        guard (100...999).contains(code) else { throw .statusCode(code) }
        buffer.writeInteger(UInt8(ascii: "0") + UInt8(code / 100))
        buffer.writeInteger(UInt8(ascii: "0") + UInt8(code / 10 % 10))
        buffer.writeInteger(UInt8(ascii: "0") + UInt8(code % 10))
        buffer.writeInteger(UInt8(ascii: " "))
        guard Self.append(status.reasonPhrase, to: &buffer, ifEvery: Self.isValueByte) else { throw .reasonPhrase }
        buffer.writeStaticString("\r\n")
        var position = 0
        for (name, value) in headers {
            guard !name.isEmpty, Self.append(name, to: &buffer, ifEvery: Self.isTokenByte) else {
                throw .fieldName(position: position)
            }
            buffer.writeStaticString(": ")
            guard Self.append(value, to: &buffer, ifEvery: Self.isValueByte) else { throw .fieldValue(position: position) }
            buffer.writeStaticString("\r\n")
            position += 1
        }
        buffer.writeStaticString("\r\n")
    }

    /// Copies `text`'s UTF-8 when every byte passes `check`; false (nothing copied) otherwise.
    @inline(__always)
    private static func append(_ text: String, to buffer: inout ByteBuffer, ifEvery check: (UInt8) -> Bool) -> Bool {
        var text = text
        return text.withUTF8 { bytes in
            for byte in bytes where !check(byte) { return false }
            buffer.writeBytes(UnsafeRawBufferPointer(bytes))
            return true
        }
    }

    /// `tchar` (RFC 9110 §5.6.2).
    @inline(__always)
    package static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"), UInt8(ascii: "%"), UInt8(ascii: "&"), UInt8(ascii: "'"),
            UInt8(ascii: "*"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"), UInt8(ascii: "_"),
            UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
            true
        default:
            false
        }
    }

    /// A field value's byte (RFC 9110 §5.5): visible ASCII, SP, HTAB or obs-text; never another
    /// control character.
    @inline(__always)
    package static func isValueByte(_ byte: UInt8) -> Bool {
        (byte >= 0x20 && byte != 0x7F) || byte == 0x09
    }
}
