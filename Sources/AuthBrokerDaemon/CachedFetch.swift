import AuthBrokerCore
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1

/// One request's use of the HTTP cache, from the lookup to the stored response: what the
/// response pump asks when the final response head arrives (store it? is it the 304 to the
/// broker's own validation?), and where its body goes.
///
/// Touched by the request's task and then its response pump, one after the other.
final class CacheExchange: Sendable {
    let cache: ResponseCache
    /// The canonical URL: the key with the method.
    let url: String
    let method: HTTPMethod
    let origin: CanonicalOrigin
    let pathAndQuery: String
    /// The client's request fields (what `Vary` selects on).
    let requestHeaders: HTTPHeaders
    /// The stored response this request validates, and the conditional fields the broker added
    /// for it: a 304 that selects it is answered from it.
    private let validation: NIOLockedValueBox<ValidationState>
    /// The stored response the lookup found: served instead of the origin's answer where
    /// `CachePolicy.mayServeStale` allows (the origin unreachable, or its 5xx).
    let fallback: ResponseCache.Entry?
    /// Whether a response may be stored (`Authbroker-Cache: no-store` says not).
    let mayStore: Bool
    /// This request claimed the fetching of its URL (`ResponseCache.claimFill`): later misses
    /// wait for its response to be stored, or to turn out not to be.
    let fills: Bool
    private let requestTime = Date()
    private let writer = NIOLockedValueBox<CacheEntryWriter?>(nil)
    private let fillEnded = NIOLockedValueBox(false)

    struct Validation {
        var entry: ResponseCache.Entry
        var fields: [CachePolicy.ConditionalField]
    }

    private enum ValidationState {
        case none
        case validating(Validation)
        /// A 304 did not select the stored response: the next attempt goes without these
        /// fields, and its answer is the client's, 304 or not.
        case abandoned(fieldNames: [String])
    }

    init(
        cache: ResponseCache, method: HTTPMethod, origin: CanonicalOrigin, pathAndQuery: String, requestHeaders: HTTPHeaders,
        validation: Validation?, fallback: ResponseCache.Entry?, mayStore: Bool, fills: Bool = false
    ) {
        self.fills = fills
        self.cache = cache
        self.url = origin.description + pathAndQuery
        self.method = method
        self.origin = origin
        self.pathAndQuery = pathAndQuery
        self.requestHeaders = requestHeaders
        self.validation = NIOLockedValueBox(validation.map { .validating($0) } ?? .none)
        self.fallback = fallback
        self.mayStore = mayStore
    }

    enum HeadDecision {
        /// The origin's response goes to the client (stored on the way, or not).
        case forward
        /// A stored response answers instead (the origin said with a 304 that it is still good,
        /// or failed where a stale one may answer), with these fields, `Age` and `Cache-Status`;
        /// the origin's body is read away.
        case serveStored(OpenedCacheEntry, HTTPHeaders, age: Int, cacheStatus: String)
        /// A 304 that did not select the stored response the broker validated: it is read away,
        /// and the request goes again without the broker's conditional fields.
        case repeatUnconditionally
    }

