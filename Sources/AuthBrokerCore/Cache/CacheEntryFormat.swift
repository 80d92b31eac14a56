import CZlib
import Foundation

/// One stored response as the cache keeps it on disk: a file of its own, a self-describing head
/// (what was asked, what came back, when) and then the body, streamed in and out.
///
/// One file per response, and no separate index: whatever the cache knows at start it reads
/// from the files' heads, so an index can never disagree with the bodies it points at. A file
/// is written under a temporary name and renamed into place only when whole, so a crash leaves
/// either the old entry or the new one; a file that is still wrong (a torn write the disk lost
/// after the rename, body blocks it lost with the length intact, a stranger's garbage) fails
/// `decodeHead` or `checkBody` and is dropped, never served.
///
/// Layout: the 8-byte magic `ABCACHE2`, the head's length (4 bytes, big-endian), the head as
/// JSON, its CRC-32 (4 bytes, big-endian), then exactly `bodyLength` body bytes, whose CRC-32
/// the head holds (`bodyCRC32`). `ABCACHE1` files (no body checksum) are not entries: dropped
/// at start like any other file that is not.
package enum CacheEntryFormat {
    package static let magic: [UInt8] = Array("ABCACHE2".utf8)
    /// A head beyond this is not ours (heads are bounded by the response head limit).
    package static let maxHeadBytes = 1 << 20
    /// Bytes before the head's JSON.
    package static let prefixBytes = magic.count + 4

    /// What the cache needs of a stored response without reading its body.
    package struct Head: Codable, Sendable, Equatable {
        package var method: String
        /// The canonical absolute URL.
        package var url: String
        /// `CachePolicy.variantKey` of the request it answered, over `varyFields`.
        package var variantKey: String
        package var varyFields: [String]
        package var status: Int
        /// The stored header fields, in order (`CachePolicy.storedHeaders`).
        package var headers: [[String]]
        /// When the request went and the response came, in milliseconds since 1970.
        package var requestTimeMilliseconds: Int64
        package var responseTimeMilliseconds: Int64
        package var bodyLength: Int64
        /// The CRC-32 of the body's bytes (`checkBody`); 0 for an empty body.
        package var bodyCRC32: UInt32

        /// `bodyLength` and `bodyCRC32`: a writer learns them at the body's end, and fills them in then.
        package init(
            method: String, url: String, variantKey: String, varyFields: [String], status: Int, headers: [(String, String)],
            requestTime: Date, responseTime: Date, bodyLength: Int64, bodyCRC32: UInt32 = 0
        ) {
            self.method = method
            self.url = url
            self.variantKey = variantKey
            self.varyFields = varyFields
            self.status = status
            self.headers = headers.map { [$0.0, $0.1] }
            self.requestTimeMilliseconds = Int64((requestTime.timeIntervalSince1970 * 1000).rounded(.down))
            self.responseTimeMilliseconds = Int64((responseTime.timeIntervalSince1970 * 1000).rounded(.down))
            self.bodyLength = bodyLength
            self.bodyCRC32 = bodyCRC32
        }

        /// The header fields as pairs; a malformed pair (not two strings) is left out.
        package var fields: [(name: String, value: String)] {
            self.headers.compactMap { $0.count == 2 ? ($0[0], $0[1]) : nil }
        }

        package var timing: CachePolicy.Timing {
            CachePolicy.Timing(
                requestTime: Date(timeIntervalSince1970: Double(self.requestTimeMilliseconds) / 1000),
                responseTime: Date(timeIntervalSince1970: Double(self.responseTimeMilliseconds) / 1000)
            )
        }
    }

    /// Why a file is not a usable entry.
    package enum Failure: Error, Sendable, Equatable {
        /// Shorter than the prefix, or not starting with the magic: not an entry of this format.
        case notAnEntry
        /// The head's length is beyond `maxHeadBytes`, or runs past the end of the file.
        case headTruncated
        /// The head's bytes do not match their checksum: torn or altered.
        case headCorrupt
        /// The head is not the JSON of a `Head`, or says impossible things (a negative length).
        case headUnreadable
        /// The file holds more or fewer body bytes than the head says.
        case bodyLengthMismatch(expected: Int64, found: Int64)
        /// The body's bytes do not match the head's checksum of them: blocks the disk lost (a
        /// power cut after the rename), or an altered file.
        case bodyCorrupt
    }

    /// The bytes that go before the body.
    /// - Parameter paddedTo: the JSON's length at least, made up with spaces (which JSON allows
    ///   after a value): a writer that learns the body's length only at its end reserves
    ///   `reservedHeadBytes` up front and writes the final head over the reserved one.
    package static func encodeHead(_ head: Head, paddedTo jsonLength: Int = 0) -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        // A Head holds strings and integers only, which JSONEncoder always encodes.
        var json = (try? encoder.encode(head)).map(Array.init) ?? []
        if json.count < jsonLength { json.append(contentsOf: repeatElement(UInt8(ascii: " "), count: jsonLength - json.count)) }
        var bytes = Self.magic
        bytes.append(contentsOf: Self.bigEndian(UInt32(json.count)))
        bytes.append(contentsOf: json)
        bytes.append(contentsOf: Self.bigEndian(CRC32.checksum(json)))
        return bytes
    }

    /// The JSON length to pad `head` to so that the same head with any body length and checksum fits.
    package static func reservedJSONLength(for head: Head) -> Int {
        var longest = head
        longest.bodyLength = Int64.max
        longest.bodyCRC32 = UInt32.max
        return Self.encodeHead(longest).count - Self.prefixBytes - 4
    }

    /// How many bytes to read first: enough for the prefix, then `headBytesNeeded` says the rest.
    /// - Returns: the whole head's size (prefix, JSON, checksum) once `prefix` has the first
    ///   `prefixBytes` bytes.
    package static func headBytesNeeded(prefix: some Collection<UInt8>) -> Result<Int, Failure> {
        guard prefix.count >= Self.prefixBytes, prefix.prefix(Self.magic.count).elementsEqual(Self.magic) else {
            return .failure(.notAnEntry)
        }
        let length = prefix.dropFirst(Self.magic.count).prefix(4).reduce(0) { ($0 << 8) | Int($1) }
        guard length <= Self.maxHeadBytes else { return .failure(.headTruncated) }
        return .success(Self.prefixBytes + length + 4)
    }

    /// Reads a head from the start of a file of `fileSize` bytes; the body starts at the
    /// returned offset.
    package static func decodeHead(_ bytes: [UInt8], fileSize: Int64) -> Result<(head: Head, bodyOffset: Int), Failure> {
        let needed: Int
        switch Self.headBytesNeeded(prefix: bytes) {
        case .success(let count): needed = count
        case .failure(let failure): return .failure(failure)
        }
        guard bytes.count >= needed, Int64(needed) <= fileSize else { return .failure(.headTruncated) }
        let json = Array(bytes[Self.prefixBytes..<(needed - 4)])
        let stored = bytes[(needed - 4)..<needed].reduce(UInt32(0)) { ($0 << 8) | UInt32($1) }
        guard CRC32.checksum(json) == stored else { return .failure(.headCorrupt) }
        // An empty body's CRC-32 is 0: any other says the head is not what a writer made.
        guard let head = try? JSONDecoder().decode(Head.self, from: Data(json)), head.bodyLength >= 0,
            head.bodyLength > 0 || head.bodyCRC32 == 0, (100...999).contains(head.status)
        else { return .failure(.headUnreadable) }
        let found = fileSize - Int64(needed)
        guard found == head.bodyLength else { return .failure(.bodyLengthMismatch(expected: head.bodyLength, found: found)) }
        return .success((head, needed))
    }

    /// Whether a body read back (`length` bytes whose CRC-32 is `checksum`) is the one `head`
    /// describes. A reader checks this before the first byte of a body it did not write itself
    /// goes out: the file's size only proves the length, and a disk that lost blocks keeps it.
    package static func checkBody(_ checksum: CRC32, length: Int64, against head: Head) -> Result<Void, Failure> {
        guard length == head.bodyLength else { return .failure(.bodyLengthMismatch(expected: head.bodyLength, found: length)) }
        guard checksum.value == head.bodyCRC32 else { return .failure(.bodyCorrupt) }
        return .success(())
    }

    /// The file name of the entry for a request: 16 hex digits of FNV-1a over its method, URL and
    /// variant. Two keys may share a name; the head holds the whole key, and a reader that finds
    /// another key there has a miss (and the writer replaces it).
    package static func fileName(method: String, url: String, variantKey: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in "\(method) \(url)\n\(variantKey)".utf8 {
            hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
        }
        let hex = String(hash, radix: 16)
        return String(repeating: "0", count: 16 - hex.count) + hex + ".entry"
    }

    private static func bigEndian(_ value: UInt32) -> [UInt8] {
        [UInt8(value >> 24), UInt8((value >> 16) & 0xFF), UInt8((value >> 8) & 0xFF), UInt8(value & 0xFF)]
    }
}

/// CRC-32 (IEEE 802.3), zlib's: enough to tell a torn, lost or altered head or body from a
/// whole one; not a defence against someone who can write the cache directory (only the user
/// can). Accumulated piece by piece, as a body streams in or is read back. zlib's rather than a
/// Swift table loop: a large body is checked in full before it is first served, and zlib's runs
/// at gigabytes a second where a byte loop (in a debug build above all) is many times slower.
package struct CRC32: Sendable, Equatable {
    /// The checksum of everything given so far (0 for nothing).
    package private(set) var value: UInt32 = 0

    package init() {}

    package mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, !bytes.isEmpty else { return }
        self.value = UInt32(truncatingIfNeeded: crc32_z(UInt(self.value), base.assumingMemoryBound(to: UInt8.self), bytes.count))
    }

    package mutating func update(_ bytes: some Sequence<UInt8>) {
        let done: Void? = bytes.withContiguousStorageIfAvailable { self.update(UnsafeRawBufferPointer($0)) }
        if done == nil { Array(bytes).withUnsafeBytes { self.update($0) } }
    }

    package static func checksum(_ bytes: some Sequence<UInt8>) -> UInt32 {
        var crc = CRC32()
        crc.update(bytes)
        return crc.value
    }
}
