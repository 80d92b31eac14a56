import Foundation
import NIOHTTP1

/// The one place that decides what the broker's HTTP cache stores and reuses (RFC 9111, as a
/// private cache: one user's). Pure: the daemon's cache asks it, with the clock passed in.
///
/// One rule is stricter than a private cache needs: a response to a request that carried
/// credentials (the app's own `Authorization`, or one the broker added) is stored only when the
/// response says a shared cache may store it (§3.5). Every app of the user shares this cache,
/// and an app that authenticates is not telling the others that they may read what it got.
package enum CachePolicy {
    /// Which responses the cache takes, besides what HTTP says.
    package struct Settings: Sendable, Equatable {
        package var enabled = true
        /// Origins cached; empty: all.
        package var hosts: [HostPattern] = []
        /// The largest body stored, when its length is known up front (`Content-Length`).
        package var maxObjectBytes = 1 << 30

        package init() {}
    }

    /// Why a response is not stored.
    package enum Refusal: String, Sendable, Equatable {
        case cacheDisabled = "cache_disabled"
        case hostNotCached = "host_not_cached"
        /// Only GET responses are stored (a stored GET answers HEAD too).
        case methodNotCached = "method_not_cached"
        /// 1xx, 206 (ranges are not kept), 304 (it updates a stored response instead), and the
        /// challenges 401 and 407.
        case statusNotStored = "status_not_stored"
        case requestNoStore = "request_no_store"
        case responseNoStore = "response_no_store"
        /// `Vary: *`: no later request could ever match it.
        case varyAll = "vary_all"
        /// It varies on a credential (`Authorization`, `Proxy-Authorization`, `Cookie`) the
        /// request carried: the entry would keep that value on disk to match later requests by.
        case variesOnCredential = "varies_on_credential"
        /// The request carried credentials and the response did not say a shared cache may
        /// store it (`public`, `s-maxage` or `must-revalidate`, §3.5).
        case authorized = "authorized"
        /// No explicit freshness, and neither its status nor `public` allows a heuristic one.
        case notCacheable = "not_cacheable"
        /// `Content-Length` beyond `Settings.maxObjectBytes`.
        case tooLarge = "too_large"
        /// `must-understand` on a status this cache does not know the caching rules of.
        case notUnderstood = "not_understood"
        /// A transfer coding other than `chunked` (`gzip, chunked`): the body arrives still coded,
        /// and `Transfer-Encoding` is hop-by-hop, so a stored copy would be served as if it were not.
        case transferCoded = "transfer_coded"
    }

    package enum StorageDecision: Sendable, Equatable {
        /// Store it, without these (lowercased) header fields (§3.1: hop-by-hop fields and those
        /// a qualified `private` names).
        case store(omitting: [String])
        case dontStore(Refusal)
    }

    /// Request fields holding a credential, whose values an entry must not keep (its variant key).
    static let credentialFields: Set<String> = ["authorization", "proxy-authorization", "cookie"]

    /// Whether a variant key holds a credential's value (one an older build stored).
    package static func keepsCredential(variantKey: String) -> Bool {
        variantKey.split(separator: "\n").contains { line in
            guard let colon = line.firstIndex(of: ":") else { return false }
            return Self.credentialFields.contains(String(line[..<colon])) && line.index(after: colon) < line.endIndex
        }
    }

    /// Status codes whose responses may be given heuristic freshness (RFC 9110 §15.1).
    static let heuristicallyCacheable: Set<Int> = [200, 203, 204, 206, 300, 301, 308, 404, 405, 410, 414, 501]
    /// Status codes whose caching rules this cache knows (for `must-understand`).
    static let understood: Set<Int> = heuristicallyCacheable.union([302, 303, 307])
    /// Never stored (§3.1); `Connection` and the fields it names are added per response.
    static let hopByHop: Set<String> = [
        "connection", "proxy-connection", "keep-alive", "te", "transfer-encoding", "upgrade",
        "proxy-authenticate", "proxy-authentication-info", "proxy-authorization",
    ]

    // MARK: Storing (§3)

    /// Whether the response to `request` may be stored, and without which fields.
    /// - Parameter requestCarriedCredentials: the request went out with `Authorization` (the
    ///   app's or the broker's) or presented a client certificate.
    package static func storage(
        method: String, host: String, requestHeaders: HTTPHeaders, requestCarriedCredentials: Bool,
        status: Int, responseHeaders: HTTPHeaders, settings: Settings
    ) -> StorageDecision {
        guard settings.enabled else { return .dontStore(.cacheDisabled) }
        if !settings.hosts.isEmpty, !settings.hosts.contains(where: { $0.matches(host) }) { return .dontStore(.hostNotCached) }
        guard method == "GET" else { return .dontStore(.methodNotCached) }
        // A challenge (401, 407) is never stored, whatever its freshness: served from the cache it
        // would stand in for the origin's next challenge, which the broker answers from its store
        // once the user adds a password.
        guard status >= 200, status != 206, status != 304, status != 401, status != 407 else { return .dontStore(.statusNotStored) }
        let requestDirectives = CacheControl(fieldValues: requestHeaders["cache-control"])
        if requestDirectives.noStore { return .dontStore(.requestNoStore) }
        let directives = CacheControl(fieldValues: responseHeaders["cache-control"])
        // must-understand: stored only when the status's rules are known; then no-store is
        // ignored (§5.2.2.3), which is why it is checked first.
        if directives.mustUnderstand {
            guard Self.understood.contains(status) else { return .dontStore(.notUnderstood) }
        } else if directives.noStore {
            return .dontStore(.responseNoStore)
        }
        // RFC 9110 §7.6.1: Transfer-Encoding may be dropped only once its codings are undone;
        // the broker undoes only chunked (an unparsable field never framed a response this far).
        if let codings = (try? TransferCodings(responseHeaders)) ?? nil, !codings.codingsOtherThanChunked.isEmpty {
            return .dontStore(.transferCoded)
        }
        guard let varied = Self.varyFields(responseHeaders) else { return .dontStore(.varyAll) }
        if varied.contains(where: { Self.credentialFields.contains($0) && requestHeaders.contains(name: $0) }) {
            return .dontStore(.variesOnCredential)
        }
        if requestCarriedCredentials, !(directives.isPublic || directives.sharedMaxAge != nil || directives.mustRevalidate) {
            return .dontStore(.authorized)
        }
        let explicit =
            directives.maxAge != nil || directives.sharedMaxAge != nil || responseHeaders.contains(name: "expires")
            || directives.isPrivate
        guard explicit || directives.isPublic || Self.heuristicallyCacheable.contains(status) else {
            return .dontStore(.notCacheable)
        }
        if let length = responseHeaders.first(name: "content-length").flatMap({ Int($0) }), length > settings.maxObjectBytes {
            return .dontStore(.tooLarge)
        }
        return .store(omitting: Self.omittedFields(responseHeaders))
    }

    /// The (lowercased) fields of a response the cache never keeps, of those it carries: §3.1's
    /// hop-by-hop fields and those a qualified `private` names, and `Set-Cookie`.
    package static func omittedFields(_ responseHeaders: HTTPHeaders) -> [String] {
        let directives = CacheControl(fieldValues: responseHeaders["cache-control"])
        var omitted = Set(directives.privateFields).union(ProxyHeaders.connectionOptions(responseHeaders))
        omitted.formUnion(Self.hopByHop)
        // A cookie the origin set for the app that asked is that app's: another app served
        // from the cache does not get it (as a shared cache would not hand it to another user).
        omitted.insert("set-cookie")
        return omitted.filter { !$0.isEmpty && responseHeaders.contains(name: $0) }.sorted()
    }

    /// The header fields kept of a response the policy said to store.
    package static func storedHeaders(_ headers: HTTPHeaders, omitting: [String]) -> HTTPHeaders {
        guard !omitting.isEmpty else { return headers }
        let omitted = Set(omitting)
        return HTTPHeaders(headers.filter { !omitted.contains($0.name.lowercased()) })
    }

    // MARK: Vary (§4.1)

    /// The lowercased field names a response varies on, sorted; nil for `Vary: *`.
    package static func varyFields(_ responseHeaders: HTTPHeaders) -> [String]? {
        var names = Set<String>()
        for value in responseHeaders["vary"] {
            for piece in value.split(separator: ",") {
                let name = piece.trimmingCharacters(in: .whitespaces).lowercased()
                if name == "*" { return nil }
                if !name.isEmpty { names.insert(name) }
            }
        }
        return names.sorted()
    }

    /// What of `request` selects among a URL's stored variants: each varied field's values,
    /// normalised (lines joined with ", ", whitespace around commas dropped). Two requests match a
    /// stored response when their keys are equal.
    package static func variantKey(varyingOn fields: [String], request: HTTPHeaders) -> String {
        fields.map { name in
            let values = request[name].flatMap { $0.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) } }
            return name + ":" + values.joined(separator: ",")
        }.joined(separator: "\n")
    }

    // MARK: Freshness (§4.2)

    /// When a stored response was asked for and received, by the cache's clock.
    package struct Timing: Sendable, Equatable {
        package var requestTime: Date
        package var responseTime: Date

        package init(requestTime: Date, responseTime: Date) {
            self.requestTime = requestTime
            self.responseTime = responseTime
        }
    }

    /// The longest heuristic freshness given (10% of the time since `Last-Modified`, §4.2.2).
    static let maxHeuristicSeconds = 24 * 3600

    /// §4.2.1: seconds a response stays fresh, and whether that was guessed (§4.2.2).
    package static func freshnessLifetime(status: Int, headers: HTTPHeaders, timing: Timing) -> (seconds: Int, heuristic: Bool) {
        let directives = CacheControl(fieldValues: headers["cache-control"])
        // A response whose freshness cannot be read is taken as stale (§4.2.1).
        if !directives.conflicting.isEmpty || directives.unknown.contains("malformed") { return (0, false) }
        switch directives.maxAge {
        case .value(let seconds)?: return (seconds, false)
        case .invalid?: return (0, false)
        case nil: break
        }
        let date = Self.dateValue(headers, timing: timing)
        let expiresLines = headers["expires"]
        if !expiresLines.isEmpty {
            // An invalid Expires ("0") means already expired (§5.3); so do two of them.
            guard expiresLines.count == 1, let expires = HTTPDate.parse(expiresLines[0]) else { return (0, false) }
            return (max(0, Int(expires.timeIntervalSince(date).rounded(.down))), false)
        }
        guard Self.heuristicallyCacheable.contains(status) || directives.isPublic,
            let modifiedText = headers.first(name: "last-modified"), let modified = HTTPDate.parse(modifiedText)
        else { return (0, true) }
        let sinceModified = max(0, date.timeIntervalSince(modified))
        return (min(Self.maxHeuristicSeconds, Int((sinceModified / 10).rounded(.down))), true)
    }

    /// §4.2.3: the response's current age in seconds.
    package static func currentAge(headers: HTTPHeaders, timing: Timing, now: Date) -> Int {
        Self.correctedInitialAge(headers: headers, timing: timing).age(now: now)
    }

    /// §4.2.3's `corrected_initial_age`, with the time the response arrived: all the current
    /// age needs besides the clock.
    private static func correctedInitialAge(headers: HTTPHeaders, timing: Timing) -> InitialAge {
        let date = Self.dateValue(headers, timing: timing)
        let apparentAge = max(0, timing.responseTime.timeIntervalSince(date))
        // delta-seconds, saturated at 2^31 (§1.2.2): an origin's `Age: 9223372036854775807`
        // would otherwise overflow the sums below.
        let ageValue: Int
        if let field = headers.first(name: "age"),
            case .value(let seconds) = CacheControl.deltaSeconds(parsing: field.trimmingCharacters(in: .whitespaces))
        {
            ageValue = seconds
        } else {
            ageValue = 0
        }
        let responseDelay = max(0, timing.responseTime.timeIntervalSince(timing.requestTime))
        return InitialAge(corrected: max(apparentAge, Double(ageValue) + responseDelay), responseTime: timing.responseTime)
    }

    private struct InitialAge: Sendable, Equatable {
        var corrected: Double
        var responseTime: Date

        /// Saturated at 2^31 (§1.2.2: a calculation that overflows is taken as that), and never
        /// NaN, so the conversion to Int cannot trap.
        func age(now: Date) -> Int {
            let residentTime = max(0, now.timeIntervalSince(self.responseTime))
            let age = (self.corrected + residentTime).rounded(.down)
            guard age < Double(CacheControl.maxDeltaSeconds) else { return CacheControl.maxDeltaSeconds }
            return age >= 0 ? Int(age) : 0
        }
    }

    /// What reusing a stored response needs of it (§4.2, §5.2.2), worked out once when it is
    /// stored or updated rather than on every hit: its directives and dates are text to parse,
    /// and a hit that parsed them again spent a tenth of its time there.
    package struct StoredFreshness: Sendable, Equatable {
        /// §4.2.1, in seconds.
        package let lifetime: Int
        private let initialAge: InitialAge
        /// `no-cache`: never reused without validation (§5.2.2.4).
        package let noCache: Bool
        /// `must-revalidate`: never served stale (§5.2.2.2).
        package let mustRevalidate: Bool

        package init(status: Int, headers: HTTPHeaders, timing: Timing) {
            let directives = CacheControl(fieldValues: headers["cache-control"])
            self.lifetime = CachePolicy.freshnessLifetime(status: status, headers: headers, timing: timing).seconds
            self.initialAge = CachePolicy.correctedInitialAge(headers: headers, timing: timing)
            self.noCache = directives.noCache
            self.mustRevalidate = directives.mustRevalidate
        }

        /// §4.2.3: the current age in seconds.
        package func age(now: Date) -> Int { self.initialAge.age(now: now) }
    }

    /// The response's `Date`, or when it arrived if it has none that parses.
    private static func dateValue(_ headers: HTTPHeaders, timing: Timing) -> Date {
        headers.first(name: "date").flatMap { HTTPDate.parse($0) } ?? timing.responseTime
    }

    // MARK: Reuse (§4)

    /// What to do with a request for which a stored response matches (method, URL and variant).
    package enum Reuse: Sendable, Equatable {
        /// Serve it, with `Age: age`.
        case fresh(age: Int)
        /// Serve it stale, as the request allowed (`max-stale`), with `Age: age`.
        case staleAllowed(age: Int)
        /// Ask the origin with these conditional fields first (§4.3.1); none when the stored
        /// response has no validator (then the request goes as it is).
        case validate([ConditionalField])
    }

    package struct ConditionalField: Sendable, Equatable {
        package var name: String
        package var value: String

        package init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    /// §4: whether the stored response answers `request` as it is.
    package static func reuse(
        requestHeaders: HTTPHeaders, status: Int, storedHeaders: HTTPHeaders, timing: Timing, now: Date
    ) -> Reuse {
        Self.reuse(
            requestHeaders: requestHeaders, stored: StoredFreshness(status: status, headers: storedHeaders, timing: timing),
            storedHeaders: storedHeaders, now: now
        )
    }

    /// `reuse` with the stored response's freshness worked out beforehand (`StoredFreshness`).
    package static func reuse(requestHeaders: HTTPHeaders, stored: StoredFreshness, storedHeaders: HTTPHeaders, now: Date) -> Reuse {
        let requestLines = requestHeaders["cache-control"]
        let request = CacheControl(fieldValues: requestLines)
        // Pragma: no-cache counts only without Cache-Control (§5.4).
        let requestNoCache = request.noCache || (requestLines.isEmpty && requestHeaders["pragma"].contains { $0.lowercased().contains("no-cache") })
        // Made only when needed: most reuses are fresh, and the validators are text to trim.
        var validate: Reuse { .validate(Self.conditionalFields(for: storedHeaders)) }
        if requestNoCache || stored.noCache { return validate }
        let lifetime = stored.lifetime
        let age = stored.age(now: now)
        var fresh = age < lifetime
        if case .value(let maxAge)? = request.maxAge, age > maxAge { fresh = false }
        if case .invalid? = request.maxAge { fresh = false }
        if let minFresh = request.minFresh {
            switch minFresh {
            case .value(let seconds): if lifetime - age < seconds { fresh = false }
            case .invalid: fresh = false
            }
        }
        if fresh { return .fresh(age: age) }
        // Stale: served only if the request allows that much staleness and the response never
        // forbade it (§4.2.4).
        guard !stored.mustRevalidate, let maxStale = request.maxStale else { return validate }
        switch maxStale {
        case .any: return .staleAllowed(age: age)
        case .seconds(let allowed): return age - lifetime <= allowed ? .staleAllowed(age: age) : validate
        }
    }

    /// When a stale stored response is considered in place of the origin's answer.
    package enum StaleOccasion: Sendable, Equatable {
        /// The origin cannot be reached (no connection, no answer in time), or the offline mode:
        /// §4.2.4 lets a disconnected cache serve stale.
        case disconnected
        /// The origin answered with this status: an error of RFC 5861 §4 (500, 502, 503, 504)
        /// lets a stale response answer where `stale-if-error` permits it.
        case originAnswered(status: Int)
    }

    /// The statuses RFC 5861 §4 counts as an error `stale-if-error` may answer for.
    static let staleIfErrorStatuses: Set<Int> = [500, 502, 503, 504]

    /// §4.2.4 and RFC 5861: whether the stored response may be served, stale or not, instead of
    /// the origin's answer. Never for `must-revalidate` or `no-cache` (§5.2.2.2, §5.2.2.4);
    /// `proxy-revalidate` does not bind a private cache (§5.2.2.8). Disconnected, any staleness
    /// goes; for an origin's error, only within a `stale-if-error` of the stored response (the
    /// origin's permission) or of the request (the client's).
    package static func mayServeStale(
        _ occasion: StaleOccasion, storedStatus: Int, storedHeaders: HTTPHeaders, timing: Timing, requestHeaders: HTTPHeaders, now: Date
    ) -> Bool {
        let stored = CacheControl(fieldValues: storedHeaders["cache-control"])
        guard !stored.mustRevalidate, !stored.noCache else { return false }
        guard case .originAnswered(let answered) = occasion else { return true }
        guard Self.staleIfErrorStatuses.contains(answered) else { return false }
        let lifetime = Self.freshnessLifetime(status: storedStatus, headers: storedHeaders, timing: timing).seconds
        let staleness = Self.currentAge(headers: storedHeaders, timing: timing, now: now) - lifetime
        let request = CacheControl(fieldValues: requestHeaders["cache-control"])
        return [stored.staleIfError, request.staleIfError].contains { permitted in
            if case .value(let seconds)? = permitted { return staleness <= seconds }
            return false
        }
    }

    /// §4.3.1: the validators of a stored response, as fields of a conditional request.
    package static func conditionalFields(for storedHeaders: HTTPHeaders) -> [ConditionalField] {
        var fields: [ConditionalField] = []
        let tags = storedHeaders["etag"].map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        if !tags.isEmpty { fields.append(ConditionalField(name: "If-None-Match", value: tags.joined(separator: ", "))) }
        if let modified = storedHeaders.first(name: "last-modified"), HTTPDate.parse(modified) != nil {
            fields.append(ConditionalField(name: "If-Modified-Since", value: modified.trimmingCharacters(in: .whitespaces)))
        }
        return fields
    }

    // MARK: Validation answers (§4.3.3, §4.3.4, §3.2)

    /// §4.3.4: whether a 304 is about this stored response. A strong `ETag` in it decides alone:
    /// the stored one must be the same strong tag. Otherwise each validator it carries must
    /// match the stored one's: a weak `ETag` by the weak comparison (RFC 9110 §8.8.3.2), a
    /// `Last-Modified` by its date. A 304 with neither is taken as about the only response
    /// stored for the request (the cache keeps one per variant).
    package static func notModifiedSelects(storedHeaders: HTTPHeaders, notModified: HTTPHeaders) -> Bool {
        let storedTag = storedHeaders.first(name: "etag").map { EntityTag($0) }
        if let tag = notModified.first(name: "etag").map({ EntityTag($0) }) {
            if !tag.weak { return storedTag.map { !$0.weak && $0.opaque == tag.opaque } ?? false }
            guard storedTag?.opaque == tag.opaque else { return false }
        }
        if let modified = notModified.first(name: "last-modified") {
            return storedHeaders.first(name: "last-modified").flatMap { HTTPDate.parse($0) } == HTTPDate.parse(modified)
        }
        return true
    }

    /// An `ETag` value split into its weakness and its opaque tag (RFC 9110 §8.8.3), as text.
    private struct EntityTag: Equatable {
        var weak: Bool
        var opaque: Substring

        init(_ value: String) {
            let trimmed = value.trimmingCharacters(in: .whitespaces)
            self.weak = trimmed.hasPrefix("W/")
            self.opaque = self.weak ? trimmed.dropFirst(2) : Substring(trimmed)
        }
    }

    /// What becomes of the origin's answer to a request the cache sent with conditional fields
    /// of its own, to validate a stored response (§4.3.1).
    package enum ValidationAnswer: Sendable, Equatable {
        /// A 304 that selects the stored response: it answers, its fields updated (§4.3.4).
        case serveStored
        /// A 304 about another representation: it updates nothing (§4.3.4), and the client, whose
        /// request was not conditional, cannot use a 304 (RFC 9110 §15.4.5 sends one only to a
        /// conditional request). The request goes once more without the cache's fields.
        case repeatUnconditionally
        /// Anything else goes on as a response to the request.
        case forward
    }

    /// §4.3.3: the answer to a validation the cache started. `validated`: the stored response
    /// whose validators the cache added to the request; nil when it added none (the request's
    /// conditional fields, if any, are the client's, and so is the 304).
    package static func validationAnswer(status: Int, headers: HTTPHeaders, validated storedHeaders: HTTPHeaders?) -> ValidationAnswer {
        guard status == 304, let storedHeaders else { return .forward }
        return Self.notModifiedSelects(storedHeaders: storedHeaders, notModified: headers) ? .serveStored : .repeatUnconditionally
    }

    /// §3.2: the stored response's fields updated from a 304 (or a HEAD response): each field it
    /// carries replaces the stored ones of that name, except hop-by-hop fields and
    /// `Content-Length`, which describes the stored body, not the 304's.
    package static func updatedHeaders(stored: HTTPHeaders, from notModified: HTTPHeaders) -> HTTPHeaders {
        let excluded = Self.hopByHop.union(["content-length"]).union(ProxyHeaders.connectionOptions(notModified))
        let replacing = Set(notModified.map { $0.name.lowercased() }).subtracting(excluded)
        var updated = HTTPHeaders(stored.filter { !replacing.contains($0.name.lowercased()) })
        for (name, value) in notModified where replacing.contains(name.lowercased()) {
            updated.add(name: name, value: value)
        }
        return updated
    }

    /// The stored fields to keep after an update from a 304 or a HEAD response: the response
    /// contributes what the cache would keep of it (`omittedFields`: not its `Set-Cookie`, which
    /// is the asking app's, nor the fields its `Connection` names, which were for that message
    /// alone); and since the entry now has the response's `Cache-Control`, the fields that names
    /// `private` go from the stored ones too.
    package static func updatedStoredHeaders(stored: HTTPHeaders, from response: HTTPHeaders) -> HTTPHeaders {
        let contribution = Self.storedHeaders(response, omitting: Self.omittedFields(response))
        let updated = Self.updatedHeaders(stored: stored, from: contribution)
        let privateFields = CacheControl(fieldValues: updated["cache-control"]).privateFields
        return privateFields.isEmpty ? updated : Self.storedHeaders(updated, omitting: privateFields)
    }

    /// What a HEAD response the origin sent does to the stored GET response the same request
    /// selects (§4.3.5).
    package enum HeadResponseEffect: Sendable, Equatable {
        /// It describes the stored response: the stored fields are updated from it (§3.2).
        case update
        /// Its validators or length differ: the stored response is no longer the resource's, and
        /// goes (§4.3.5 has it considered stale; removed, it is never served stale either).
        case invalidate
        /// Not a 200: it says nothing about the stored response.
        case none
    }

    /// §4.3.5: a 200 to HEAD updates the stored GET when it carries a validator (`ETag`,
    /// `Last-Modified`), each one it carries equals the stored one's, and its `Content-Length`,
    /// if any, is the stored body's length; otherwise the stored GET is invalidated. Without any
    /// validator nothing ties the HEAD response to the stored body (a deliberate reading of
    /// §4.3.5, which would update a stored response without validators: removed, it is asked
    /// for again). `mayKeep`: whether the cache could keep this response's fields, as `storage`
    /// decides for a GET with the HEAD's request and response (its `no-store`, a request that
    /// carried credentials): if not, nothing of it is kept, but a changed resource's entry still goes.
    package static func headResponseEffect(
        status: Int, headers: HTTPHeaders, storedHeaders: HTTPHeaders, storedBodyLength: Int64, mayKeep: Bool
    ) -> HeadResponseEffect {
        guard status == 200 else { return .none }
        let tag = headers.first(name: "etag").map { EntityTag($0) }
        let modified = headers.first(name: "last-modified")
        guard tag != nil || modified != nil else { return .invalidate }
        if let tag, storedHeaders.first(name: "etag").map({ EntityTag($0) }) != tag { return .invalidate }
        if let modified {
            guard let date = HTTPDate.parse(modified), storedHeaders.first(name: "last-modified").flatMap({ HTTPDate.parse($0) }) == date
            else { return .invalidate }
        }
        if let length = headers.first(name: "content-length") {
            guard Int64(length.trimmingCharacters(in: .whitespaces)) == storedBodyLength else { return .invalidate }
        }
        return mayKeep ? .update : .none
    }

    // MARK: Invalidation (§4.4)

    /// The URLs whose stored responses go after an unsafe request's non-error response: its
    /// target, and the `Location` and `Content-Location` it names on the same origin.
    /// - Parameters:
    ///   - origin: the target's `scheme://host[:port]`, as `CanonicalOrigin.description` writes it.
    ///   - pathAndQuery: the target's path and query.
    package static func invalidatedURLs(
        method: String, status: Int, origin: CanonicalOrigin, pathAndQuery: String, responseHeaders: HTTPHeaders
    ) -> [String] {
        guard !["GET", "HEAD", "OPTIONS", "TRACE"].contains(method), (200..<400).contains(status) else { return [] }
        var urls = [origin.description + pathAndQuery]
        for name in ["location", "content-location"] {
            guard let reference = responseHeaders.first(name: name)?.trimmingCharacters(in: .whitespaces), !reference.isEmpty else { continue }
            let url: String?
            if reference.hasPrefix("/"), !reference.hasPrefix("//") {
                url = origin.description + reference
            } else if case .success(.absolute(let other, let path)) = RequestTarget.parse(method: "GET", uri: reference), other == origin {
                url = origin.description + path
            } else {
                url = nil  // another origin, or a relative reference: left alone (§4.4 allows only the same origin)
            }
            if let url, !urls.contains(url) { urls.append(url) }
        }
        return urls
    }
}