    /// The origin's final response head: unsafe methods invalidate (§4.4), a 304 to the
    /// broker's validation refreshes the stored response (§4.3.4) or, naming another, sends the
    /// request again (§4.3.3), a 5xx may be answered stale (RFC 5861 §4), a HEAD response
    /// updates or removes the stored GET (§4.3.5), anything storable starts being stored.
    func finalHead(_ head: HTTPResponseHead, requestCarriedCredentials: Bool) async -> HeadDecision {
        let status = Int(head.status.code)
        let invalidated = CachePolicy.invalidatedURLs(
            method: self.method.rawValue, status: status, origin: self.origin, pathAndQuery: self.pathAndQuery,
            responseHeaders: head.headers
        )
        if !invalidated.isEmpty {
            await self.cache.remove(urls: invalidated)
            return .forward
        }
        let validated = self.validation.withLockedValue { state -> ResponseCache.Entry? in
            if case .validating(let validation) = state { validation.entry } else { nil }
        }
        switch CachePolicy.validationAnswer(status: status, headers: head.headers, validated: validated?.headers) {
        case .serveStored:
            // Opened before its file is replaced by one with the new head (the descriptor keeps
            // the old file). A file gone meanwhile: the client, which did not ask
            // conditionally, cannot use the 304 either.
            guard let stored = validated, let opened = await self.cache.open(stored) else { return self.abandonValidation() }
            // The client gets every field of the 304; the entry keeps what the cache may keep.
            let updated = CachePolicy.updatedHeaders(stored: stored.headers, from: head.headers)
            let timing = CachePolicy.Timing(requestTime: self.requestTime, responseTime: Date())
            await self.cache.replaceHeaders(
                of: stored, with: CachePolicy.updatedStoredHeaders(stored: stored.headers, from: head.headers), timing: timing
            )
            self.cache.count(.revalidated)
            return .serveStored(
                opened, updated, age: CachePolicy.currentAge(headers: updated, timing: timing, now: Date()),
                cacheStatus: CacheStatusField.revalidated()
            )
        case .repeatUnconditionally:
            return self.abandonValidation()
        case .forward:
            break
        }
        if let stored = self.fallback,
            CachePolicy.mayServeStale(
                .originAnswered(status: status), storedStatus: stored.head.status, storedHeaders: stored.headers, timing: stored.head.timing,
                requestHeaders: self.requestHeaders, now: Date()
            ),
            let opened = await self.cache.open(stored)
        {
            self.cache.count(.servedStale)
            return .serveStored(
                opened, stored.headers, age: stored.freshness.age(now: Date()),
                cacheStatus: CacheStatusField.servedStale(originStatus: status)
            )
        }
        if self.method == .HEAD {
            await self.headResponse(head, requestCarriedCredentials: requestCarriedCredentials)
            return .forward
        }
        guard self.mayStore else {
            self.endFill()
            return .forward
        }
        let decision = CachePolicy.storage(
            method: self.method.rawValue, host: self.origin.host, requestHeaders: self.requestHeaders,
            requestCarriedCredentials: requestCarriedCredentials, status: status, responseHeaders: head.headers,
            settings: self.cache.settings.policy
        )
        guard case .store(let omitting) = decision, let vary = CachePolicy.varyFields(head.headers) else {
            self.endFill()
            return .forward
        }
        let stored = CachePolicy.storedHeaders(head.headers, omitting: omitting)
        let entryHead = CacheEntryFormat.Head(
            method: self.method.rawValue, url: self.url,
            variantKey: CachePolicy.variantKey(varyingOn: vary, request: self.requestHeaders), varyFields: vary, status: status,
            headers: stored.map { ($0.name, $0.value) }, requestTime: self.requestTime, responseTime: Date(), bodyLength: 0
        )
        let writer = await self.cache.startEntry(entryHead)
        self.writer.withLockedValue { $0 = writer }
        // Requests waiting for this one follow its response as it is stored, whatever its
        // length; when nothing is stored (or a body declared larger than the cache will not
        // be) they go to the origin themselves now.
        let chunked = head.headers.contains(name: "transfer-encoding")
        let declared = chunked ? nil : head.headers.first(name: "content-length").flatMap { Int64($0) }
        if self.fills, let writer, declared.map({ $0 <= self.cache.settings.maxBytes }) ?? true {
            self.cache.publishFill(url: self.url, progress: writer.followable(entryHead: entryHead, declaredLength: declared))
        } else {
            self.endFill()
        }
        return .forward
    }

    /// Gives the broker's validation up, once: the next attempt goes without its conditional
    /// fields (`removeAbandonedConditions`).
    private func abandonValidation() -> HeadDecision {
        self.validation.withLockedValue { state in
            if case .validating(let validation) = state { state = .abandoned(fieldNames: validation.fields.map(\.name)) }
        }
        return .repeatUnconditionally
    }

    /// Removes the conditional fields of a validation given up from an attempt's head: what
    /// remains is the client's request.
    func removeAbandonedConditions(from headers: inout HTTPHeaders) {
        guard case .abandoned(let names) = self.validation.withLockedValue({ $0 }) else { return }
        for name in names { headers.remove(name: name) }
    }

