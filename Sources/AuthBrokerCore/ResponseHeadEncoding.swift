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

    /// Appends the head to `buffer`; on a refusal `buffer` is left as it was.
    ///
    /// The head's size is counted first and the bytes copied into the buffer's memory in one
    /// access: a `ByteBuffer` write per piece (a uniqueness and a capacity check each, some ten
    /// per field) cost more than the copying.
    package static func write(
        version: HTTPVersion, status: HTTPResponseStatus, headers: HTTPHeaders, to buffer: inout ByteBuffer
    ) throws(Refusal) {
        let code = status.code
        guard (100...999).contains(code) else { throw .statusCode(code) }
        let versionText = Self.versionText(version)
        let reason = status.reasonPhrase
        let size = Self.size(versionText: versionText, reason: reason, headers: headers)
        var refusal: Refusal?
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: size) { memory in
            var out = Output(memory: memory)
            _ = out.copy(versionText) { _ in true }
            out.byte(UInt8(ascii: "0") + UInt8(code / 100))
            out.byte(UInt8(ascii: "0") + UInt8(code / 10 % 10))
            out.byte(UInt8(ascii: "0") + UInt8(code % 10))
            out.byte(UInt8(ascii: " "))
            guard out.copy(reason, ifEvery: HTTPSyntax.isFieldValueByte) else {
                refusal = .reasonPhrase
                return 0
            }
            out.lineEnd()
            var position = 0
            for (name, value) in headers {
                guard !name.isEmpty, out.copy(name, ifEvery: HTTPSyntax.isTChar) else {
                    refusal = .fieldName(position: position)
                    return 0
                }
                out.byte(UInt8(ascii: ":"))
                out.byte(UInt8(ascii: " "))
                guard out.copy(value, ifEvery: HTTPSyntax.isFieldValueByte) else {
                    refusal = .fieldValue(position: position)
                    return 0
                }
                out.lineEnd()
                position += 1
            }
            out.lineEnd()
            return out.offset
        }
        if let refusal { throw refusal }
    }

    private static func versionText(_ version: HTTPVersion) -> String {
        version == .http1_1 ? "HTTP/1.1 " : "HTTP/\(version.major).\(version.minor) "
    }

    /// The head's bytes: "HTTP/1.1 200 " reason CRLF, each field as name ": " value CRLF, then
    /// CRLF.
    private static func size(versionText: String, reason: String, headers: HTTPHeaders) -> Int {
        var size = versionText.utf8.count + 4 + reason.utf8.count + 2 + 2
        for (name, value) in headers { size += name.utf8.count + value.utf8.count + 4 }
        return size
    }

    /// A head without its empty line, for fields to follow (`appendField`, then `"\r\n"`): a
    /// stored response's head, encoded once and copied into each answer from it.
    package static func openHead(version: HTTPVersion, status: HTTPResponseStatus, headers: HTTPHeaders) throws(Refusal) -> ByteBuffer {
        // Exactly its size: it is kept for as long as its entry (a buffer that grows doubles).
        let size = Self.size(versionText: Self.versionText(version), reason: status.reasonPhrase, headers: headers)
        var buffer = ByteBufferAllocator().buffer(capacity: size)
        try Self.write(version: version, status: status, headers: headers, to: &buffer)
        buffer.moveWriterIndex(to: buffer.writerIndex - 2)
        return buffer
    }

    /// Appends one field to an open head; false (nothing appended) when it would break the head.
    package static func appendField(name: String, value: String, to buffer: inout ByteBuffer) -> Bool {
        guard !name.isEmpty else { return false }
        return buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: name.utf8.count + value.utf8.count + 4) { memory in
            var out = Output(memory: memory)
            guard out.copy(name, ifEvery: HTTPSyntax.isTChar) else { return 0 }
            out.byte(UInt8(ascii: ":"))
            out.byte(UInt8(ascii: " "))
            guard out.copy(value, ifEvery: HTTPSyntax.isFieldValueByte) else { return 0 }
            out.lineEnd()
            return out.offset
        } > 0
    }

    /// A cursor over memory counted to fit the head exactly.
    private struct Output {
        let memory: UnsafeMutableRawBufferPointer
        var offset = 0

        @inline(__always)
        mutating func byte(_ byte: UInt8) {
            self.memory[self.offset] = byte
            self.offset += 1
        }

        @inline(__always)
        mutating func lineEnd() {
            self.byte(UInt8(ascii: "\r"))
            self.byte(UInt8(ascii: "\n"))
        }

        /// Copies `text`'s UTF-8 while every byte passes `check`; false at the first that does not.
        @inline(__always)
        mutating func copy(_ text: String, ifEvery check: (UInt8) -> Bool) -> Bool {
            var text = text
            let memory = self.memory
            let start = self.offset
            let copied: Int? = text.withUTF8 { bytes in
                for (index, byte) in bytes.enumerated() {
                    guard check(byte) else { return nil }
                    memory[start + index] = byte
                }
                return bytes.count
            }
            guard let copied else { return false }
            self.offset += copied
            return true
        }
    }
}
