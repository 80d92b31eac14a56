import AuthBrokerCore
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// The broker's HTTP cache on disk: one file per stored response (`CacheEntryFormat`), an index
/// in memory rebuilt from the files' heads at start, least-recently-used eviction under a size
/// limit. What to store and when to reuse it is `CachePolicy`'s; this type only keeps entries.
///
/// Every change to the directory's names (the rename that installs an entry, the unlinks of
/// eviction and invalidation) happens under the index lock, on `NIOThreadPool` threads: the
/// index never names a file another change has just replaced. Readers open a file and check
/// its size against the head before serving it, and the body's checksum too the first time an
/// entry found at start is served; an unlinked file stays readable to whoever has it open.
package final class ResponseCache: Sendable {
    /// One stored response, as the index knows it.
    package struct Entry: Sendable {
        package let head: CacheEntryFormat.Head
        package let headers: HTTPHeaders
        package let fileName: String
        package let bodyOffset: Int
        /// The body, for a small entry held in memory too (`memoryEntryLimit`): a hit then
        /// needs no trip to the thread pool. Only ever a verified body.
        package var memoryBody: ByteBuffer? = nil
        /// Its freshness and age, worked out once here rather than on every hit.
        package let freshness: CachePolicy.StoredFreshness
        /// The fields every client gets with it (`Interceptor.storedClientHeaders`), made once
        /// for the direct relay's hits.
        package let clientHeaders: HTTPHeaders
        /// Its status line and `clientHeaders`, framed as `ResponseEncoder` frames them and
        /// encoded once (`ResponseHeadEncoding.openHead`), for the direct relay's hits, which
        /// copy it and add their own fields. Only for an entry small enough for a direct hit
        /// (`memoryEntryLimit`): a large one never gets one, and need not hold the bytes. Nil
        /// too when a field cannot be sent (such a hit takes the way through `HTTPHeaders`,
        /// whose encoder then refuses it).
        package let clientHead: ByteBuffer?
        /// Whether the body on disk is known to match `head.bodyCRC32`: written by this process
        /// (which computed the checksum from the bytes it wrote), or checked once since start.
        /// An entry found at start is not, until its first use checks it (`openBody`).
        package var bodyVerified: Bool

        package var fileBytes: Int64 { Int64(self.bodyOffset) + self.head.bodyLength }

        /// About what the index holds for it in memory: its fields three times over (the head's,
        /// `headers`, `clientHeaders`), the encoded client head, its URL and names. What bounds
        /// the index (`indexBudget`), since an origin picks how many and how large these are.
        package var indexBytes: Int {
            let fields = self.head.fields.reduce(0) { $0 + $1.name.utf8.count + $1.value.utf8.count + 32 }
            return 256 + 3 * fields + (self.clientHead?.readableBytes ?? 0) + 2 * self.head.url.utf8.count
                + self.head.variantKey.utf8.count + 2 * self.fileName.utf8.count
        }

        /// `fileName`: where it is; by default the name its key gives (`CacheEntryFormat.fileName`).
        /// `directHits`: it goes in the index, where the direct relay may answer from it (not a
        /// response still being stored, whose length is not known yet): only then does it get
        /// a `clientHead`.
        init(head: CacheEntryFormat.Head, bodyOffset: Int, fileName: String? = nil, bodyVerified: Bool, directHits: Bool = true) {
            self.head = head
            self.headers = HTTPHeaders(head.fields.map { ($0.name, $0.value) })
            self.freshness = CachePolicy.StoredFreshness(status: head.status, headers: self.headers, timing: head.timing)
            // Not logged: a 401 or 407 is never stored, so all this can remove is a final
            // Negotiate token in a 200's WWW-Authenticate, logged (at debug) when it first went out.
            self.clientHeaders = Interceptor.storedClientHeaders(
                self.headers, status: head.status, bodyLength: head.bodyLength, logger: Logger(label: "", factory: { _ in SwiftLogNoOpLogHandler() })
            )
            if directHits, head.bodyLength <= ResponseCache.memoryEntryLimit {
                let status = HTTPResponseStatus(statusCode: head.status)
                var framed = self.clientHeaders
                _ = ResponseEncoder.frame(&framed, mayHaveBody: status.mayHaveResponseBody)
                self.clientHead = try? ResponseHeadEncoding.openHead(version: .http1_1, status: status, headers: framed)
            } else {
                self.clientHead = nil
            }
            self.fileName = fileName ?? CacheEntryFormat.fileName(method: head.method, url: head.url, variantKey: head.variantKey)
            self.bodyOffset = bodyOffset
            // An empty body has nothing to lose (`decodeHead` holds its checksum to 0).
            self.bodyVerified = bodyVerified || head.bodyLength == 0
        }
    }

    package typealias Counters = CacheCounters

    package enum Event: Sendable {
        case hit, miss, revalidated, servedStale
    }

    /// What `waitForFill` found for its URL.
    private enum FillFound { case waiting, ended, storing(FillProgress) }

    /// One URL being fetched (`claimFill`): the requests waiting for it, and once its response
    /// is being stored, what they may follow.
    private struct Fill {
        var waiters: [UInt64: CheckedContinuation<FillProgress?, Never>] = [:]
        var progress: FillProgress?
    }

    private struct State {
        /// By canonical URL: the variants stored for it (`Vary`).
        var byURL: [String: [Entry]] = [:]
        /// File name → the URL it is stored under, and the tick of its last use (LRU).
        var files: [String: (url: String, lastUse: UInt64)] = [:]
        var tick: UInt64 = 0
        var counters = Counters()
        /// URLs a request is fetching now, to be stored: later misses wait for it (`claimFill`).
        var fills: [String: Fill] = [:]
        var nextWaiter: UInt64 = 0
        /// The bodies held in memory, in bytes (at most `memoryBudget`).
        var memoryBytes = 0
        /// What the index itself holds in memory (`Entry.indexBytes`), at most `indexBudget`.
        var indexBytes = 0
        /// Files by their last use, least recent first, made when eviction first needs it and
        /// kept lazily after: a use only moves the tick in `files` (hits stay cheap), and a
        /// file found here with an older tick than its own goes back in with the new one.
        var evictionOrder: EvictionOrder?
    }

    /// A binary min-heap of (last use, file name): the next eviction in O(log n), where a scan
    /// of every file per evicted entry made filling a cache of small entries quadratic.
    struct EvictionOrder {
        private var heap: [(tick: UInt64, name: String)] = []

        init(_ files: [String: (url: String, lastUse: UInt64)]) {
            for (name, file) in files { self.push(file.lastUse, name) }
        }

        var count: Int { self.heap.count }

        mutating func push(_ tick: UInt64, _ name: String) {
            self.heap.append((tick, name))
            var child = self.heap.count - 1
            while child > 0 {
                let parent = (child - 1) / 2
                guard self.heap[child].tick < self.heap[parent].tick else { break }
                self.heap.swapAt(child, parent)
                child = parent
            }
        }

        mutating func popOldest() -> (tick: UInt64, name: String)? {
            guard !self.heap.isEmpty else { return nil }
            self.heap.swapAt(0, self.heap.count - 1)
            let oldest = self.heap.removeLast()
            var parent = 0
            while true {
                let left = 2 * parent + 1
                let right = left + 1
                var smallest = parent
                if left < self.heap.count, self.heap[left].tick < self.heap[smallest].tick { smallest = left }
                if right < self.heap.count, self.heap[right].tick < self.heap[smallest].tick { smallest = right }
                guard smallest != parent else { break }
                self.heap.swapAt(parent, smallest)
                parent = smallest
            }
            return oldest
        }
    }

    package let directory: String
    package let settings: BrokerSettings.Cache
    private let state: NIOLockedValueBox<State>
    private let logger: Logger
    /// Bodies up to this size are read in one go; larger ones in chunks of it.
    package static let readChunkBytes = 256 * 1024
    /// Bodies up to this size are held in memory too (while `memoryBudget` allows): the hits
    /// that are most about per-request cost are served without touching the disk.
    package static let memoryEntryLimit = 256 * 1024
    /// The most all bodies held in memory take.
    package static let memoryBudget = 64 << 20
    /// The most the index itself takes in memory (`Entry.indexBytes`): past it, the least
    /// recently used entries go, as past the size on disk. A hostile origin's many small
    /// responses with large heads would otherwise hold gigabytes for a 1 GiB cache.
    package static let defaultIndexBudget = 64 << 20
    private let indexBudget: Int

    private init(directory: String, settings: BrokerSettings.Cache, state: State, indexBudget: Int, logger: Logger) {
        self.directory = directory
        self.settings = settings
        self.indexBudget = indexBudget
        self.state = NIOLockedValueBox(state)
        self.logger = logger
    }

    /// Opens (creating it, mode 0700) the cache directory and indexes what it holds: temporary
    /// files of unfinished writes and files that are not whole entries are removed.
    /// - Parameter indexBudget: `defaultIndexBudget`, or less for tests.
    package static func open(
        directory: String, settings: BrokerSettings.Cache, fallbackRoot: String?, indexBudget: Int = defaultIndexBudget, logger: Logger
    ) async throws -> ResponseCache {
        try await NIOThreadPool.singleton.runIfActive {
            try PrivateFiles.ensureDirectory(directory, what: "the HTTP cache directory", fallbackRoot: fallbackRoot)
            var state = State()
            state.counters.maxBytes = settings.maxBytes
            var found: [(entry: Entry, modified: Int)] = []
            var dropped = 0
            for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] {
                let path = directory + "/" + name
                if name.hasPrefix(".tmp-") {
                    unlink(path)
                    dropped += 1
                    continue
                }
                guard name.hasSuffix(".entry") else { continue }
                switch Self.readEntry(path: path, fileName: name) {
                case .success(let read) where Self.isNoLongerStorable(read.entry.head):
                    // Stored by an older build: a challenge, or a credential in its variant key.
                    unlink(path)
                    dropped += 1
                case .success(let read):
                    found.append(read)
                case .failure:
                    unlink(path)
                    dropped += 1
                }
            }
            // The oldest first, so the ticks follow the files' ages.
            let cache = ResponseCache(directory: directory, settings: settings, state: state, indexBudget: indexBudget, logger: logger)
            cache.state.withLockedValue { state in
                for (entry, _) in found.sorted(by: { $0.modified < $1.modified }) { Self.remember(entry, in: &state) }
                cache.evict(&state, beyond: settings.maxBytes)
            }
            if dropped > 0 {
                logger.notice("removed unusable files from the HTTP cache", metadata: ["count": "\(dropped)", "directory": "\(directory)"])
            }
            return cache
        }
    }

    /// What this build would not store (`CachePolicy.storage`) but an older one did: a 401 or
    /// 407, or an entry varying on a credential whose value its variant key holds.
    private static func isNoLongerStorable(_ head: CacheEntryFormat.Head) -> Bool {
        if head.status == 401 || head.status == 407 { return true }
        return CachePolicy.keepsCredential(variantKey: head.variantKey)
    }

    /// Reads and checks one entry's head; the body's length must match the file's size. The
    /// body's checksum is checked at its first use, not here: a start does not read the whole cache.
    private static func readEntry(path: String, fileName: String) -> Result<(entry: Entry, modified: Int), CacheEntryFormat.Failure> {
        CacheEntryFile.readHead(path).map { head, bodyOffset, modified in
            (Entry(head: head, bodyOffset: bodyOffset, fileName: fileName, bodyVerified: false), modified)
        }
    }

    // MARK: Looking up

    /// Whether responses from `host` are cached at all.
    package func covers(host: String) -> Bool {
        self.settings.enabled && (self.settings.hosts.isEmpty || self.settings.hosts.contains { $0.matches(host) })
    }

    /// The stored response for a GET (or HEAD) of `url` whose variant matches the request's
    /// fields, marked as used.
    package func lookup(url: String, requestHeaders: HTTPHeaders) -> Entry? {
        self.state.withLockedValue { state in
            guard let variants = state.byURL[url] else { return nil }
            guard
                let entry = variants.first(where: {
                    CachePolicy.variantKey(varyingOn: $0.head.varyFields, request: requestHeaders) == $0.head.variantKey
                })
            else { return nil }
            state.tick += 1
            state.files[entry.fileName]?.lastUse = state.tick
            return entry
        }
    }

    /// A hit the direct relay may answer by itself, with no task and no thread-pool trip: a
    /// fresh entry whose body is in memory, for a request that asks nothing of the cache (no
    /// `Cache-Control`, `Pragma`, conditional or range fields); nil sends the request to the
    /// full path, which decides everything else.
    package func directHit(for head: HTTPRequestHead, url: String) -> (entry: Entry, age: Int)? {
        for name in Self.fieldsForTheFullPath where head.headers.contains(name: name) { return nil }
        guard let entry = self.lookup(url: url, requestHeaders: head.headers), entry.head.bodyLength == 0 || entry.memoryBody != nil,
            case .fresh(let age) = CachePolicy.reuse(requestHeaders: head.headers, stored: entry.freshness, storedHeaders: entry.headers, now: Date())
        else { return nil }
        return (entry, age)
    }

    /// Fields that ask something of the cache, or an app's own validation: the full path decides.
    private static let fieldsForTheFullPath = ["cache-control", "pragma"] + CachePolicy.appValidationFields

    package func count(_ event: Event) {
        self.state.withLockedValue { state in
            switch event {
            case .hit: state.counters.hits += 1
            case .miss: state.counters.misses += 1
            case .revalidated: state.counters.revalidations += 1
            case .servedStale: state.counters.servedStale += 1
            }
        }
    }

    package var counters: Counters { self.state.withLockedValue { $0.counters } }

    /// The bytes of bodies held in memory now (at most `memoryBudget`).
    package var memoryBytesHeld: Int { self.state.withLockedValue { $0.memoryBytes } }

    /// `authbrokerctl offline on`: every request answered from the cache, none from the network.
    package var isOffline: Bool { self.state.withLockedValue { $0.counters.offline } }

    package func setOffline(_ offline: Bool) {
        self.state.withLockedValue { $0.counters.offline = offline }
    }

    /// Every entry, most recently used first (`authbrokerctl cache list`).
    package func entries() -> [(entry: Entry, lastUse: UInt64)] {
        self.state.withLockedValue { state in
            state.byURL.values.flatMap { $0 }.map { ($0, state.files[$0.fileName]?.lastUse ?? 0) }.sorted { $0.1 > $1.1 }
        }
    }

    // MARK: Collapsing concurrent misses

    /// Claims the fetching of `url`: true when no other request is fetching it (the caller does,
    /// and must `endFill` it); false when one is, and the caller may `waitForFill`.
    package func claimFill(url: String) -> Bool {
        self.state.withLockedValue { state in
            guard state.fills[url] == nil else { return false }
            state.fills[url] = Fill()
            return true
        }
    }

    /// The response of the request fetching `url` is being stored: those waiting (and those
    /// that come while it is) may follow it as it is written (`FillProgress.follow`).
    package func publishFill(url: String, progress: FillProgress) {
        let waiters = self.state.withLockedValue { state -> [UInt64: CheckedContinuation<FillProgress?, Never>] in
            guard state.fills[url] != nil else { return [:] }
            state.fills[url]?.progress = progress
            defer { state.fills[url]?.waiters = [:] }
            return state.fills[url]?.waiters ?? [:]
        }
        for waiter in waiters.values { waiter.resume(returning: progress) }
    }

    /// The request fetching `url` has stored its response, or will not: those waiting look again.
    package func endFill(url: String) {
        let fill = self.state.withLockedValue { state in state.fills.removeValue(forKey: url) }
        for waiter in (fill?.waiters ?? [:]).values { waiter.resume(returning: nil) }
    }

    /// Waits until the request fetching `url` ends its fill or starts storing its response, at
    /// most `timeout`: the response being stored, if it is (nil: look in the cache again).
    package func waitForFill(url: String, timeout: Duration) async -> FillProgress? {
        let id = self.state.withLockedValue { state in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        return await withCheckedContinuation { (continuation: CheckedContinuation<FillProgress?, Never>) in
            let found = self.state.withLockedValue { state -> FillFound in
                guard let fill = state.fills[url] else { return .ended }
                if let progress = fill.progress { return .storing(progress) }
                state.fills[url]?.waiters[id] = continuation
                return .waiting
            }
            switch found {
            case .ended:
                continuation.resume(returning: nil)
            case .storing(let progress):
                continuation.resume(returning: progress)
            case .waiting:
                // Only the wait for the response's head is bounded; following it is not.
                Task {
                    try? await Task.sleep(for: timeout)
                    let timedOut = self.state.withLockedValue { state in state.fills[url]?.waiters.removeValue(forKey: id) }
                    timedOut?.resume(returning: nil)
                }
            }
        }
    }

    // MARK: Removing

    /// Removes what is stored for these URLs (every variant); returns how many entries went.
    @discardableResult
    package func remove(urls: [String]) async -> Int {
        guard !urls.isEmpty else { return 0 }
        return (try? await NIOThreadPool.singleton.runIfActive {
            self.state.withLockedValue { state in
                var removed = 0
                for url in urls {
                    for entry in state.byURL[url] ?? [] {
                        self.drop(entry, from: &state)
                        removed += 1
                    }
                }
                return removed
            }
        }) ?? 0
    }

    /// Removes one entry, its file and its index entry (if it is still the one stored).
    package func remove(_ entry: Entry) async {
        _ = try? await NIOThreadPool.singleton.runIfActive {
            self.state.withLockedValue { state in
                // Not another entry written since under the same name: that one is whole.
                guard let index = Self.indexOf(entry, in: state), let stored = state.byURL[entry.head.url]?[index] else { return }
                // The index's copy, not the caller's: only it knows a body held in memory since.
                self.drop(stored, from: &state)
            }
        }
    }

    /// Removes what is stored under `entry`'s name now, rewritten since or not: the origin said
    /// the stored response is out of date (a HEAD's answer, RFC 9111 §4.3.5), and a rewrite by
    /// a 304 meanwhile kept the same body.
    package func invalidate(_ entry: Entry) async {
        _ = try? await NIOThreadPool.singleton.runIfActive {
            self.state.withLockedValue { state in
                guard let stored = Self.entry(named: entry.fileName, in: state), stored.head.url == entry.head.url else { return }
                self.drop(stored, from: &state)
            }
        }
    }

    /// Removes one entry found unusable when read (a torn or altered file).
    package func discard(_ entry: Entry) async {
        await self.remove(entry)
        self.logger.warning("dropped a cache entry that did not match its head", metadata: ["file": "\(entry.fileName)"])
    }

    /// Removes every entry; returns how many there were.
    @discardableResult
    package func clear() async -> Int {
        (try? await NIOThreadPool.singleton.runIfActive {
            self.state.withLockedValue { state in
                let all = state.byURL.values.flatMap { $0 }
                for entry in all { self.drop(entry, from: &state) }
                state.evictionOrder = nil
                return all.count
            }
        }) ?? 0
    }

    /// Under the lock: unlinks the entry's file and forgets it.
    private func drop(_ entry: Entry, from state: inout State) {
        unlink(self.directory + "/" + entry.fileName)
        Self.forget(entry, in: &state)
    }

    /// Under the lock: adds an entry to the index, as the most recently used.
    private static func remember(_ entry: Entry, in state: inout State) {
        state.byURL[entry.head.url, default: []].append(entry)
        state.tick += 1
        state.files[entry.fileName] = (entry.head.url, state.tick)
        state.evictionOrder?.push(state.tick, entry.fileName)
        // Installs under the limits push without popping: past twice the live names, it is made
        // again when next needed.
        if let order = state.evictionOrder, order.count > 2 * state.files.count + 64 { state.evictionOrder = nil }
        state.counters.entries += 1
        state.counters.bytes += entry.fileBytes
        state.memoryBytes += entry.memoryBody?.readableBytes ?? 0
        state.indexBytes += entry.indexBytes
    }

    /// Under the lock: takes an entry out of the index (its file is the caller's business).
    private static func forget(_ entry: Entry, in state: inout State) {
        state.byURL[entry.head.url]?.removeAll { $0.fileName == entry.fileName }
        if state.byURL[entry.head.url]?.isEmpty == true { state.byURL[entry.head.url] = nil }
        state.files[entry.fileName] = nil
        state.counters.entries -= 1
        state.counters.bytes -= entry.fileBytes
        state.memoryBytes -= entry.memoryBody?.readableBytes ?? 0
        state.indexBytes -= entry.indexBytes
    }

    /// The indexed entry whose file has this name.
    private static func entry(named fileName: String, in state: State) -> Entry? {
        state.files[fileName].flatMap { file in state.byURL[file.url]?.first { $0.fileName == fileName } }
    }

    /// Under the lock: drops the least recently used entries until `limit` (bytes on disk) and
    /// the index budget hold.
    private func evict(_ state: inout State, beyond limit: Int64, keeping kept: String? = nil) {
        while state.counters.bytes > limit || state.indexBytes > self.indexBudget {
            guard let entry = Self.leastRecentlyUsed(in: &state, except: kept) else { return }
            self.drop(entry, from: &state)
            state.counters.evictions += 1
        }
    }

    /// Under the lock: the least recently used entry but `kept`, from `evictionOrder` (made now
    /// if it is missing, or holds more stale names than live ones).
    private static func leastRecentlyUsed(in state: inout State, except kept: String?) -> Entry? {
        if state.evictionOrder == nil || (state.evictionOrder?.count ?? 0) > 2 * state.files.count + 64 {
            state.evictionOrder = EvictionOrder(state.files)
        }
        var keptElement: (tick: UInt64, name: String)?
        defer { if let keptElement { state.evictionOrder?.push(keptElement.tick, keptElement.name) } }
        while let oldest = state.evictionOrder?.popOldest() {
            // Forgotten since: its name is stale.
            guard let file = state.files[oldest.name] else { continue }
            if file.lastUse != oldest.tick {
                // Used since: back in at its new place.
                state.evictionOrder?.push(file.lastUse, oldest.name)
                continue
            }
            if oldest.name == kept {
                keptElement = oldest
                continue
            }
            if let entry = Self.entry(named: oldest.name, in: state) { return entry }
        }
        return nil
    }

    // MARK: Reading

    /// A stored body, opened and checked against its head: nil when the file is gone, not the
    /// size its head says, or (the first time an entry found at start is used) not the bytes its
    /// checksum says; then the entry is dropped and the request is a miss.
    package func openBody(_ entry: Entry) async -> StoredBody? {
        if let memory = entry.memoryBody { return StoredBody(memory: memory) }
        let path = self.directory + "/" + entry.fileName
        let small = entry.head.bodyLength <= Self.readChunkBytes
        let opened: StoredBody?
        do {
            opened = try await NIOThreadPool.singleton.runIfActive {
                guard let (fd, _, _) = CacheEntryFile.openForReading(path, expectedSize: entry.fileBytes) else { return nil }
                let body = StoredBody(fd: fd, offset: Int64(entry.bodyOffset), length: entry.head.bodyLength)
                // Most bodies are small: read them now, in the same trip to the thread pool, and
                // checked there too, being whole in hand.
                if small {
                    body.readAheadOnThisThread()
                    if !entry.bodyVerified, !body.readAheadMatches(entry.head) { return nil }
                }
                return body
            }
        } catch {
            // The thread pool is stopping, and the daemon with it: the entry is not at fault.
            return nil
        }
        guard let opened else {
            await self.discard(entry)
            return nil
        }
        if !entry.bodyVerified {
            // A large one: one pass over the file before its first byte goes out, through the
            // descriptor that then serves it (the bytes checked are the bytes sent).
            if !small {
                switch await opened.verify(against: entry.head) {
                case .matches: break
                case .differs:
                    await self.discard(entry)
                    return nil
                case .unread:
                    return nil
                }
            }
            self.markVerified(entry)
        }
        if let body = opened.readAheadBody, body.readableBytes <= Self.memoryEntryLimit {
            // Read from disk once (after a restart, say): held in memory from now on.
            self.holdInMemory(entry, body: body)
        }
        return opened
    }

    /// The index's own copy of `entry`, if it still holds that one (not another written since
    /// under the same name).
    private static func indexOf(_ entry: Entry, in state: State) -> Int? {
        state.byURL[entry.head.url]?.firstIndex { $0.fileName == entry.fileName && $0.head == entry.head }
    }

    /// Its body was checked: later uses (each request that copied the entry before this one
    /// may still check it once) skip the pass.
    private func markVerified(_ entry: Entry) {
        self.state.withLockedValue { state in
            guard let index = Self.indexOf(entry, in: state) else { return }
            state.byURL[entry.head.url]?[index].bodyVerified = true
        }
    }

    /// Keeps a small entry's (verified) body in memory too, if the budget allows.
    private func holdInMemory(_ entry: Entry, body: ByteBuffer) {
        self.state.withLockedValue { state in
            guard state.memoryBytes + body.readableBytes <= Self.memoryBudget,
                let index = Self.indexOf(entry, in: state),
                state.byURL[entry.head.url]?[index].memoryBody == nil
            else { return }
            state.byURL[entry.head.url]?[index].memoryBody = body
            state.memoryBytes += body.readableBytes
        }
    }

    /// A stored response ready to be served: its body opened and checked (none when empty);
    /// nil when the entry turns out unusable (it is dropped, and the request goes to the origin).
    package func open(_ entry: Entry) async -> OpenedCacheEntry? {
        guard entry.head.bodyLength > 0 else { return OpenedCacheEntry(entry: entry, body: nil) }
        guard let body = await self.openBody(entry) else { return nil }
        return OpenedCacheEntry(entry: entry, body: body)
    }

    // MARK: Writing

    /// Starts storing a response whose head is `head` (its `bodyLength` is filled in at the
    /// end); nil when the file cannot be created (the response still goes to the client).
    package func startEntry(_ head: CacheEntryFormat.Head) async -> CacheEntryWriter? {
        let reserved = CacheEntryFormat.reservedJSONLength(for: head)
        let bytes = CacheEntryFormat.encodeHead(head, paddedTo: reserved)
        let temporary = self.directory + "/.tmp-" + String(UInt64.random(in: .min ... .max), radix: 16)
        let fd: CInt? = try? await NIOThreadPool.singleton.runIfActive {
            // Readable too: requests following the fill read it through duplicates of this descriptor.
            let fd = Glibc.open(temporary, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
            guard fd >= 0 else { return nil }
            guard CacheEntryFile.write(fd, bytes, at: 0) else {
                close(fd)
                unlink(temporary)
                return nil
            }
            return fd
        }
        guard let fd else {
            self.logger.debug("cannot create a cache entry", metadata: ["directory": "\(self.directory)"])
            return nil
        }
        return CacheEntryWriter(
            cache: self, fd: fd, temporaryPath: temporary, head: head, reservedJSONLength: reserved, bodyOffset: bytes.count
        )
    }

    /// Installs a written entry under its final name (replacing whatever had that name), then
    /// evicts down to the size limit. Runs on the thread pool.
    fileprivate func install(temporaryPath: String, entry: Entry) -> Bool {
        self.state.withLockedValue { state in
            var entry = entry
            guard rename(temporaryPath, self.directory + "/" + entry.fileName) == 0 else {
                unlink(temporaryPath)
                return false
            }
            // The file of any entry of that name is gone now; so is its index entry.
            if let old = Self.entry(named: entry.fileName, in: state) { Self.forget(old, in: &state) }
            if let body = entry.memoryBody, state.memoryBytes + body.readableBytes > Self.memoryBudget { entry.memoryBody = nil }
            Self.remember(entry, in: &state)
            state.counters.stores += 1
            self.evict(&state, beyond: self.settings.maxBytes, keeping: entry.fileName)
            if state.counters.bytes > self.settings.maxBytes {
                // Larger than the whole cache by itself: not kept after all.
                self.drop(entry, from: &state)
                return false
            }
            return true
        }
    }

    /// Writes `entry`'s stored headers anew (a 304 updated them, RFC 9111 §4.3.4), copying its
    /// body into the new file. Runs on the thread pool; a failure leaves the old entry.
    package func replaceHeaders(of entry: Entry, with headers: HTTPHeaders, timing: CachePolicy.Timing) async {
        var head = entry.head
        head.headers = headers.map { [$0.name, $0.value] }
        head.requestTimeMilliseconds = Int64((timing.requestTime.timeIntervalSince1970 * 1000).rounded(.down))
        head.responseTimeMilliseconds = Int64((timing.responseTime.timeIntervalSince1970 * 1000).rounded(.down))
        guard let writer = await self.startEntry(head) else { return }
        let source = self.directory + "/" + entry.fileName
        let copied: CRC32? =
            try? await NIOThreadPool.singleton.runIfActive {
                guard let (input, _, _) = CacheEntryFile.openForReading(source, expectedSize: entry.fileBytes) else { return nil }
                defer { close(input) }
                var checksum = CRC32()
                let copied = CacheEntryFile.copy(
                    from: input, at: Int64(entry.bodyOffset), to: writer.fd, at: Int64(writer.bodyOffset), count: entry.head.bodyLength,
                    checksum: &checksum
                )
                return copied ? checksum : nil
            }
        guard let copied else {
            await writer.discard()
            return
        }
        // The copy read every byte: one that does not match its checksum (an entry found at
        // start whose blocks the disk lost) goes, rather than live on in a new file as checked.
        guard case .success = CacheEntryFormat.checkBody(copied, length: entry.head.bodyLength, against: entry.head) else {
            await writer.discard()
            await self.discard(entry)
            return
        }
        writer.bodyCopied(entry.head.bodyLength, checksum: copied, memory: entry.memoryBody)
        await writer.commit()
    }

}

/// A stored response about to be served.
package struct OpenedCacheEntry: Sendable {
    package var entry: ResponseCache.Entry
    package var body: StoredBody?
}

/// A stored body being read: from an open descriptor (the file may be unlinked meanwhile).
/// Used by one task at a time.
package final class StoredBody: @unchecked Sendable {  // one reading task; `readAhead` is set before it is handed over
    private let fd: CInt
    private var offset: Int64
    private var left: Int64
    private var readAhead: ByteBuffer?
    private var closed = false

    fileprivate init(fd: CInt, offset: Int64, length: Int64) {
        self.fd = fd
        self.offset = offset
        self.left = length
    }

    /// A body held in memory: no file.
    fileprivate init(memory: ByteBuffer) {
        self.fd = -1
        self.offset = 0
        self.left = 0
        self.readAhead = memory
        self.closed = true
    }

    /// The whole body, when it was read in one go and not yet handed out.
    fileprivate var readAheadBody: ByteBuffer? { self.left == 0 ? self.readAhead : nil }

    /// Whether the body read ahead is whole and the one `head` describes.
    fileprivate func readAheadMatches(_ head: CacheEntryFormat.Head) -> Bool {
        guard let body = self.readAheadBody else { return false }
        var checksum = CRC32()
        body.withUnsafeReadableBytes { checksum.update($0) }
        guard case .success = CacheEntryFormat.checkBody(checksum, length: Int64(body.readableBytes), against: head) else { return false }
        return true
    }

    fileprivate enum Verdict {
        /// The body is the one the head describes.
        case matches
        /// It is not (other bytes, or a file shorter than its head says): the entry must go.
        case differs
        /// It could not be read through (the thread pool is stopping): the entry is not at fault.
        case unread
    }

    /// Whether the unread body is the one `head` describes: read through once, in pieces of
    /// `ResponseCache.readChunkBytes`, one thread-pool trip each (as serving it is), without
    /// moving where `next` reads from. Before anything is read.
    fileprivate func verify(against head: CacheEntryFormat.Head) async -> Verdict {
        let (fd, start, end) = (self.fd, self.offset, self.offset + self.left)
        var checksum = CRC32()
        var position = start
        while position < end {
            let (count, sum, at) = (min(end - position, Int64(ResponseCache.readChunkBytes)), checksum, position)
            let next: CRC32?
            do {
                next = try await NIOThreadPool.singleton.runIfActive {
                    var sum = sum
                    return CacheEntryFile.checksum(fd, at: at, count: count, into: &sum) ? sum : nil
                }
            } catch {
                return .unread
            }
            guard let next else { return .differs }
            checksum = next
            position += count
        }
        guard case .success = CacheEntryFormat.checkBody(checksum, length: end - start, against: head) else { return .differs }
        return .matches
    }

    deinit { if !self.closed { close(self.fd) } }

    package var length: Int64 { self.left + Int64(self.readAhead?.readableBytes ?? 0) }

    fileprivate func readAheadOnThisThread() {
        self.readAhead = self.readChunk()
    }

    /// The next part of the body, or nil at its end; throws when the file is shorter than its
    /// head said (it changed under the reader).
    package func next() async throws -> ByteBuffer? {
        if let buffer = self.readAhead {
            self.readAhead = nil
            return buffer
        }
        guard self.left > 0 else { return nil }
        return try await NIOThreadPool.singleton.runIfActive { try self.readChunkOrThrow() }
    }

    private func readChunkOrThrow() throws -> ByteBuffer {
        guard let buffer = self.readChunk() else { throw StoredBodyTruncated() }
        return buffer
    }

    private func readChunk() -> ByteBuffer? {
        let count = Int(min(self.left, Int64(ResponseCache.readChunkBytes)))
        guard count > 0 else { return ByteBuffer() }
        var buffer = ByteBufferAllocator().buffer(capacity: count)
        let read = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { pointer in
            max(0, pread(self.fd, pointer.baseAddress, count, off_t(self.offset)))
        }
        guard read == count else { return nil }
        self.offset += Int64(count)
        self.left -= Int64(count)
        if self.left == 0 {
            close(self.fd)
            self.closed = true
        }
        return buffer
    }
}

package struct StoredBodyTruncated: Error {}

/// A response being stored: the body goes to a temporary file as it passes, and the entry is
/// installed only when the response ended whole. Used by the one task that pumps the response.
package final class CacheEntryWriter: @unchecked Sendable {  // one pumping task; the thread-pool closures run one at a time, awaited
    private let cache: ResponseCache
    fileprivate let fd: CInt
    private let temporaryPath: String
    private var head: CacheEntryFormat.Head
    private let reservedJSONLength: Int
    fileprivate let bodyOffset: Int
    private var written: Int64 = 0
    /// The CRC-32 of the `written` bytes, computed on the thread pool as they are written.
    private var checksum = CRC32()
    private var pending: [ByteBuffer] = []
    private var pendingBytes = 0
    private var finished = false
    /// The whole body so far, while it is small enough to be held in memory.
    private var kept: ByteBuffer? = ByteBuffer()
    /// Body bytes are written in batches of at least this many (one thread-pool trip each),
    /// unless requests follow the fill.
    static let batchBytes = 256 * 1024
    /// What requests following this response see of it (`followable`); nil until one may.
    private var progress: FillProgress?

    fileprivate init(cache: ResponseCache, fd: CInt, temporaryPath: String, head: CacheEntryFormat.Head, reservedJSONLength: Int, bodyOffset: Int) {
        self.cache = cache
        self.fd = fd
        self.temporaryPath = temporaryPath
        self.head = head
        self.reservedJSONLength = reservedJSONLength
        self.bodyOffset = bodyOffset
    }

    deinit {
        // Neither committed nor discarded (the pump was cancelled): nothing half-written stays.
        if !self.finished {
            self.progress?.finish(complete: false)
            close(self.fd)
            unlink(self.temporaryPath)
        }
    }

    /// Whether the response is still being stored (a write failed or the body outgrew the cache).
    package var isActive: Bool { !self.finished }

    /// Lets other requests follow this response as it is written (`FillProgress.follow`).
    /// `declaredLength`: its `Content-Length`, nil when unknown.
    package func followable(entryHead: CacheEntryFormat.Head, declaredLength: Int64?) -> FillProgress {
        if let progress = self.progress { return progress }
        let progress = FillProgress(
            head: entryHead, declaredLength: declaredLength, fd: self.fd, bodyOffset: Int64(self.bodyOffset), written: self.written
        )
        if self.finished { progress.finish(complete: false) }
        self.progress = progress
        return progress
    }

    /// The body was copied into the file by other means (a 304's new head over an old body),
    /// with this checksum of the bytes copied.
    fileprivate func bodyCopied(_ bytes: Int64, checksum: CRC32, memory: ByteBuffer?) {
        self.written = bytes
        self.checksum = checksum
        self.kept = memory
    }

    package func append(_ buffer: ByteBuffer) async {
        guard !self.finished else { return }
        self.pending.append(buffer)
        self.pendingBytes += buffer.readableBytes
        if var kept = self.kept {
            self.kept = nil
            if kept.readableBytes + buffer.readableBytes <= ResponseCache.memoryEntryLimit {
                var copy = buffer
                kept.writeBuffer(&copy)
                self.kept = kept
            }
        }
        if Int64(self.pendingBytes) + self.written > self.cache.settings.maxBytes {
            await self.discard()
            return
        }
        // Followers read only what is written: with any, each part is written at once.
        let followed = self.progress?.isFollowed ?? false
        if self.pendingBytes >= Self.batchBytes || followed, !(await self.flush()) { await self.discard() }
    }

    /// Writes the pending body bytes at the end of the file, adding them to the checksum there
    /// too (off the event loop, in the trip that writes them).
    private func flush() async -> Bool {
        guard !self.pending.isEmpty else { return true }
        let (batch, fd, offset, checksum) = (self.pending, self.fd, Int64(self.bodyOffset) + self.written, self.checksum)
        let count = self.pendingBytes
        self.pending = []
        self.pendingBytes = 0
        let updated: CRC32? = try? await NIOThreadPool.singleton.runIfActive {
            var checksum = checksum
            var position = offset
            for buffer in batch {
                let wrote = buffer.withUnsafeReadableBytes { bytes in
                    checksum.update(bytes)
                    return CacheEntryFile.write(fd, bytes, at: position)
                }
                guard wrote else { return nil }
                position += Int64(buffer.readableBytes)
            }
            return checksum
        }
        guard let updated else { return false }
        self.written += Int64(count)
        self.checksum = updated
        self.progress?.advance(to: self.written)
        return true
    }

    /// The response ended whole: the head gets the body's length and checksum, and the entry is
    /// installed.
    @discardableResult
    package func commit() async -> Bool {
        guard !self.finished else { return false }
        guard await self.flush() else {
            await self.discard()
            return false
        }
        self.finished = true
        self.head.bodyLength = self.written
        self.head.bodyCRC32 = self.checksum.value
        let bytes = CacheEntryFormat.encodeHead(self.head, paddedTo: self.reservedJSONLength)
        let (fd, path, cache, progress) = (self.fd, self.temporaryPath, self.cache, self.progress)
        // Trusted without a check: the checksum was computed from the very bytes written.
        var made = ResponseCache.Entry(head: self.head, bodyOffset: bytes.count, bodyVerified: true)
        made.memoryBody = self.kept
        let entry = made
        // Every byte is in the file: followers read to the end, whatever becomes of the entry.
        // They learn so once it is installed (a request that then finds no fill to follow
        // finds the entry), and before the descriptor closes (`FillProgress.follow`).
        defer { progress?.finish(complete: true) }
        return
            (try? await NIOThreadPool.singleton.runIfActive {
                let wrote = CacheEntryFile.write(fd, bytes, at: 0)
                guard wrote else {
                    progress?.finish(complete: true)
                    close(fd)
                    unlink(path)
                    return false
                }
                let installed = cache.install(temporaryPath: path, entry: entry)
                progress?.finish(complete: true)
                close(fd)
                return installed
            }) ?? false
    }

    /// The response did not end whole (or is not to be kept after all): nothing is stored.
    package func discard() async {
        guard !self.finished else { return }
        self.finished = true
        self.pending = []
        self.progress?.finish(complete: false)
        let (fd, path) = (self.fd, self.temporaryPath)
        _ = try? await NIOThreadPool.singleton.runIfActive {
            close(fd)
            unlink(path)
        }
    }
}

/// A response being stored, as the requests that follow it see it (collapsed misses answered
/// from it as it is written): how much of the body is in the file, and whether it ended whole.
/// `CacheEntryWriter` reports to it; each `FillFollower` reads the file at its own pace through
/// a descriptor of its own, which survives the writer's rename (or its discard's unlink).
package final class FillProgress: Sendable {
    /// The entry as it will be stored (its `bodyLength` not known yet): what followers answer with.
    package let entry: ResponseCache.Entry
    /// The response's `Content-Length`; nil when unknown (followers send it chunked).
    package let declaredLength: Int64?
    private let bodyOffset: Int64
    private let state: NIOLockedValueBox<State>

    private struct State {
        var written: Int64
        /// nil while being written; true when it ended whole, false when it was abandoned.
        var complete: Bool?
        /// The writer's descriptor, until it closes it (-1 then: nothing more to duplicate).
        var fd: CInt
        var followers = 0
        /// Followers that have read all there is, waiting for more (or the end).
        var waiting: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var nextID: UInt64 = 0
    }

    fileprivate init(head: CacheEntryFormat.Head, declaredLength: Int64?, fd: CInt, bodyOffset: Int64, written: Int64) {
        self.entry = ResponseCache.Entry(head: head, bodyOffset: Int(bodyOffset), bodyVerified: true, directHits: false)
        self.declaredLength = declaredLength
        self.bodyOffset = bodyOffset
        self.state = NIOLockedValueBox(State(written: written, fd: fd))
    }

    /// Whether any request follows it (the writer then writes each part at once).
    fileprivate var isFollowed: Bool { self.state.withLockedValue { $0.followers > 0 } }

    /// A reader of the body from its start; nil once the writer has closed the file (ended or
    /// abandoned: the caller looks in the cache again, or asks the origin).
    package func follow() -> FillFollower? {
        // `dup` under the lock: the writer closes its descriptor only after `finish`, which
        // takes the lock, so a descriptor seen open here is still the file's.
        let fd = self.state.withLockedValue { state -> CInt in
            guard state.fd >= 0, state.complete == nil else { return -1 }
            let copy = fcntl(state.fd, F_DUPFD_CLOEXEC, 0)
            if copy >= 0 { state.followers += 1 }
            return copy
        }
        guard fd >= 0 else { return nil }
        return FillFollower(progress: self, fd: fd, bodyOffset: self.bodyOffset)
    }

    fileprivate func advance(to written: Int64) {
        let waiting = self.state.withLockedValue { state in
            state.written = written
            defer { state.waiting = [:] }
            return state.waiting
        }
        for waiter in waiting.values { waiter.resume() }
    }

    /// The writer is done with the file (and about to close its descriptor).
    fileprivate func finish(complete: Bool) {
        let waiting = self.state.withLockedValue { state in
            if state.complete == nil { state.complete = complete }
            state.fd = -1
            defer { state.waiting = [:] }
            return state.waiting
        }
        for waiter in waiting.values { waiter.resume() }
    }

    /// How much is written, and whether it ended (see `State.complete`).
    fileprivate var snapshot: (written: Int64, complete: Bool?) { self.state.withLockedValue { ($0.written, $0.complete) } }

    /// Returns once more than `offset` bytes are written, or the writer finished.
    fileprivate func waitForMore(than offset: Int64) async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let waits = self.state.withLockedValue { state -> Bool in
                guard state.written <= offset, state.complete == nil else { return false }
                state.nextID += 1
                state.waiting[state.nextID] = continuation
                return true
            }
            if !waits { continuation.resume() }
        }
    }

    fileprivate func followerLeft() {
        self.state.withLockedValue { $0.followers -= 1 }
    }
}