    /// §4.3.5: the origin's response to a HEAD updates the stored GET the request selects, or
    /// removes it when it no longer describes the resource.
    private func headResponse(_ head: HTTPResponseHead, requestCarriedCredentials: Bool) async {
        guard self.mayStore, let stored = self.cache.lookup(url: self.url, requestHeaders: self.requestHeaders) else { return }
        // Its fields are kept only where the GET's own would be: never from a response to a
        // request with credentials (another app's login), nor against a `no-store`.
        let storage = CachePolicy.storage(
            method: "GET", host: self.origin.host, requestHeaders: self.requestHeaders,
            requestCarriedCredentials: requestCarriedCredentials, status: Int(head.status.code), responseHeaders: head.headers,
            settings: self.cache.settings.policy
        )
        let mayKeep = if case .store = storage { true } else { false }
        switch CachePolicy.headResponseEffect(
            status: Int(head.status.code), headers: head.headers, storedHeaders: stored.headers, storedBodyLength: stored.head.bodyLength,
            mayKeep: mayKeep
        ) {
        case .update:
            let updated = CachePolicy.updatedStoredHeaders(stored: stored.headers, from: head.headers)
            // Rewriting an entry copies its whole body: not for fields that did not change.
            guard !updated.elementsEqual(stored.headers, by: { $0.name == $1.name && $0.value == $1.value }) else { return }
            let timing = CachePolicy.Timing(requestTime: self.requestTime, responseTime: Date())
            await self.cache.replaceHeaders(of: stored, with: updated, timing: timing)
        case .invalidate:
            await self.cache.invalidate(stored)
        case .none:
            break
        }
    }

    /// A part of the body going to the client; it goes to the entry being written too.
    func body(_ buffer: ByteBuffer) async {
        guard let writer = self.writer.withLockedValue({ $0 }) else { return }
        await writer.append(buffer)
    }

    /// The response ended whole: the entry is installed.
    func ended() async {
        guard let writer = self.writer.withLockedValue({ state in defer { state = nil }; return state }) else { return }
        await writer.commit()
        self.endFill()
    }

    /// The request is done: a response not stored whole by now never will be (its followers
    /// learn so now, not when this exchange is freed), and the fill ends.
    func finish() async {
        if let writer = self.writer.withLockedValue({ state in defer { state = nil }; return state }) { await writer.discard() }
        self.endFill()
    }

    /// Requests waiting for this one's response (collapsed) look in the cache again. Once: a
    /// later fill of the URL is another request's.
    func endFill() {
        guard self.fills, !self.fillEnded.withLockedValue({ ended in defer { ended = true }; return ended }) else { return }
        self.cache.endFill(url: self.url)
    }

    /// How long a request waits for another one's response head to the same URL at most.
    static let collapsedWait: Duration = .seconds(10)
}

/// The fields each answer from a stored response gets on top of the stored ones (`Age`, the
/// request id, `Cache-Status`, `Proxy-Status`, `Connection`), as fields of a head or as bytes
/// after an entry's encoded head (the direct relay's hits, `ResponseCache.Entry.clientHead`).
struct StoredAnswerFields {
    var age: Int
    var requestID: String
    var cacheStatus: String
    var proxyStatus: String? = nil
    var keepAlive: Bool

    /// All but `Connection`, which a rewrite must not touch and the caller sets after it.
    func add(to headers: inout HTTPHeaders) {
        headers.add(name: "Age", value: String(self.age))
        headers.add(name: BrokerHeaders.requestID, value: self.requestID)
        headers.add(name: CacheStatusField.name, value: self.cacheStatus)
        if let proxyStatus = self.proxyStatus { headers.add(name: "Proxy-Status", value: proxyStatus) }
    }

    /// Completes an open head (`ResponseHeadEncoding.openHead`) with these fields and the empty
    /// line; false when a value could not be sent (the caller then takes the other way).
    func complete(_ head: inout ByteBuffer) -> Bool {
        let start = head.writerIndex
        head.writeStaticString("Age: ")
        head.writeString(String(self.age))
        head.writeStaticString("\r\n")
        var sent =
            ResponseHeadEncoding.appendField(name: BrokerHeaders.requestID, value: self.requestID, to: &head)
            && ResponseHeadEncoding.appendField(name: CacheStatusField.name, value: self.cacheStatus, to: &head)
        if sent, let proxyStatus = self.proxyStatus {
            sent = ResponseHeadEncoding.appendField(name: "Proxy-Status", value: proxyStatus, to: &head)
        }
        guard sent else {
            head.moveWriterIndex(to: start)
            return false
        }
        if !self.keepAlive { head.writeStaticString("Connection: close\r\n") }
        head.writeStaticString("\r\n")
        return true
    }
}

