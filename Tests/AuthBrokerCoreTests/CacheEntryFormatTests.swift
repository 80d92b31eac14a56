import AuthBrokerCore
import Foundation
import Testing

/// The cache's file format: a head that round-trips, and every way a file can be wrong caught
/// before anything is served from it.
struct CacheEntryFormatTests {
    static let body = Array("forty-two bytes of body, and then some...!".utf8)
    static let head = CacheEntryFormat.Head(
        method: "GET", url: "https://api.test/items?page=2", variantKey: "accept-encoding:gzip", varyFields: ["accept-encoding"],
        status: 200, headers: [("Content-Type", "application/json"), ("ETag", "\"v1\""), ("X-Ünïcode", "välue")],
        requestTime: Date(timeIntervalSince1970: 1_800_000_000.123), responseTime: Date(timeIntervalSince1970: 1_800_000_000.456),
        bodyLength: 42, bodyCRC32: CRC32.checksum(Self.body)
    )

    /// A head's bytes around `json`, with its right checksum (whatever the JSON says).
    static func entryHead(json: [UInt8], magic: [UInt8] = CacheEntryFormat.magic) -> [UInt8] {
        var bytes = magic
        bytes += [0, 0, UInt8(json.count >> 8), UInt8(json.count & 0xFF)] + json
        let crc = CRC32.checksum(json)
        return bytes + [UInt8(crc >> 24), UInt8((crc >> 16) & 0xFF), UInt8((crc >> 8) & 0xFF), UInt8(crc & 0xFF)]
    }

    static func crc(_ bytes: some Sequence<UInt8>) -> CRC32 {
        var crc = CRC32()
        crc.update(bytes)
        return crc
    }

    /// The JSON of `head` as an object, to take fields out of or change.
    static func jsonObject(_ head: CacheEntryFormat.Head) throws -> [String: Any] {
        let bytes = CacheEntryFormat.encodeHead(head)
        let json = bytes[CacheEntryFormat.prefixBytes..<(bytes.count - 4)]
        return try #require(try JSONSerialization.jsonObject(with: Data(json)) as? [String: Any])
    }

