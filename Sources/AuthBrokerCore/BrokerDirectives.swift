import NIOHTTP1

/// The `Authbroker-*` request fields the daemon acts on, read from a request's headers.
///
/// Total: any field values give a result; a value the broker does not understand reads as
/// absent (a request never fails because of a directive, it just gets the default). When a field
/// is repeated, the last one wins. The fields themselves never leave the broker
/// (`ProxyHeaders.upstreamRequestHeaders` drops every `Authbroker-*` field).
package struct BrokerDirectives: Sendable, Equatable {
    /// Lower-cased, as `ProxyHeaders.brokerDirectives` returns names.
    package static let identityField = "authbroker-identity"
    package static let interactiveField = "authbroker-interactive"
    package static let persistField = "authbroker-persist"
    package static let debugField = "authbroker-debug"
    package static let cacheField = "authbroker-cache"

    /// `Authbroker-Cache`: how this one request uses the broker's HTTP cache.
    package enum CacheUse: String, Sendable, Equatable {
        /// Answer from the cache or fail; never the network (as `only-if-cached`, RFC 9111 §5.2.1.7).
        case onlyIfCached = "only-if-cached"
        /// Neither read nor store: the origin answers, and nothing is kept.
        case noStore = "no-store"
        /// Ask the origin (stored or not), and store what it answers.
        case refresh
    }

    /// `Authbroker-Identity`: the client identity to present, as sent; the trust store decides
    /// whether it exists and fits the host.
    package var identity: String?
    /// `Authbroker-Interactive`: how long the request may wait for an agent; nil: not at all.
    package var interactiveWait: Duration?
    /// `Authbroker-Persist`, lower-cased: `none`, `session` or `permanent` asks the daemon to
    /// keep a Basic credential the client sent; other values are for the caller to ignore.
    package var persist: String?
    /// `Authbroker-Debug: keylog` (a comma-separated list; other tokens are ignored): with
    /// `[debug] tls_key_log_scope = "marked"`, the request's upstream TLS keys are logged.
    package var keyLog: Bool
    /// `Authbroker-Cache`; nil: the cache works as HTTP says.
    package var cache: CacheUse?

    package init(
        identity: String? = nil, interactiveWait: Duration? = nil, persist: String? = nil, keyLog: Bool = false,
        cache: CacheUse? = nil
    ) {
        self.identity = identity
        self.interactiveWait = interactiveWait
        self.persist = persist
        self.keyLog = keyLog
        self.cache = cache
    }

    package init(headers: HTTPHeaders) {
        var directives = BrokerDirectives()
        for (name, value) in ProxyHeaders.brokerDirectives(headers) {
            switch name {
            case Self.identityField: directives.identity = value
            case Self.interactiveField: directives.interactiveWait = Self.interactiveWait(value)
            case Self.persistField: directives.persist = value.lowercased()
            case Self.cacheField: directives.cache = CacheUse(rawValue: value.filter { $0 != " " && $0 != "\t" }.lowercased())
            case Self.debugField:
                directives.keyLog = value.split(separator: ",").contains {
                    $0.filter { $0 != " " && $0 != "\t" }.lowercased() == "keylog"
                }
            default: continue
            }
        }
        self = directives
    }

    /// The longest wait a request may ask for, in seconds.
    package static let maxInteractiveSeconds = 600

    /// `Authbroker-Interactive: <seconds>` (1 to 600) or `yes` (120 s); blanks are ignored.
    /// Anything else reads as nil: the request may not wait, and a challenge the store cannot
    /// answer goes to the client at once.
    package static func interactiveWait(_ value: String) -> Duration? {
        let text = value.filter { $0 != " " && $0 != "\t" }.lowercased()
        if text == "yes" || text == "true" || text == "?1" { return .seconds(120) }
        guard let seconds = Int(text), (1...maxInteractiveSeconds).contains(seconds) else { return nil }
        return .seconds(seconds)
    }
}