/// `Cache-Status` (RFC 9211) members the broker adds to what it serves.
enum CacheStatusField {
    static let name = "Cache-Status"
    static let hit = "\(ProxyStatusField.proxyName); hit"
    /// A miss answered from another request's response to the same URL, as it was being stored:
    /// forwarded, collapsed into that one's forward (RFC 9211 §2.3, §2.7).
    static func collapsed() -> String { "\(ProxyStatusField.proxyName); fwd=miss; collapsed" }
    static func revalidated() -> String { "\(ProxyStatusField.proxyName); fwd=stale; fwd-status=304" }
    static func servedStale(offline: Bool) -> String {
        "\(ProxyStatusField.proxyName); hit; detail=\"\(offline ? "offline" : "origin-unreachable")\""
    }
    /// A stale response in place of the origin's error: it was asked (`fwd=stale`), and said
    /// this (RFC 9211 §2.4, §2.5).
    static func servedStale(originStatus: Int) -> String { "\(ProxyStatusField.proxyName); fwd=stale; fwd-status=\(originStatus)" }
}

extension Interceptor {
    /// Fetches one absolute-form request, through the HTTP cache where it covers the origin;
    /// otherwise (and for whatever the cache does not answer) `proxy` does the work.
    package func fetch(
        head: HTTPRequestHead, origin: CanonicalOrigin, pathAndQuery: String, adopted: AdoptedExchange? = nil,
        closedConnectionRetried: Bool = false, client: ClientSide, requests: inout ClientRequestIterator
    ) async -> RequestOutcome {
        // The direct relay relays to an origin the cache covers only a hit it answers itself:
        // what it hands over from there carries on as it began.
        guard let cache = self.cache, adopted == nil, !closedConnectionRetried, cache.covers(host: origin.host) else {
            return await self.proxy(
                head: head, origin: origin, pathAndQuery: pathAndQuery, adopted: adopted, closedConnectionRetried: closedConnectionRetried,
                client: client, requests: &requests
            )
        }
        let use = BrokerDirectives(headers: head.headers).cache
        let url = origin.description + pathAndQuery
        let offline = cache.isOffline
        var client = client
        let readsCache = (head.method == .GET || head.method == .HEAD) && RequestBodyFraming(head) == .none
        guard readsCache else {
            if offline {
                return await self.respondWithError(
                    .offline(method: head.method.rawValue, url: url), requestID: client.requestID, logger: client.logger,
                    requests: &requests, writer: client.writer, clientWantsKeepAlive: head.isKeepAlive
                )
            }
            // An unsafe method's answer invalidates what is stored for its target.
            client.cache = CacheExchange(
                cache: cache, method: head.method, origin: origin, pathAndQuery: pathAndQuery, requestHeaders: head.headers,
                validation: nil, fallback: nil, mayStore: false
            )
            return await self.proxy(head: head, origin: origin, pathAndQuery: pathAndQuery, client: client, requests: &requests)
        }
        if use == .noStore, !offline {
            return await self.proxy(head: head, origin: origin, pathAndQuery: pathAndQuery, client: client, requests: &requests)
        }
        let requestDirectives = CacheControl(fieldValues: head.headers["cache-control"])
        let onlyIfCached = offline || use == .onlyIfCached || requestDirectives.onlyIfCached
        // The client's own conditional or range request is its to validate: the origin answers
        // it (a 200 may still be stored).
        let clientConditional = CachePolicy.appValidationFields.contains { head.headers.contains(name: $0) }
        let stored = use == .refresh || clientConditional ? nil : cache.lookup(url: url, requestHeaders: head.headers)
        var validation: CacheExchange.Validation?
        var upstreamHead = head
        if let stored {
            let reuse = CachePolicy.reuse(requestHeaders: head.headers, stored: stored.freshness, storedHeaders: stored.headers, now: Date())
            switch reuse {
            case .fresh(let age), .staleAllowed(let age):
                if let outcome = await self.answer(
                    from: cache, stored, age: age, counting: .hit, cacheStatus: CacheStatusField.hit, head: head, client: client,
                    requests: &requests
                ) {
                    return outcome
                }
            case .validate(let fields):
                if offline,
                    CachePolicy.mayServeStale(
                        .disconnected, storedStatus: stored.head.status, storedHeaders: stored.headers, timing: stored.head.timing,
                        requestHeaders: head.headers, now: Date()
                    )
                {
                    if let outcome = await self.answer(
                        from: cache, stored, age: stored.freshness.age(now: Date()),
                        counting: .servedStale, cacheStatus: CacheStatusField.servedStale(offline: true), head: head, client: client,
                        requests: &requests
                    ) {
                        return outcome
                    }
                } else if !onlyIfCached {
                    validation = CacheExchange.Validation(entry: stored, fields: fields)
                    for field in fields { upstreamHead.headers.replaceOrAdd(name: field.name, value: field.value) }
                }
            }
        }
        if onlyIfCached {
            return await self.respondWithError(
                .notCached(url: url, offline: offline), requestID: client.requestID, logger: client.logger, requests: &requests,
                writer: client.writer, clientWantsKeepAlive: head.isKeepAlive
            )
        }
        // Concurrent misses for one URL: the first asks the origin, the others wait for what it
        // stores (RFC 9111 §4: a cache may collapse them) and are answered from it.
        var fills = false
        if stored == nil, use == nil, head.method == .GET, !clientConditional {
            fills = cache.claimFill(url: url)
            if !fills {
                let fill = await cache.waitForFill(url: url, timeout: CacheExchange.collapsedWait)
                if let fill,
                    CachePolicy.mayFollowFill(
                        method: head.method.rawValue, requestHeaders: head.headers, status: fill.entry.head.status,
                        responseHeaders: fill.entry.headers, variantKey: fill.entry.head.variantKey, timing: fill.entry.head.timing,
                        now: Date()
                    ),
                    let follower = fill.follow(),
                    let outcome = await self.follow(follower, cache: cache, head: head, client: client, requests: &requests)
                {
                    return outcome
                }
                if let entry = cache.lookup(url: url, requestHeaders: head.headers),
                    case .fresh(let age) = CachePolicy.reuse(
                        requestHeaders: head.headers, stored: entry.freshness, storedHeaders: entry.headers, now: Date()
                    ),
                    let outcome = await self.answer(
                        from: cache, entry, age: age, counting: .hit, cacheStatus: CacheStatusField.hit, head: head, client: client,
                        requests: &requests
                    )
                {
                    return outcome
                }
            }
        }
        if validation == nil { cache.count(.miss) }
        let exchange = CacheExchange(
            cache: cache, method: head.method, origin: origin, pathAndQuery: pathAndQuery, requestHeaders: head.headers,
            validation: validation, fallback: stored, mayStore: use != .noStore, fills: fills
        )
        client.cache = exchange
        let outcome = await self.proxy(head: upstreamHead, origin: origin, pathAndQuery: pathAndQuery, client: client, requests: &requests)
        // However the request ended (an error before any response, a client gone, a body cut),
        // what was not stored whole is dropped now, and its fill ends.
        await exchange.finish()
        return outcome
    }

