import AuthBrokerCore
import AuthBrokerDaemon
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import Testing

/// The cache's store on real files in a scratch directory: entries written and read back,
/// variants, the size limit, and a directory of torn and foreign files at start.
@Suite("HTTP cache store")
struct ResponseCacheTests {
    static let logger = Logger(label: "test")

    static func settings(maxMegabytes: Int = 16) -> BrokerSettings.Cache {
        var settings = BrokerSettings.Cache()
        settings.enabled = true
        settings.maxSizeMegabytes = maxMegabytes
        return settings
    }

    static func scratch() throws -> String {
        let path = NSTemporaryDirectory() + "authbroker-cache-test-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    static func head(_ url: String, vary: [String] = [], variantKey: String = "", headers: [(String, String)] = []) -> CacheEntryFormat.Head {
        CacheEntryFormat.Head(
            method: "GET", url: url, variantKey: variantKey, varyFields: vary, status: 200,
            headers: [("Cache-Control", "max-age=600")] + headers, requestTime: Date(), responseTime: Date(), bodyLength: 0
        )
    }

    /// Stores `body` (in `parts` pieces) as the response for `head`.
    @discardableResult
    static func store(_ cache: ResponseCache, _ head: CacheEntryFormat.Head, body: [UInt8], parts: Int = 1) async throws -> Bool {
        let writer = try #require(await cache.startEntry(head))
        let size = max(1, (body.count + parts - 1) / parts)
        var offset = 0
        while offset < body.count {
            await writer.append(ByteBuffer(bytes: body[offset..<min(body.count, offset + size)]))
            offset += size
        }
        return await writer.commit()
    }

    static func readBody(_ cache: ResponseCache, _ entry: ResponseCache.Entry) async throws -> [UInt8]? {
        guard let opened = await cache.open(entry) else { return nil }
        var bytes: [UInt8] = []
        while let chunk = try await opened.body?.next() { bytes += chunk.readableBytesView }
        return bytes
    }

    @Test("an entry is written in parts, read back whole, and found again after a restart")
    func roundTrip() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        // Larger than one read chunk and one write batch, and not a multiple of either.
        let body = (0..<(600 * 1024 + 7)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        #expect(try await Self.store(cache, Self.head("https://a.test/x", headers: [("ETag", "\"1\"")]), body: body, parts: 13))
        let entry = try #require(cache.lookup(url: "https://a.test/x", requestHeaders: [:]))
        #expect(entry.head.bodyLength == Int64(body.count))
        #expect(entry.headers.first(name: "etag") == "\"1\"")
        #expect(try await Self.readBody(cache, entry) == body)
        #expect(cache.lookup(url: "https://a.test/y", requestHeaders: [:]) == nil)
        #expect(cache.counters.entries == 1 && cache.counters.stores == 1)
        // Files are the user's alone, and nothing temporary is left.
        let names = try FileManager.default.contentsOfDirectory(atPath: directory)
        #expect(names == [entry.fileName])
        let mode = try FileManager.default.attributesOfItem(atPath: directory + "/" + entry.fileName)[.posixPermissions] as? Int
        #expect(mode == 0o600)

        let reopened = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        let again = try #require(reopened.lookup(url: "https://a.test/x", requestHeaders: [:]))
        #expect(try await Self.readBody(reopened, again) == body)
    }

