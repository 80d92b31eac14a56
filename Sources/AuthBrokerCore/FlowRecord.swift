import Foundation
import NIOHTTP1

/// One request as the flow log keeps it (`authbrokerctl flows`): what the app sent, what it got
/// back, and what the broker did in between. Header values are kept as they were; masking
/// happens when a flow leaves the daemon (`FlowMasking`), so a re-authenticated user can still
/// see them.
package struct FlowRecord: Sendable {
    /// Numbered by the ring from 1, in the order flows ended.
    package var sequence: UInt64 = 0
    package var requestID: String
    /// When the request head arrived.
    package var started: Date
    package var method: String
    /// The absolute URL the app asked for (`host:port` for a CONNECT).
    package var url: String
    package var httpVersion: String
    package var requestHeaders: HTTPHeaders
    /// Request body bytes read from the app.
    package var requestBodyBytes: Int = 0
    package var requestBody: CapturedBody? = nil
    /// The final status the app got; 0 when none reached it.
    package var status: Int = 0
    package var responseHeaders: HTTPHeaders = HTTPHeaders()
    package var responseBodyBytes: Int = 0
    package var responseBody: CapturedBody? = nil
    /// From the request head to the final response head; nil when none was sent.
    package var waitMicroseconds: Int64? = nil
    /// From the request head to the response's end.
    package var totalMicroseconds: Int64 = 0
    /// The process that sent it, when known.
    package var app: Requester? = nil
    package var applied = FlowApplied()
    /// The broker's error code, when it answered with one or the exchange broke off.
    package var brokerError: String? = nil

    package init(requestID: String, started: Date, method: String, url: String, httpVersion: String, requestHeaders: HTTPHeaders) {
        self.requestID = requestID
        self.started = started
        self.method = method
        self.url = url
        self.httpVersion = httpVersion
        self.requestHeaders = requestHeaders
    }

    /// Bytes held beyond the fixed parts, as the ring counted them when it took the flow.
    fileprivate var countedBytes = 0

    /// HTTP/1.1 as `HTTP/1.1` (without string interpolation for the usual two: it is per request).
    package static func versionText(_ version: HTTPVersion) -> String {
        switch (version.major, version.minor) {
        case (1, 1): "HTTP/1.1"
        case (1, 0): "HTTP/1.0"
        default: "HTTP/\(version.major).\(version.minor)"
        }
    }

    /// Bytes held beyond the fixed parts (the ring's budget counts them), header fields left out
    /// when the ring knows they cannot matter.
    fileprivate func heldBytes(countingHeaders: Bool) -> Int {
        var total = self.url.utf8.count + (self.requestBody?.bytes.count ?? 0) + (self.responseBody?.bytes.count ?? 0)
        guard countingHeaders else { return total }
        for (name, value) in self.requestHeaders { total += name.utf8.count + value.utf8.count }
        for (name, value) in self.responseHeaders { total += name.utf8.count + value.utf8.count }
        return total
    }
}

/// A body as the flow log keeps it: its first bytes, up to `[flows] max_body_bytes`.
package struct CapturedBody: Sendable, Equatable {
    package var bytes: [UInt8]
    /// The body was longer than what was kept.
    package var truncated: Bool

    package init(bytes: [UInt8] = [], truncated: Bool = false) {
        self.bytes = bytes
        self.truncated = truncated
    }

    /// Keeps what fits of `chunk` under `limit` bytes in all.
    package mutating func append(_ chunk: some Collection<UInt8>, limit: Int) {
        let room = max(0, limit - self.bytes.count)
        if chunk.count > room {
            self.bytes.append(contentsOf: chunk.prefix(room))
            self.truncated = true
        } else {
            self.bytes.append(contentsOf: chunk)
        }
    }
}

/// The process behind a request, from `SO_PEERCRED` and `/proc` (DESIGN.md: caller awareness):
/// for agents, the audit log and the flow log.
package struct Requester: Equatable, Sendable, Codable {
    package var pid: Int32
    package var uid: UInt32
    /// `/proc/<pid>/exe`, when readable.
    package var executable: String?

    package init(pid: Int32, uid: UInt32, executable: String?) {
        self.pid = pid
        self.uid = uid
        self.executable = executable
    }
}