    @Test func aHeadRoundTrips() throws {
        #expect(Self.body.count == 42)
        let bytes = CacheEntryFormat.encodeHead(Self.head)
        #expect(bytes.starts(with: Array("ABCACHE2".utf8)))
        #expect(try CacheEntryFormat.headBytesNeeded(prefix: bytes.prefix(CacheEntryFormat.prefixBytes)).get() == bytes.count)
        let (decoded, offset) = try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count) + 42).get()
        #expect(decoded == Self.head)
        #expect(offset == bytes.count)
        #expect(decoded.fields.map(\.name) == ["Content-Type", "ETag", "X-Ünïcode"])
        #expect(decoded.timing.requestTime.timeIntervalSince1970 == 1_800_000_000.123)
        #expect(decoded.timing.responseTime.timeIntervalSince1970 == 1_800_000_000.456)
    }

    @Test func aFileOfTheWrongLengthIsRefused() {
        let bytes = CacheEntryFormat.encodeHead(Self.head)
        #expect(throws: CacheEntryFormat.Failure.bodyLengthMismatch(expected: 42, found: 41)) {
            try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count) + 41).get()
        }
        #expect(throws: CacheEntryFormat.Failure.bodyLengthMismatch(expected: 42, found: 43)) {
            try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count) + 43).get()
        }
        #expect(throws: CacheEntryFormat.Failure.headTruncated) {
            try CacheEntryFormat.decodeHead(Array(bytes.dropLast()), fileSize: Int64(bytes.count) - 1).get()
        }
    }

    @Test(arguments: [
        ([], CacheEntryFormat.Failure.notAnEntry),
        (Array("ABCACHE".utf8), .notAnEntry),
        (Array("ABCACHE3".utf8) + [0, 0, 0, 2] + Array("{}".utf8) + [0, 0, 0, 0], .notAnEntry),
        (Array("ABCACHE2".utf8) + [0xFF, 0xFF, 0xFF, 0xFF], .headTruncated),
        (Array("ABCACHE2".utf8) + [0, 0, 0, 9] + Array("{}".utf8), .headTruncated),
    ] as [([UInt8], CacheEntryFormat.Failure)])
    func garbage(bytes: [UInt8], failure: CacheEntryFormat.Failure) {
        #expect(throws: failure) { try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count)).get() }
    }

    /// JSON whose checksum is right but which is no head, or says impossible things.
    @Test(arguments: ["{}", "[1,2]", "not json", #"{"method":"GET"}"#])
    func wellChecksummedNonsense(json: String) {
        let bytes = Self.entryHead(json: Array(json.utf8))
        #expect(throws: CacheEntryFormat.Failure.headUnreadable) { try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count)).get() }
    }

    /// A file of the first format (`ABCACHE1`, no body checksum) is no entry of this one, even
    /// whole and well checksummed: its body was never checked, so it is dropped at start.
    @Test func anEntryOfTheOldFormatIsNotOne() throws {
        var object = try Self.jsonObject(Self.head)
        object["bodyCRC32"] = nil
        let json = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        let old = Self.entryHead(json: Array(json), magic: Array("ABCACHE1".utf8))
        #expect(throws: CacheEntryFormat.Failure.notAnEntry) { try CacheEntryFormat.decodeHead(old, fileSize: Int64(old.count) + 42).get() }
    }

    /// A head of this format that lacks the body's checksum (or has no number there) is not one
    /// a writer made: unreadable, never a body taken unchecked.
    @Test(arguments: [nil, "null", #""12""#, "-1", "4294967296", "1.5"])
    func aHeadWithoutAUsableBodyChecksumIsUnreadable(value: String?) throws {
        var object = try Self.jsonObject(Self.head)
        object["bodyCRC32"] = try value.map { try JSONSerialization.jsonObject(with: Data($0.utf8), options: .fragmentsAllowed) }
        let json = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])
        let bytes = Self.entryHead(json: Array(json))
        #expect(throws: CacheEntryFormat.Failure.headUnreadable) {
            try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count) + 42).get()
        }
    }

    /// An empty body's CRC-32 is 0; a head that says otherwise is not a writer's.
    @Test func anEmptyBodyWithAChecksumIsUnreadable() {
        var head = Self.head
        head.bodyLength = 0
        head.bodyCRC32 = 0
        let empty = CacheEntryFormat.encodeHead(head)
        #expect((try? CacheEntryFormat.decodeHead(empty, fileSize: Int64(empty.count)).get())?.head == head)
        head.bodyCRC32 = 1
        let bytes = CacheEntryFormat.encodeHead(head)
        #expect(throws: CacheEntryFormat.Failure.headUnreadable) { try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count)).get() }
    }

    @Test func theBodyIsCheckedAgainstItsChecksum() throws {
        var checksum = CRC32()
        // In pieces, as a body streams in or is read back.
        for piece in [Self.body[0..<5], Self.body[5..<5], Self.body[5..<40], Self.body[40...]] { checksum.update(piece) }
        #expect(checksum.value == CRC32.checksum(Self.body))
        try CacheEntryFormat.checkBody(checksum, length: 42, against: Self.head).get()

        // What a power cut leaves: the length intact, some blocks zeros (or old data).
        for damaged in [
            [UInt8](repeating: 0, count: 42),
            Array(Self.body[0..<20]) + [UInt8](repeating: 0, count: 22),
            Array(Self.body.reversed()),
        ] {
            #expect(throws: CacheEntryFormat.Failure.bodyCorrupt) {
                try CacheEntryFormat.checkBody(Self.crc(damaged), length: 42, against: Self.head).get()
            }
        }
        // Every single changed byte is caught.
        for index in Self.body.indices {
            var damaged = Self.body
            damaged[index] ^= 0x01
            #expect(throws: CacheEntryFormat.Failure.bodyCorrupt) {
                try CacheEntryFormat.checkBody(Self.crc(damaged), length: 42, against: Self.head).get()
            }
        }
        // A checksum that is right for a prefix is still the wrong length.
        #expect(throws: CacheEntryFormat.Failure.bodyLengthMismatch(expected: 42, found: 41)) {
            try CacheEntryFormat.checkBody(Self.crc(Self.body.dropLast()), length: 41, against: Self.head).get()
        }
        // The wrong checksum in the head: the right body does not match it.
        var wrong = Self.head
        wrong.bodyCRC32 ^= 0x8000_0000
        #expect(throws: CacheEntryFormat.Failure.bodyCorrupt) { try CacheEntryFormat.checkBody(checksum, length: 42, against: wrong).get() }
    }

    /// The head is written twice: reserved at the start, then over it at the end with the real
    /// length and checksum, which must fit whatever they are.
    @Test func theReservedHeadFitsAnyLengthAndChecksum() throws {
        var head = Self.head
        head.bodyLength = 0
        head.bodyCRC32 = 0
        let reserved = CacheEntryFormat.reservedJSONLength(for: head)
        let start = CacheEntryFormat.encodeHead(head, paddedTo: reserved)
        for (length, crc) in [(Int64(0), UInt32(0)), (1, 1), (1 << 40, 0xDEAD_BEEF), (1 << 40, UInt32.max)] {
            head.bodyLength = length
            head.bodyCRC32 = crc
            let end = CacheEntryFormat.encodeHead(head, paddedTo: reserved)
            #expect(end.count == start.count)
            let decoded = try CacheEntryFormat.decodeHead(end, fileSize: Int64(end.count) + length).get()
            #expect(decoded.head.bodyCRC32 == crc && decoded.head.bodyLength == length)
        }
        head.bodyLength = Int64.max
        head.bodyCRC32 = UInt32.max
        #expect(CacheEntryFormat.encodeHead(head, paddedTo: reserved).count == start.count)
    }

    @Test func aNegativeBodyLengthIsUnreadable() {
        var head = Self.head
        head.bodyLength = -1
        let bytes = CacheEntryFormat.encodeHead(head)
        #expect(throws: CacheEntryFormat.Failure.headUnreadable) { try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count)).get() }
    }

    /// A torn or altered head is never taken for another: every single changed byte is caught.
    @Test func everyChangedByteOfTheHeadIsCaught() {
        let bytes = CacheEntryFormat.encodeHead(Self.head)
        for index in bytes.indices {
            for flip: UInt8 in [0x01, 0x80, 0xFF] {
                var damaged = bytes
                damaged[index] ^= flip
                let result = CacheEntryFormat.decodeHead(damaged, fileSize: Int64(damaged.count) + 42)
                if case .success(let decoded) = result {
                    Issue.record("byte \(index) ^ \(flip) went unnoticed: \(decoded.head)")
                }
            }
        }
    }

    @Test func randomBytesNeverCrash() {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        for _ in 0..<2000 {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            let count = Int(state >> 56)
            var bytes = (count % 2 == 0 ? CacheEntryFormat.magic : []) + [UInt8]()
            for _ in 0..<count {
                state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
                bytes.append(UInt8(state >> 56))
            }
            _ = CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count))
            _ = CacheEntryFormat.decodeHead(bytes, fileSize: -1)
        }
    }

    @Test func fileNamesAreStableAndSeparateKeys() {
        let name = CacheEntryFormat.fileName(method: "GET", url: "https://api.test/items", variantKey: "")
        #expect(name == CacheEntryFormat.fileName(method: "GET", url: "https://api.test/items", variantKey: ""))
        #expect(name.count == 22 && name.hasSuffix(".entry") && name.dropLast(6).allSatisfy(\.isHexDigit))
        #expect(name != CacheEntryFormat.fileName(method: "GET", url: "https://api.test/items", variantKey: "accept:x"))
        #expect(name != CacheEntryFormat.fileName(method: "GET", url: "https://api.test/Items", variantKey: ""))
    }

    @Test func crc32MatchesZlib() {
        #expect(CRC32.checksum(Array("123456789".utf8)) == 0xCBF4_3926)
        #expect(CRC32.checksum("123456789".utf8) == 0xCBF4_3926)
        #expect(CRC32.checksum([]) == 0)
        // Not contiguous: the same sum.
        #expect(CRC32.checksum(Array("123456789".utf8).lazy.map { $0 }) == 0xCBF4_3926)
        // The check value of the bytes 0...255 (the same as the table loop this replaced).
        #expect(CRC32.checksum((0...255).map { UInt8($0) }) == 0x2905_8C73)
    }
}