    @Test("variants by Vary are told apart by the request's fields")
    func variants() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        for language in ["en", "de"] {
            let request: HTTPHeaders = ["Accept-Language": language]
            let key = CachePolicy.variantKey(varyingOn: ["accept-language"], request: request)
            try await Self.store(cache, Self.head("https://a.test/v", vary: ["accept-language"], variantKey: key), body: Array(language.utf8))
        }
        for language in ["en", "de"] {
            let entry = try #require(cache.lookup(url: "https://a.test/v", requestHeaders: ["Accept-Language": language]))
            #expect(try await Self.readBody(cache, entry) == Array(language.utf8))
        }
        #expect(cache.lookup(url: "https://a.test/v", requestHeaders: ["Accept-Language": "fr"]) == nil)
        #expect(await cache.remove(urls: ["https://a.test/v"]) == 2)
        #expect(cache.lookup(url: "https://a.test/v", requestHeaders: ["Accept-Language": "en"]) == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
    }

    @Test("past the size limit the least recently used entries go; one larger than the cache is not kept")
    func leastRecentlyUsedEviction() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(maxMegabytes: 1), fallbackRoot: nil, logger: Self.logger)
        let body = [UInt8](repeating: 7, count: 300 * 1024)
        for name in ["a", "b", "c"] { try await Self.store(cache, Self.head("https://a.test/\(name)"), body: body) }
        // "a" used last: "b" is the least recently used when "d" comes.
        _ = cache.lookup(url: "https://a.test/a", requestHeaders: [:])
        try await Self.store(cache, Self.head("https://a.test/d"), body: body)
        #expect(cache.lookup(url: "https://a.test/b", requestHeaders: [:]) == nil)
        for name in ["a", "c", "d"] { #expect(cache.lookup(url: "https://a.test/\(name)", requestHeaders: [:]) != nil, "\(name)") }
        #expect(cache.counters.evictions == 1)
        #expect(cache.counters.bytes <= 1 << 20)

        let huge = [UInt8](repeating: 1, count: (1 << 20) + 1)
        #expect(try await Self.store(cache, Self.head("https://a.test/huge"), body: huge, parts: 8) == false)
        #expect(cache.lookup(url: "https://a.test/huge", requestHeaders: [:]) == nil)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasPrefix(".tmp-") }.isEmpty)
    }

    @Test("small entries with large heads: the index stays within its memory budget, least recently used first, also after a restart")
    func indexMemoryBudget() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let budget = 256 * 1024
        let cache = try await ResponseCache.open(
            directory: directory, settings: Self.settings(), fallbackRoot: nil, indexBudget: budget, logger: Self.logger
        )
        // What a hostile origin sends: tiny bodies, 8 KiB of header each.
        let padding = [("X-Padding", String(repeating: "p", count: 8 * 1024))]
        for index in 0..<200 {
            try await Self.store(cache, Self.head("https://a.test/\(index)", headers: padding), body: [1])
            // The first one stays in use, so it is never the least recently used.
            _ = cache.lookup(url: "https://a.test/0", requestHeaders: [:])
        }
        let entries = cache.entries()
        #expect(entries.reduce(0) { $0 + $1.entry.indexBytes } <= budget)
        #expect(entries.count < 20 && cache.counters.evictions == 200 - entries.count, "\(entries.count) entries")
        #expect(cache.lookup(url: "https://a.test/0", requestHeaders: [:]) != nil, "the entry in use stays")
        #expect(cache.lookup(url: "https://a.test/199", requestHeaders: [:]) != nil, "the newest stays")
        #expect(cache.lookup(url: "https://a.test/100", requestHeaders: [:]) == nil)
        // The evicted ones' files are gone too.
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).count == entries.count)

        let reopened = try await ResponseCache.open(
            directory: directory, settings: Self.settings(), fallbackRoot: nil, indexBudget: budget / 2, logger: Self.logger
        )
        // (Which go then follows the files' ages, to the second: these are all of one.)
        #expect(reopened.entries().reduce(0) { $0 + $1.entry.indexBytes } <= budget / 2)
        #expect(!reopened.entries().isEmpty)
    }

    @Test("at start, entries an older build stored and this one would not (a 401, a cookie's value in the variant key) are removed")
    func olderBuildsEntriesRemoved() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        var challenge = Self.head("https://a.test/401")
        challenge.status = 401
        try await Self.store(cache, challenge, body: [])
        try await Self.store(cache, Self.head("https://a.test/cookie", vary: ["cookie"], variantKey: "cookie:sid=secret"), body: [1])
        try await Self.store(cache, Self.head("https://a.test/no-cookie", vary: ["cookie"], variantKey: "cookie:"), body: [1])
        try await Self.store(cache, Self.head("https://a.test/kept"), body: [1])
        #expect(cache.counters.entries == 4)
        let reopened = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        #expect(Set(reopened.entries().map(\.entry.head.url)) == ["https://a.test/kept", "https://a.test/no-cookie"])
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).count == 2)
    }

    @Test("at start, temporary files, foreign files and torn entries are removed; whole entries stay")
    func recoversFromGarbage() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        try await Self.store(first, Self.head("https://a.test/whole"), body: Array("whole".utf8))
        try await Self.store(first, Self.head("https://a.test/torn"), body: [UInt8](repeating: 9, count: 4096))
        let torn = try #require(first.lookup(url: "https://a.test/torn", requestHeaders: [:]))
        // A body cut short, as a crash might leave it; a stranger's file; an unfinished write;
        // a head whose bytes were altered.
        let tornPath = directory + "/" + torn.fileName
        let tornBytes = try Data(contentsOf: URL(fileURLWithPath: tornPath))
        try tornBytes.prefix(tornBytes.count - 100).write(to: URL(fileURLWithPath: tornPath))
        try Data((0..<5000).map { _ in UInt8.random(in: 0...255) }).write(to: URL(fileURLWithPath: directory + "/0123456789abcdef.entry"))
        try Data("half".utf8).write(to: URL(fileURLWithPath: directory + "/.tmp-42"))
        var altered = CacheEntryFormat.encodeHead(Self.head("https://a.test/altered"))
        altered[CacheEntryFormat.prefixBytes + 3] ^= 0x20
        try Data(altered).write(to: URL(fileURLWithPath: directory + "/fedcba9876543210.entry"))
        // A whole entry of the first format (`ABCACHE1`, no body checksum): not ours any more.
        try await Self.store(first, Self.head("https://a.test/old"), body: Array("old".utf8))
        let old = try #require(first.lookup(url: "https://a.test/old", requestHeaders: [:]))
        var oldBytes = try Data(contentsOf: URL(fileURLWithPath: directory + "/" + old.fileName))
        oldBytes.replaceSubrange(0..<8, with: Data("ABCACHE1".utf8))
        try oldBytes.write(to: URL(fileURLWithPath: directory + "/" + old.fileName))

        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        #expect(cache.lookup(url: "https://a.test/torn", requestHeaders: [:]) == nil)
        let whole = try #require(cache.lookup(url: "https://a.test/whole", requestHeaders: [:]))
        #expect(try await Self.readBody(cache, whole) == Array("whole".utf8))
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == [whole.fileName])
        #expect(cache.counters.entries == 1)
    }

    /// Overwrites `count` body bytes of `entry`'s file from `at` with zeros, the length kept:
    /// what a disk that lost blocks in a power cut leaves.
    static func zeroBody(_ directory: String, _ entry: ResponseCache.Entry, at: Int, count: Int) throws {
        let handle = try #require(FileHandle(forWritingAtPath: directory + "/" + entry.fileName))
        try handle.seek(toOffset: UInt64(entry.bodyOffset + at))
        try handle.write(contentsOf: Data(count: count))
        try handle.close()
    }

    @Test("a body found at start is checked before it is served: lost bytes (the length intact) drop the entry, whole ones are served")
    func lostBodyBytesAreNeverServed() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        // Read whole (and checked as read) and held in memory; checked in a pass of its own
        // (more than one read chunk, not a multiple of it).
        let small = (0..<1024).map { UInt8(truncatingIfNeeded: $0 &* 7 &+ 1) }
        let large = (0..<(3 * ResponseCache.readChunkBytes + 5)).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 1) }
        for (name, body) in [("small", small), ("large", large)] {
            for kind in ["lost", "whole"] { try await Self.store(first, Self.head("https://a.test/\(name)-\(kind)"), body: body, parts: 3) }
            // Written by this process: trusted, no check needed.
            #expect(first.lookup(url: "https://a.test/\(name)-whole", requestHeaders: [:])?.bodyVerified == true)
        }
        for name in ["small", "large"] {
            let entry = try #require(first.lookup(url: "https://a.test/\(name)-lost", requestHeaders: [:]))
            // The last block of a large one: only a pass over the whole body finds it.
            try Self.zeroBody(directory, entry, at: name == "small" ? 100 : large.count - 4096, count: name == "small" ? 512 : 4096)
        }

        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        #expect(cache.counters.entries == 4)
        for (name, body) in [("small", small), ("large", large)] {
            let lost = try #require(cache.lookup(url: "https://a.test/\(name)-lost", requestHeaders: [:]))
            #expect(!lost.bodyVerified)
            #expect(await cache.open(lost) == nil, "\(name)")
            #expect(cache.lookup(url: "https://a.test/\(name)-lost", requestHeaders: [:]) == nil)
            #expect(!FileManager.default.fileExists(atPath: directory + "/" + lost.fileName))

            let whole = try #require(cache.lookup(url: "https://a.test/\(name)-whole", requestHeaders: [:]))
            #expect(!whole.bodyVerified)
            #expect(try await Self.readBody(cache, whole) == body, "\(name)")
            // Checked once: marked so, and a small one is in memory now.
            let again = try #require(cache.lookup(url: "https://a.test/\(name)-whole", requestHeaders: [:]))
            #expect(again.bodyVerified)
            #expect((again.memoryBody != nil) == (name == "small"))
            #expect(try await Self.readBody(cache, again) == body, "\(name)")
        }
        #expect(cache.counters.entries == 2)
    }

    @Test("new headers from a 304 for an entry whose body the disk lost drop it, rather than copy the lost bytes as checked")
    func replacingHeadersChecksTheBody() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        let body = [UInt8](repeating: 5, count: 70_000)
        for name in ["lost", "whole"] { try await Self.store(first, Self.head("https://a.test/\(name)"), body: body) }
        try Self.zeroBody(directory, try #require(first.lookup(url: "https://a.test/lost", requestHeaders: [:])), at: 8192, count: 4096)

        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        for name in ["lost", "whole"] {
            let entry = try #require(cache.lookup(url: "https://a.test/\(name)", requestHeaders: [:]))
            var updated = entry.headers
            updated.replaceOrAdd(name: "Cache-Control", value: "max-age=60")
            await cache.replaceHeaders(of: entry, with: updated, timing: .init(requestTime: Date(), responseTime: Date()))
        }
        #expect(cache.lookup(url: "https://a.test/lost", requestHeaders: [:]) == nil)
        let replaced = try #require(cache.lookup(url: "https://a.test/whole", requestHeaders: [:]))
        #expect(replaced.headers.first(name: "cache-control") == "max-age=60")
        // The copy checked it: the new entry is as trusted as one written now.
        #expect(replaced.bodyVerified)
        #expect(try await Self.readBody(cache, replaced) == body)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == [replaced.fileName])
    }

    @Test("a small body is held in memory as well: served without its file, and read into memory again after a restart")
    func smallBodiesInMemory() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        try await Self.store(cache, Self.head("https://a.test/small"), body: Array("small".utf8))
        let entry = try #require(cache.lookup(url: "https://a.test/small", requestHeaders: [:]))
        #expect(entry.memoryBody.map { Array($0.readableBytesView) } == Array("small".utf8))

        let reopened = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        let cold = try #require(reopened.lookup(url: "https://a.test/small", requestHeaders: [:]))
        #expect(cold.memoryBody == nil)
        #expect(try await Self.readBody(reopened, cold) == Array("small".utf8))
        try FileManager.default.removeItem(atPath: directory + "/" + cold.fileName)
        let warm = try #require(reopened.lookup(url: "https://a.test/small", requestHeaders: [:]))
        #expect(try await Self.readBody(reopened, warm) == Array("small".utf8))
    }

    @Test("removing an entry by a copy looked up before its body was held in memory gives that memory back")
    func removeByAnOlderCopy() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let first = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        try await Self.store(first, Self.head("https://a.test/held"), body: Array("held in memory".utf8))
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        let cold = try #require(cache.lookup(url: "https://a.test/held", requestHeaders: [:]))
        #expect(cold.memoryBody == nil && cache.memoryBytesHeld == 0)
        // Another request reads it: the index's copy now holds the body; `cold` does not know.
        let other = try #require(cache.lookup(url: "https://a.test/held", requestHeaders: [:]))
        #expect(try await Self.readBody(cache, other) == Array("held in memory".utf8))
        #expect(cache.memoryBytesHeld == "held in memory".utf8.count)
        await cache.remove(cold)
        #expect(cache.lookup(url: "https://a.test/held", requestHeaders: [:]) == nil)
        #expect(cache.memoryBytesHeld == 0, "the held body's bytes were counted as still held")
    }

    @Test("a file changed under the index is not served: the entry is dropped")
    func changedFileIsDropped() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        // Larger than what is held in memory: served from its file.
        try await Self.store(cache, Self.head("https://a.test/x"), body: [UInt8](repeating: 1, count: ResponseCache.memoryEntryLimit + 1))
        let entry = try #require(cache.lookup(url: "https://a.test/x", requestHeaders: [:]))
        #expect(entry.memoryBody == nil)
        let handle = try #require(FileHandle(forWritingAtPath: directory + "/" + entry.fileName))
        try handle.seekToEnd()
        try handle.write(contentsOf: Data("more".utf8))
        try handle.close()
        #expect(await cache.open(entry) == nil)
        #expect(cache.lookup(url: "https://a.test/x", requestHeaders: [:]) == nil)
        #expect(cache.counters.entries == 0)
    }

    @Test("new headers from a 304 replace the stored ones; the body stays")
    func replacesHeaders() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        let body = [UInt8](repeating: 5, count: 70_000)
        try await Self.store(cache, Self.head("https://a.test/x", headers: [("ETag", "\"1\"")]), body: body)
        let entry = try #require(cache.lookup(url: "https://a.test/x", requestHeaders: [:]))
        var updated = entry.headers
        updated.replaceOrAdd(name: "Cache-Control", value: "max-age=60")
        await cache.replaceHeaders(of: entry, with: updated, timing: .init(requestTime: Date(), responseTime: Date()))
        let replaced = try #require(cache.lookup(url: "https://a.test/x", requestHeaders: [:]))
        #expect(replaced.headers.first(name: "cache-control") == "max-age=60")
        #expect(try await Self.readBody(cache, replaced) == body)
        #expect(cache.counters.entries == 1)
    }

    @Test("a response not stored whole (discarded, or its writer dropped) leaves nothing behind")
    func discardedWritesLeaveNothing() async throws {
        let directory = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cache = try await ResponseCache.open(directory: directory, settings: Self.settings(), fallbackRoot: nil, logger: Self.logger)
        let discarded = try #require(await cache.startEntry(Self.head("https://a.test/1")))
        await discarded.append(ByteBuffer(bytes: [1, 2, 3]))
        await discarded.discard()
        do {
            let dropped = try #require(await cache.startEntry(Self.head("https://a.test/2")))
            await dropped.append(ByteBuffer(bytes: [1, 2, 3]))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
        #expect(cache.lookup(url: "https://a.test/1", requestHeaders: [:]) == nil)
    }
}