/// One request's reading of a response being stored (`FillProgress.follow`): the file from its
/// own offset up to what the writer has written, on the thread pool; when it has caught up it
/// waits for the writer. Used by one task at a time.
package final class FillFollower: @unchecked Sendable {  // one reading task; the thread-pool reads are awaited one at a time
    package let progress: FillProgress
    private let fd: CInt
    private let bodyOffset: Int64
    private var offset: Int64 = 0

    fileprivate init(progress: FillProgress, fd: CInt, bodyOffset: Int64) {
        self.progress = progress
        self.fd = fd
        self.bodyOffset = bodyOffset
    }

    deinit {
        close(self.fd)
        self.progress.followerLeft()
    }

    /// The next part of the body, or nil at its end; throws `FillAbandoned` when the response
    /// will not end whole (or the file is shorter than the writer said).
    package func next() async throws -> ByteBuffer? {
        while true {
            let (written, complete) = self.progress.snapshot
            if self.offset < written {
                let count = Int(min(written - self.offset, Int64(ResponseCache.readChunkBytes)))
                let (fd, at) = (self.fd, self.bodyOffset + self.offset)
                let buffer: ByteBuffer? = try? await NIOThreadPool.singleton.runIfActive {
                    var buffer = ByteBufferAllocator().buffer(capacity: count)
                    let read = buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: count) { pointer in
                        max(0, pread(fd, pointer.baseAddress, count, off_t(at)))
                    }
                    return read == count ? buffer : nil
                }
                guard let buffer else { throw FillAbandoned() }
                self.offset += Int64(count)
                return buffer
            }
            switch complete {
            case true?:
                // A declared length the body did not reach is no whole response.
                if let declared = self.progress.declaredLength, declared != self.offset { throw FillAbandoned() }
                return nil
            case false?:
                throw FillAbandoned()
            case nil:
                await self.progress.waitForMore(than: self.offset)
            }
        }
    }
}

/// The response being followed will not end whole.
package struct FillAbandoned: Error {}