/// What the broker brought to a request: never a secret, only names.
package struct FlowApplied: Sendable, Equatable, Codable {
    /// The stored credential sent to the origin (or, with `proxy`, to the upstream proxy).
    package struct Credential: Sendable, Equatable, Codable {
        package var user: String
        package var realm: String?
        package var scheme: String
        package var proxy: Bool?

        package init(user: String, realm: String?, scheme: String, proxy: Bool) {
            self.user = user
            self.realm = realm
            self.scheme = scheme
            self.proxy = proxy ? true : nil
        }
    }

    package var credentials: [Credential] = []
    /// The client identity presented to the origin.
    package var identity: String? = nil
    /// The config rule that applied: `respond config.toml:12`, `rewrite config.toml:20`.
    package var rule: String? = nil
    /// Where a `[[rewrite]]` sent the request: the new URL (`to`), or the address its
    /// connections went to (`connect_to`, `host:port`).
    package var rewrittenTo: String? = nil
    /// The request came inside a CONNECT the broker intercepted.
    package var intercepted: Bool? = nil
    /// The connection's direct relay served it (no credential, identity or rule can apply there).
    package var relayedDirectly: Bool? = nil

    package init() {}

    enum CodingKeys: String, CodingKey {
        case credentials, identity, rule, intercepted
        case rewrittenTo = "rewritten_to"
        case relayedDirectly = "relayed_directly"
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        if !self.credentials.isEmpty { try container.encode(self.credentials, forKey: .credentials) }
        try container.encodeIfPresent(self.identity, forKey: .identity)
        try container.encodeIfPresent(self.rule, forKey: .rule)
        try container.encodeIfPresent(self.rewrittenTo, forKey: .rewrittenTo)
        try container.encodeIfPresent(self.intercepted, forKey: .intercepted)
        try container.encodeIfPresent(self.relayedDirectly, forKey: .relayedDirectly)
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.credentials = try container.decodeIfPresent([Credential].self, forKey: .credentials) ?? []
        self.identity = try container.decodeIfPresent(String.self, forKey: .identity)
        self.rule = try container.decodeIfPresent(String.self, forKey: .rule)
        self.rewrittenTo = try container.decodeIfPresent(String.self, forKey: .rewrittenTo)
        self.intercepted = try container.decodeIfPresent(Bool.self, forKey: .intercepted)
        self.relayedDirectly = try container.decodeIfPresent(Bool.self, forKey: .relayedDirectly)
    }
}

/// Which header values are secrets, and how they look masked. Only the secret part goes: an
/// `Authorization` keeps its scheme, a cookie its name, a `Set-Cookie` its attributes, so a
/// flow still shows which scheme was used and which cookies went.
package struct FlowMasking: Sendable, Equatable {
    package static let mask = "[masked]"

    /// Lowercased names masked besides the four that always are (`[flows] mask_headers`).
    package var extraNames: Set<String>

    package init(extraNames: some Sequence<String> = []) {
        self.extraNames = Set(extraNames.map { $0.lowercased() })
    }

    /// `value` as the field `name` shows it masked (unchanged when the field is no secret).
    package func masked(name: String, value: String) -> String {
        let lowered = name.lowercased()
        switch lowered {
        case "authorization", "proxy-authorization":
            // The scheme token, then the credentials (RFC 9110 §11.4); anything else is all secret.
            let trimmed = value.drop { $0 == " " || $0 == "\t" }
            guard let end = trimmed.firstIndex(where: { $0 == " " || $0 == "\t" }),
                trimmed[..<end].utf8.allSatisfy(HTTPSyntax.isTChar)
            else { return Self.mask }
            return "\(trimmed[..<end]) \(Self.mask)"
        case "cookie":
            return CookieSyntax.pairs(inCookieHeader: value).map { $0.name.isEmpty ? Self.mask : "\($0.name)=\(Self.mask)" }
                .joined(separator: "; ")
        case "set-cookie":
            let cookie = CookieSyntax.setCookie(value)
            return ([(cookie.name.isEmpty ? "" : cookie.name + "=") + Self.mask] + cookie.attributes).joined(separator: "; ")
        default:
            return self.extraNames.contains(lowered) ? Self.mask : value
        }
    }
}

