import Foundation

/// The HTTP cache's counters, as `GET /v1/cache` and `GET /v1/status` report them and
/// `authbrokerctl cache status` shows them.
package struct CacheCounters: Sendable, Codable, Equatable {
    package var entries = 0
    package var bytes: Int64 = 0
    package var maxBytes: Int64 = 0
    /// Answered from the cache, fresh (or as stale as the request allowed).
    package var hits = 0
    /// Nothing stored for the request (or not for its variant): the origin was asked.
    package var misses = 0
    /// A stored response validated by the origin (304) and served.
    package var revalidations = 0
    /// A stored response served because the origin could not be reached, or in offline mode.
    package var servedStale = 0
    package var stores = 0
    package var evictions = 0
    package var offline = false

    package init() {}

    enum CodingKeys: String, CodingKey {
        case entries, bytes, hits, misses, revalidations, stores, evictions, offline
        case maxBytes = "max_bytes"
        case servedStale = "served_stale"
    }
}
