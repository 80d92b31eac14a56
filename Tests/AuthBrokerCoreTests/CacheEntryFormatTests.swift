import AuthBrokerCore
import Foundation
import Testing

/// The cache's file format: a head that round-trips, and every way a file can be wrong caught
/// before anything is served from it.
struct CacheEntryFormatTests {
    static let head = CacheEntryFormat.Head(
        method: "GET", url: "https://api.test/items?page=2", variantKey: "accept-encoding:gzip", varyFields: ["accept-encoding"],
        status: 200, headers: [("Content-Type", "application/json"), ("ETag", "\"v1\""), ("X-Ünïcode", "välue")],
        requestTime: Date(timeIntervalSince1970: 1_800_000_000.123), responseTime: Date(timeIntervalSince1970: 1_800_000_000.456),
        bodyLength: 42
    )

    @Test func aHeadRoundTrips() throws {
        let bytes = CacheEntryFormat.encodeHead(Self.head)
        #expect(bytes.starts(with: Array("ABCACHE1".utf8)))
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
        (Array("ABCACHE2".utf8) + [0, 0, 0, 2] + Array("{}".utf8) + [0, 0, 0, 0], .notAnEntry),
        (Array("ABCACHE1".utf8) + [0xFF, 0xFF, 0xFF, 0xFF], .headTruncated),
        (Array("ABCACHE1".utf8) + [0, 0, 0, 9] + Array("{}".utf8), .headTruncated),
    ] as [([UInt8], CacheEntryFormat.Failure)])
    func garbage(bytes: [UInt8], failure: CacheEntryFormat.Failure) {
        #expect(throws: failure) { try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count)).get() }
    }

    /// JSON whose checksum is right but which is no head, or says impossible things.
    @Test(arguments: ["{}", "[1,2]", "not json", #"{"method":"GET"}"#])
    func wellChecksummedNonsense(json: String) {
        let body = Array(json.utf8)
        var bytes = CacheEntryFormat.magic
        bytes += [0, 0, UInt8(body.count >> 8), UInt8(body.count & 0xFF)] + body
        let crc = CRC32.checksum(body)
        bytes += [UInt8(crc >> 24), UInt8((crc >> 16) & 0xFF), UInt8((crc >> 8) & 0xFF), UInt8(crc & 0xFF)]
        #expect(throws: CacheEntryFormat.Failure.headUnreadable) { try CacheEntryFormat.decodeHead(bytes, fileSize: Int64(bytes.count)).get() }
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