    /// Answers a collapsed miss from another request's response as it is being stored (a hit's
    /// head, `Cache-Status` saying collapsed; chunked when its length is unknown). Nil when the
    /// fill was abandoned before anything went out: the request then asks the origin itself.
    /// Abandoned later, the client's response is cut, never ended as if whole.
    private func follow(
        _ follower: FillFollower, cache: ResponseCache, head: HTTPRequestHead, client: ClientSide, requests: inout ClientRequestIterator
    ) async -> RequestOutcome? {
        // Nothing goes out before the first bytes (or the end), so that an abandoned fill leaves
        // the request free to go to the origin.
        let first: ByteBuffer?
        do { first = try await follower.next() } catch { return nil }
        cache.count(.hit)
        let drained = await drainRequestBody(&requests)
        let (entry, declared) = (follower.progress.entry, follower.progress.declaredLength)
        let keepAlive = head.isKeepAlive && head.version == .http1_1 && drained == .ended && !client.draining()
        var headers = Self.storedClientHeaders(entry.headers, status: entry.head.status, bodyLength: declared ?? 0, logger: client.logger)
        if declared == nil { headers.remove(name: "Content-Length") }
        let answer = StoredAnswerFields(
            age: entry.freshness.age(now: Date()), requestID: client.requestID, cacheStatus: CacheStatusField.collapsed(), keepAlive: keepAlive
        )
        let responseHead = Self.storedResponseHead(entry, clientHeaders: headers, answer: answer, rewrite: client.rewrite)
        let capture = FlowCapture.current
        capture?.responded(responseHead)
        var bytes = 0
        do {
            var parts: [HTTPServerResponsePart] = [.head(responseHead)]
            var next = first
            while let chunk = next {
                bytes += chunk.readableBytes
                capture?.responseBody(chunk)
                parts.append(.body(.byteBuffer(chunk)))
                try await client.writer.write(contentsOf: parts)
                parts = []
                next = try await follower.next()
            }
            try await client.writer.write(contentsOf: parts + [.end(nil)])
        } catch {
            // The fill was abandoned mid-body (or the client left): the response is cut, as the
            // direct relay cuts one whose upstream fails mid-body.
            client.abort()
            return .aborted(status: entry.head.status, bytes: bytes)
        }
        return RequestOutcome(status: entry.head.status, bytes: bytes, brokerError: nil, disposition: keepAlive ? .keepAlive : .close)
    }