/// Cookie header syntax (RFC 6265 §4.1.1, §4.2.1), parsed leniently: every input gives pairs.
package enum CookieSyntax {
    package struct SetCookie: Equatable {
        package var name: String
        package var value: String
        /// The attributes as written (`Path=/`, `HttpOnly`), trimmed.
        package var attributes: [String]

        /// The value of the attribute `wanted` (`Path`), case-insensitively.
        package func attribute(_ wanted: String) -> String? {
            for attribute in self.attributes {
                guard let equals = attribute.firstIndex(of: "=") else { continue }
                if attribute[..<equals].trimmingCharacters(in: .whitespaces).caseInsensitiveCompare(wanted) == .orderedSame {
                    return attribute[attribute.index(after: equals)...].trimmingCharacters(in: .whitespaces)
                }
            }
            return nil
        }

        /// Whether the flag attribute `flag` (`HttpOnly`) is there.
        package func has(_ flag: String) -> Bool {
            self.attributes.contains { $0.caseInsensitiveCompare(flag) == .orderedSame }
        }
    }

    /// `a=1; b=2` as [(a, 1), (b, 2)]; a piece with no `=` is a value with no name, as browsers
    /// take it (RFC 6265bis §5.6).
    package static func pairs(inCookieHeader value: String) -> [(name: String, value: String)] {
        value.split(separator: ";").compactMap { piece in
            let (name, value) = Self.split(String(piece))
            return name.isEmpty && value.isEmpty ? nil : (name, value)
        }
    }

    package static func setCookie(_ value: String) -> SetCookie {
        var pieces = value.split(separator: ";", omittingEmptySubsequences: false).map {
            $0.trimmingCharacters(in: .whitespaces)
        }
        let first = pieces.isEmpty ? "" : pieces.removeFirst()
        let (name, cookieValue) = Self.split(first)
        return SetCookie(name: name, value: cookieValue, attributes: pieces.filter { !$0.isEmpty })
    }

    /// `name=value` split at the first `=`, both trimmed; without `=`, all of it is the value.
    static func split(_ piece: String) -> (name: String, value: String) {
        guard let equals = piece.firstIndex(of: "=") else {
            return ("", piece.trimmingCharacters(in: .whitespaces))
        }
        return (
            piece[..<equals].trimmingCharacters(in: .whitespaces),
            piece[piece.index(after: equals)...].trimmingCharacters(in: .whitespaces)
        )
    }
}

/// The flows the daemon keeps: the latest `capacity` of them, fewer when their held bytes pass
/// `maxHeldBytes` (the oldest go first; see `countsHeaders`). Not synchronised: the daemon's `FlowLog` holds it
/// under a lock.
package struct FlowRing: Sendable {
    package let capacity: Int
    package let maxHeldBytes: Int
    /// Whether header fields count toward `maxHeldBytes`: not when a full ring of heads as large
    /// as the limits allow is no larger than it anyway (the budget then bounds URLs and bodies,
    /// and the heads are bounded by the limits); counting them cost about 2% of a relayed request.
    package let countsHeaders: Bool
    private var flows: [FlowRecord] = []
    /// Where the oldest flow is, once the ring is full.
    private var head = 0
    private var heldBytes = 0
    private(set) package var lastSequence: UInt64 = 0

    /// - Parameter maxHeadBytes: the largest request head plus response head a flow can hold;
    ///   nil: unknown (they are counted).
    package init(capacity: Int, maxHeldBytes: Int, maxHeadBytes: Int? = nil) {
        self.capacity = max(0, capacity)
        self.maxHeldBytes = maxHeldBytes
        let (worst, overflow) = self.capacity.multipliedReportingOverflow(by: maxHeadBytes ?? .max)
        self.countsHeaders = maxHeadBytes == nil || overflow || worst > maxHeldBytes
        self.flows.reserveCapacity(min(self.capacity, 1024))
    }

    package var count: Int { self.flows.count }

    /// Adds `flow`, numbered `lastSequence + 1`. Returns the flow it pushed out, for the caller
    /// to let go of outside its lock (releasing a flow's headers is most of what dropping costs).
    @discardableResult
    package mutating func append(_ flow: consuming FlowRecord) -> FlowRecord? {
        self.lastSequence += 1
        guard self.capacity > 0 else { return nil }
        var incoming = flow
        incoming.sequence = self.lastSequence
        incoming.countedBytes = incoming.heldBytes(countingHeaders: self.countsHeaders)
        self.heldBytes += incoming.countedBytes
        var evicted: FlowRecord?
        if self.flows.count < self.capacity {
            self.flows.append(incoming)
        } else {
            swap(&incoming, &self.flows[self.head])
            self.heldBytes -= incoming.countedBytes
            self.head = (self.head + 1) % self.capacity
            evicted = incoming
        }
        while self.heldBytes > self.maxHeldBytes, self.flows.count > 1 {
            self.dropOldest()
        }
        return evicted
    }

    /// The flows kept, oldest first; the last `limit` of them when given.
    package func recent(_ limit: Int? = nil) -> [FlowRecord] {
        let ordered = Array(self.flows[self.head...] + self.flows[..<self.head])
        guard let limit, limit < ordered.count else { return ordered }
        return Array(ordered.suffix(max(0, limit)))
    }

    private mutating func dropOldest() {
        var ordered = self.recent()
        let dropped = ordered.removeFirst()
        self.heldBytes -= dropped.countedBytes
        self.flows = ordered
        self.head = 0
    }
}