    /// The head of a response from the cache: the stored fields as the client's (hop-by-hop
    /// ones gone, the request id added, only standard challenges), with `Age`, the body's
    /// length and `Cache-Status`.
    static func storedResponseHead(
        _ entry: ResponseCache.Entry, headers stored: HTTPHeaders, age: Int, cacheStatus: String, proxyStatus: String? = nil,
        requestID: String, keepAlive: Bool, rewrite: RewriteRule?, logger: Logger
    ) -> HTTPResponseHead {
        let clientHeaders = Self.storedClientHeaders(stored, status: entry.head.status, bodyLength: entry.head.bodyLength, logger: logger)
        let answer = StoredAnswerFields(age: age, requestID: requestID, cacheStatus: cacheStatus, proxyStatus: proxyStatus, keepAlive: keepAlive)
        return Self.storedResponseHead(entry, clientHeaders: clientHeaders, answer: answer, rewrite: rewrite)
    }

    /// `storedResponseHead` from the fields `storedClientHeaders` made, with `answer`'s added.
    static func storedResponseHead(
        _ entry: ResponseCache.Entry, clientHeaders: HTTPHeaders, answer: StoredAnswerFields, rewrite: RewriteRule?
    ) -> HTTPResponseHead {
        var headers = clientHeaders
        answer.add(to: &headers)
        rewrite?.editResponse(&headers)
        if !answer.keepAlive { headers.replaceOrAdd(name: "Connection", value: "close") }
        return HTTPResponseHead(version: .http1_1, status: HTTPResponseStatus(statusCode: entry.head.status), headers: headers)
    }

    /// A stored response's fields as every client gets them, whatever the request: the
    /// client-side rules (`ProxyHeaders.clientResponseHeaders`, challenges only Basic and
    /// Digest), its own `Content-Length`, and no `Age` (each answer adds its own). Made once per
    /// entry for the direct relay's hits (`ResponseCache.Entry.clientHeaders`).
    static func storedClientHeaders(_ stored: HTTPHeaders, status: Int, bodyLength: Int64, logger: Logger) -> HTTPHeaders {
        var headers = ProxyHeaders.clientResponseHeaders(stored, requestID: nil)
        Self.keepOnlyStandardChallenges(status: HTTPResponseStatus(statusCode: status), in: &headers, requestID: nil, logger: logger)
        headers.remove(name: "Age")
        if status != 204, status != 304 {
            headers.replaceOrAdd(name: "Content-Length", value: String(bodyLength))
        }
        return headers
    }

    /// Whether a stored response may stand in for `error`: the origin could not be reached. Not
    /// when it was, and one side refused the other's certificate: a stale copy would hide the
    /// refusal (the user just removed an anchor, or a pin now fails), and not for the broker's own
    /// limits.
    static func fallbackAnswers(_ error: BrokerError) -> Bool {
        switch error.code {
        case .shuttingDown, .connectionLimitReached, .untrustedServer, .clientCertificateRequired, .clientCertificateRejected: false
        default: true
        }
    }