/// One flow as `GET /v1/flows` and its live stream show it: what happened, without headers or
/// bodies (those are in the HAR export, masked).
package struct FlowSummary: Codable, Sendable, Equatable {
    package var id: UInt64
    package var requestID: String
    package var started: Date
    package var method: String
    package var url: String
    /// 0 when no response reached the app.
    package var status: Int
    /// Response body bytes the app got.
    package var bytes: Int
    package var durationMilliseconds: Double
    package var app: Requester?
    package var applied: FlowApplied
    package var error: String?

    package init(_ flow: FlowRecord) {
        self.id = flow.sequence
        self.requestID = flow.requestID
        self.started = flow.started
        self.method = flow.method
        self.url = flow.url
        self.status = flow.status
        self.bytes = flow.responseBodyBytes
        self.durationMilliseconds = Double(flow.totalMicroseconds) / 1000
        self.app = flow.app
        self.applied = flow.applied
        self.error = flow.brokerError
    }

    enum CodingKeys: String, CodingKey {
        case id, started, method, url, status, bytes, app, applied, error
        case requestID = "request_id"
        case durationMilliseconds = "duration_ms"
    }

    // `started` with milliseconds (the control API's other dates are whole seconds): a live view
    // orders and times requests by it.
    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(self.id, forKey: .id)
        try container.encode(self.requestID, forKey: .requestID)
        try container.encode(HTTPArchive.timestamp(self.started), forKey: .started)
        try container.encode(self.method, forKey: .method)
        try container.encode(self.url, forKey: .url)
        try container.encode(self.status, forKey: .status)
        try container.encode(self.bytes, forKey: .bytes)
        try container.encode(self.durationMilliseconds, forKey: .durationMilliseconds)
        try container.encodeIfPresent(self.app, forKey: .app)
        try container.encode(self.applied, forKey: .applied)
        try container.encodeIfPresent(self.error, forKey: .error)
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.id = try container.decode(UInt64.self, forKey: .id)
        self.requestID = try container.decode(String.self, forKey: .requestID)
        let started = try container.decode(String.self, forKey: .started)
        guard let date = try? Date(started, strategy: Date.ISO8601FormatStyle(includingFractionalSeconds: true)) else {
            throw DecodingError.dataCorruptedError(forKey: .started, in: container, debugDescription: "not an ISO 8601 time with milliseconds")
        }
        self.started = date
        self.method = try container.decode(String.self, forKey: .method)
        self.url = try container.decode(String.self, forKey: .url)
        self.status = try container.decode(Int.self, forKey: .status)
        self.bytes = try container.decode(Int.self, forKey: .bytes)
        self.durationMilliseconds = try container.decode(Double.self, forKey: .durationMilliseconds)
        self.app = try container.decodeIfPresent(Requester.self, forKey: .app)
        self.applied = try container.decode(FlowApplied.self, forKey: .applied)
        self.error = try container.decodeIfPresent(String.self, forKey: .error)
    }
}