    /// When the origin cannot be reached (no DNS answer, no connection, no TLS session, no
    /// answer in time) and the request has been read to its end: the stored response, if one
    /// may be served stale, marked with `Age`, `Cache-Status` and a `Proxy-Status` that says
    /// why the origin was not asked. Nil when there is none (the broker's error goes out).
    func serveFallback(_ exchange: CacheExchange, error: BrokerError, head: HTTPRequestHead, client: ClientSide) async -> RequestOutcome? {
        guard let stored = exchange.fallback, let errorType = error.proxyErrorType, Self.fallbackAnswers(error),
            CachePolicy.mayServeStale(
                .disconnected, storedStatus: stored.head.status, storedHeaders: stored.headers, timing: stored.head.timing,
                requestHeaders: exchange.requestHeaders, now: Date()
            ),
            let opened = await exchange.cache.open(stored)
        else { return nil }
        client.logger.debug("the origin cannot be reached; serving a stored response", metadata: ["error": "\(error.code)"])
        exchange.cache.count(.servedStale)
        return await self.writeStored(
            opened, headers: stored.headers, age: stored.freshness.age(now: Date()),
            cacheStatus: CacheStatusField.servedStale(offline: false),
            proxyStatus: ProxyStatusField.render(error: errorType, details: "served from the cache: \(error.title)"), head: head,
            client: client, drained: .ended
        )
    }

    /// Answers from `entry` if its body can still be read (else nil: the request goes on),
    /// once the request has been read to its end.
    private func answer(
        from cache: ResponseCache, _ entry: ResponseCache.Entry, age: Int, counting event: ResponseCache.Event, cacheStatus: String,
        head: HTTPRequestHead, client: ClientSide, requests: inout ClientRequestIterator
    ) async -> RequestOutcome? {
        guard let opened = await cache.open(entry) else { return nil }
        cache.count(event)
        let drained = await drainRequestBody(&requests)
        return await self.writeStored(
            opened, headers: entry.headers, age: age, cacheStatus: cacheStatus, proxyStatus: nil, head: head, client: client,
            drained: drained
        )
    }

    /// Answers from a stored response, once the request has been read to its end: its fields
    /// (with `Age`, `Cache-Status`), then its body from the file.
    func writeStored(
        _ opened: OpenedCacheEntry, headers stored: HTTPHeaders, age: Int, cacheStatus: String, proxyStatus: String?,
        head: HTTPRequestHead, client: ClientSide, drained: RequestBodyDrain
    ) async -> RequestOutcome {
        let (entry, body) = (opened.entry, opened.body)
        let keepAlive = head.isKeepAlive && head.version == .http1_1 && drained == .ended && !client.draining()
        let responseHead = Self.storedResponseHead(
            entry, headers: stored, age: age, cacheStatus: cacheStatus, proxyStatus: proxyStatus, requestID: client.requestID,
            keepAlive: keepAlive, rewrite: client.rewrite, logger: client.logger
        )
        let capture = FlowCapture.current
        capture?.responded(responseHead)
        var bytes = 0
        do {
            guard head.method != .HEAD, let body else {
                try await client.writer.write(contentsOf: [.head(responseHead), .end(nil)])
                return RequestOutcome(status: entry.head.status, bytes: 0, brokerError: nil, disposition: keepAlive ? .keepAlive : .close)
            }
            // The head goes with the first piece, the end with the last: a small body is one write.
            var parts: [HTTPServerResponsePart] = [.head(responseHead)]
            while let chunk = try await body.next() {
                bytes += chunk.readableBytes
                capture?.responseBody(chunk)
                parts.append(.body(.byteBuffer(chunk)))
                if body.length == 0 { parts.append(.end(nil)) }
                try await client.writer.write(contentsOf: parts)
                parts = []
            }
            if bytes == 0 { try await client.writer.write(contentsOf: parts + [.end(nil)]) }
        } catch {
            // The file changed under the reader (or the client left): the response is cut, and
            // the entry goes.
            if error is StoredBodyTruncated { await self.cache?.discard(entry) }
            client.abort()
            return .aborted(status: entry.head.status, bytes: bytes)
        }
        return RequestOutcome(status: entry.head.status, bytes: bytes, brokerError: nil, disposition: keepAlive ? .keepAlive : .close)
    }
}
