import AuthBrokerHTTPAuth
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOConcurrencyHelpers

/// What a `TestAuthOrigin` does beyond plain verification: set at start, with `setBehaviour`,
/// or through its `/control` route.
package struct TestAuthBehaviour: Sendable, Hashable {
    /// A nonce that has already authenticated this many requests answers the next correct one
    /// with 401 `stale=true` and a new nonce (RFC 7616 §3.3); nil: no limit.
    package var staleAfter: Int?
    /// When a nonce's count of successful uses reaches a multiple of this, the
    /// `Authentication-Info` carries a `nextnonce` (RFC 7616 §3.5); nil: never. 1: every time.
    package var nextNonceEvery: Int?
    /// How long an issued nonce is accepted; a correct response with an older one gets
    /// 401 `stale=true`.
    package var nonceLifetime: Duration
    /// Never answers `Expect: 100-continue` (no 100, no early final status): reads the whole
    /// body first, as a server that predates it does.
    package var ignoresExpect: Bool
    /// Answers as `HTTP/1.0` and closes the connection after each response.
    package var speaksHTTP10: Bool
    /// Answers every `Expect: 100-continue` with 417 (Expectation Failed), as some proxies do.
    package var refusesExpect: Bool

    /// True: a Digest `nc` must exceed the highest seen for its nonce (stricter than RFC 7616, which
    /// only calls a repeated count a replay). False: each count is accepted once, in any order, as
    /// concurrent requests sharing a nonce over several connections arrive.
    package var strictCountOrder: Bool
    /// The Digest challenges' `domain` (RFC 7616 §3.3: the URIs the space covers); nil: none.
    package var digestDomain: String?

    package init(
        staleAfter: Int? = nil, nextNonceEvery: Int? = nil, nonceLifetime: Duration = .seconds(300), ignoresExpect: Bool = false,
        speaksHTTP10: Bool = false, refusesExpect: Bool = false, strictCountOrder: Bool = true, digestDomain: String? = nil
    ) {
        self.digestDomain = digestDomain
        self.strictCountOrder = strictCountOrder
        self.refusesExpect = refusesExpect
        self.staleAfter = staleAfter
        self.nextNonceEvery = nextNonceEvery
        self.nonceLifetime = nonceLifetime
        self.ignoresExpect = ignoresExpect
        self.speaksHTTP10 = speaksHTTP10
    }
}

/// What a `TestAuthOrigin` has seen, also served as JSON by `GET /stats`.
///
/// Only the protected routes count: `/stats` and `/control` do not.
package struct TestAuthStats: Sendable, Hashable, Codable {
    /// Requests to `/basic`, `/digest` and `/digest-userhash` routes.
    package var requests = 0
    /// Requests to `/open` that carried an `Authorization` field: credentials sent where none
    /// was asked for.
    package var openRequestsWithAuthorization = 0
    /// 401 responses sent (every one carries a fresh challenge).
    package var unauthorized = 0
    /// Requests whose credentials were verified (answered 200).
    package var successes = 0
    /// Well-formed credentials with a wrong user name or password (wrong `response`).
    package var failures = 0
    /// Correct Digest credentials on an expired or used-up nonce, answered `stale=true`.
    package var stale = 0
    /// Correct Digest credentials whose `nc` did not exceed the highest seen for the nonce.
    package var replays = 0
    /// Any other refused authorization: malformed, wrong scheme, realm, uri, algorithm, qop or
    /// opaque, a nonce never issued.
    package var rejections = 0
    /// Request body bytes received, on every route: what crossed the wire.
    package var bodyBytes = 0
    /// Requests that carried `Expect: 100-continue`.
    package var expectations = 0
    /// `100 Continue` responses sent.
    package var continues = 0
    /// Final responses sent before the request's body was read (to an `Expect: 100-continue`).
    package var earlyAnswers = 0

    package init() {}
}

/// An HTTP origin for integration tests that demands and verifies Basic (RFC 7617) and Digest
/// (RFC 7616) the way a real server does: from the password it knows, never trusting what the
/// client claims. 127.0.0.1, port 0, plain HTTP.
///
/// `Expect: 100-continue` is honoured as Apache does (unless `TestAuthBehaviour.ignoresExpect`):
/// a request without `Authorization` to a protected route, and any to `/too-large`, is answered
/// at once with its body unread (and the connection closed); any other gets a 100, then its
/// body is read. With `TestAuthBehaviour.refusesExpect` every `Expect` gets 417 instead.
///
/// Routes (any method; the request body is read, and hashed for `auth-int`, which needs it to
/// be at most 1 MiB; longer bodies are only counted):
/// - `/basic/<anything>`: realm `basic@test`, `charset="UTF-8"`; 200 `hello <user>`.
/// - `/digest/<algorithm>/<qop>/<anything>`: algorithm one of MD5, MD5-sess, SHA-256,
///   SHA-256-sess, SHA-512-256, SHA-512-256-sess; qop one of `auth`, `auth-int`, `none`
///   (RFC 2069: no qop, so no nc and no cnonce; not with `-sess`). Realm `digest@test`, random
///   nonces, an opaque. Checks the response, realm, uri (equal to the request-target), algorithm,
///   qop, opaque, that the nonce was issued here and is fresh, and that `nc` strictly increases
///   per nonce. On success, 200 `hello <user>` with `Authentication-Info: rspauth=...` (and
///   qop, cnonce, nc; `nextnonce` per `TestAuthBehaviour.nextNonceEvery`).
/// - `/digest-userhash/<algorithm>/<qop>/<anything>`: as `/digest`, offering `userhash=true`;
///   accepts the hashed user name (RFC 7616 §3.4.4) or the plain one.
/// - `/too-large/<anything>`: 413.
/// - `/open/<anything>`: no authentication; 200 `received <n> bytes`.
/// - `GET /stats`: `TestAuthStats` as JSON.
/// - `/control?staleAfter=N&nextNonceEvery=N&nonceLifetimeMs=N`: changes the behaviour (`none`
///   clears a limit); answers the behaviour as JSON.
///
/// A `delay-ms=N` query parameter, on any route, holds the reply to a complete request N ms
/// (a request in flight for that long).
///
/// For `-sess` algorithms, H(A1) keeps the cnonce of the first successful request with a nonce
/// (RFC 7616 §3.4.2), as `DigestSession` does.
package final class TestAuthOrigin: Sendable {
    package static let basicRealm = "basic@test"
    package static let digestRealm = "digest@test"

    package let port: Int
    package let name: String
    package let user: String
    private let core: AuthOriginCore
    private let channel: any Channel

    private init(port: Int, name: String, user: String, core: AuthOriginCore, channel: any Channel) {
        self.port = port
        self.name = name
        self.user = user
        self.core = core
        self.channel = channel
    }

    /// Starts a server that accepts `user` with `password`; with `identity`, over TLS with that certificate.
    package static func start(
        name: String, user: String, password: String, behaviour: TestAuthBehaviour = TestAuthBehaviour(),
        identity: TestIdentity? = nil
    ) async throws -> TestAuthOrigin {
        let core = AuthOriginCore(name: name, user: user, password: password, behaviour: behaviour)
        let tls = try identity.map { identity in
            try NIOSSLContext(
                configuration: .makeServerConfiguration(
                    certificateChain: [.certificate(try identity.nioCertificate())], privateKey: .privateKey(try identity.nioPrivateKey())
                )
            )
        }
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls)) }
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    try channel.pipeline.syncOperations.addHandler(AuthOriginHandler(core: core))
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        guard let port = channel.localAddress?.port else {
            try? await channel.close()
            throw TestSupportError("auth origin server has no port")
        }
        return TestAuthOrigin(port: port, name: name, user: user, core: core, channel: channel)
    }

    package func stop() async {
        try? await self.channel.close()
    }

    /// `http://127.0.0.1:<port><path>`.
    package func url(_ path: String) -> String { "http://127.0.0.1:\(self.port)\(path)" }

    /// A snapshot of the counters.
    package var stats: TestAuthStats { self.core.stats }

    package var behaviour: TestAuthBehaviour { self.core.behaviour }

    /// Replaces the behaviour; nonces already issued keep their counts.
    package func setBehaviour(_ behaviour: TestAuthBehaviour) {
        self.core.setBehaviour(behaviour)
    }

    /// How many nonces the server has issued so far.
    package var issuedNonceCount: Int { self.core.issuedNonceCount }
}

// MARK: - Routes

/// A protected Digest route's parameters, read from its path.
struct DigestRoute: Sendable, Hashable {
    var algorithm: DigestAlgorithm
    /// nil: RFC 2069 (no qop).
    var qop: DigestQOP?
    var userhash: Bool

    /// `digest|digest-userhash`, algorithm, qop, then anything.
    init?(pathParts parts: [String]) {
        guard parts.count >= 3, parts[0] == "digest" || parts[0] == "digest-userhash",
            let algorithm = DigestAlgorithm(token: parts[1])
        else { return nil }
        switch parts[2] {
        case "auth": self.qop = .auth
        case "auth-int": self.qop = .authInt
        case "none":
            // RFC 7616 §3.4.2: a -sess A1 needs a cnonce, which only comes with a qop.
            guard !algorithm.isSession else { return nil }
            self.qop = nil
        default: return nil
        }
        self.algorithm = algorithm
        self.userhash = parts[0] == "digest-userhash"
    }
}

/// A response the handler writes as it is.
struct AuthOriginReply: Sendable {
    var status: HTTPResponseStatus
    var headers: [(String, String)] = []
    var body: String
    var contentType = "text/plain"
}

/// The server's decisions and state, shared by every connection (hence the mutex).
final class AuthOriginCore: Sendable {
    private struct NonceRecord {
        var issued: ContinuousClock.Instant
        /// Highest `nc` accepted; 0 before the first.
        var highestNonceCount: UInt32 = 0
        var seenNonceCounts: Set<UInt32> = []
        /// Successful authentications with this nonce.
        var uses = 0
        /// For `-sess`: the cnonce of the first successful request, which H(A1) keeps.
        var sessionClientNonce: String?
    }

    private struct State {
        var behaviour: TestAuthBehaviour
        var stats = TestAuthStats()
        var nonces: [String: NonceRecord] = [:]
        var issued = 0

        mutating func issueNonce(now: ContinuousClock.Instant) -> String {
            if self.nonces.count > 4096 {
                let lifetime = self.behaviour.nonceLifetime
                self.nonces = self.nonces.filter { now - $0.value.issued <= lifetime }
            }
            let nonce = AuthOriginCore.randomHex(bytes: 16)
            self.nonces[nonce] = NonceRecord(issued: now)
            self.issued += 1
            return nonce
        }
    }

    /// Longest request body kept (for `auth-int`); an `auth-int` request with more is refused with 413.
    static let maxBodyBytes = 1 << 20

    let name: String
    private let user: String
    /// Changeable, as at a directory: `changePassword(_:)`.
    private let passwordBox: NIOLockedValueBox<String>
    private var password: String { self.passwordBox.withLockedValue { $0 } }
    private let opaque = AuthOriginCore.randomHex(bytes: 8)
    private let state: NIOLockedValueBox<State>

    init(name: String, user: String, password: String, behaviour: TestAuthBehaviour) {
        self.name = name
        self.user = user
        self.passwordBox = NIOLockedValueBox(password)
        self.state = NIOLockedValueBox(State(behaviour: behaviour))
    }

    /// The user's password changes (at the directory behind the server).
    func changePassword(_ password: String) {
        self.passwordBox.withLockedValue { $0 = password }
    }

    var stats: TestAuthStats { self.state.withLockedValue { $0.stats } }

    /// Counts what the connection handler saw beyond the routes' verdicts.
    func record(bodyBytes: Int = 0, expectation: Bool = false, continued: Bool = false, earlyAnswer: Bool = false) {
        self.state.withLockedValue { state in
            state.stats.bodyBytes += bodyBytes
            if expectation { state.stats.expectations += 1 }
            if continued { state.stats.continues += 1 }
            if earlyAnswer { state.stats.earlyAnswers += 1 }
        }
    }

    /// Whether a request for `target` with these headers is answered before its body is read
    /// (to an `Expect: 100-continue`): it is refused on its head alone.
    func answersOnHead(target: String, headers: HTTPHeaders) -> Bool {
        let first = target.split(separator: "/").first.map(String.init)
        switch first {
        case "too-large": return true
        case "basic", "digest", "digest-userhash": return headers["authorization"].isEmpty
        default: return false
        }
    }
    var behaviour: TestAuthBehaviour { self.state.withLockedValue { $0.behaviour } }
    var issuedNonceCount: Int { self.state.withLockedValue { $0.issued } }

    func setBehaviour(_ behaviour: TestAuthBehaviour) {
        self.state.withLockedValue { $0.behaviour = behaviour }
    }

    static func randomHex(bytes count: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        let bytes = (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
        return bytes.map { String(format: "%02x", $0) }.joined()
    }

    /// The reply to one complete request.
    /// - Parameter bodyLength: the body's length, when more came than `body` kept.
    func respond(method: String, target: String, headers: HTTPHeaders, body: [UInt8], bodyLength: Int? = nil) -> AuthOriginReply {
        let path = target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? target
        let parts = path.split(separator: "/").map(String.init)
        let authorization = headers["authorization"]
        switch parts.first {
        case "stats":
            return self.statsReply()
        case "too-large":
            return AuthOriginReply(status: .payloadTooLarge, body: "this route takes no body")
        case "open":
            if !authorization.isEmpty { self.state.withLockedValue { $0.stats.openRequestsWithAuthorization += 1 } }
            return AuthOriginReply(status: .ok, body: "received \(bodyLength ?? body.count) bytes")
        case "control":
            return self.control(target: target)
        case "basic":
            return self.basic(authorization: authorization)
        case "digest", "digest-userhash":
            guard let route = DigestRoute(pathParts: parts) else {
                return AuthOriginReply(status: .notFound, body: "no digest route \(path)")
            }
            return self.digest(route: route, method: method, target: target, authorization: authorization, body: body)
        default:
            return AuthOriginReply(status: .notFound, body: "no route \(path)")
        }
    }

    private func statsReply() -> AuthOriginReply {
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        let data = (try? encoder.encode(self.stats)) ?? Data()
        return AuthOriginReply(status: .ok, body: String(decoding: data, as: UTF8.self), contentType: "application/json")
    }

    private func control(target: String) -> AuthOriginReply {
        let items = URLComponents(string: target)?.queryItems ?? []
        var invalid: [String] = []
        let behaviour = self.state.withLockedValue { state in
            for item in items {
                let value = item.value ?? ""
                let number = value == "none" ? nil : Int(value)
                guard value == "none" || (number ?? -1) >= 0 else {
                    invalid.append(item.name)
                    continue
                }
                switch item.name {
                case "staleAfter": state.behaviour.staleAfter = number
                case "nextNonceEvery": state.behaviour.nextNonceEvery = number.flatMap { $0 > 0 ? $0 : nil }
                case "nonceLifetimeMs": state.behaviour.nonceLifetime = .milliseconds(number ?? 300_000)
                default: invalid.append(item.name)
                }
            }
            return state.behaviour
        }
        guard invalid.isEmpty else {
            return AuthOriginReply(status: .badRequest, body: "bad control parameters: \(invalid.joined(separator: ", "))")
        }
        let lifetime = behaviour.nonceLifetime.components
        let object: [String: Any] = [
            "staleAfter": behaviour.staleAfter.map { $0 as Any } ?? NSNull(),
            "nextNonceEvery": behaviour.nextNonceEvery.map { $0 as Any } ?? NSNull(),
            "nonceLifetimeMs": Int(lifetime.seconds * 1000 + lifetime.attoseconds / 1_000_000_000_000_000),
        ]
        let data = (try? JSONSerialization.data(withJSONObject: object, options: .sortedKeys)) ?? Data()
        return AuthOriginReply(status: .ok, body: String(decoding: data, as: UTF8.self), contentType: "application/json")
    }

    // MARK: Basic (RFC 7617)

    private enum Outcome {
        case challenge
        case success
        case failure
        case stale
        case replay
        case rejection
    }

    private func count(_ outcome: Outcome, in stats: inout TestAuthStats) {
        stats.requests += 1
        switch outcome {
        case .success: stats.successes += 1
        case .challenge: break
        case .failure: stats.failures += 1
        case .stale: stats.stale += 1
        case .replay: stats.replays += 1
        case .rejection: stats.rejections += 1
        }
        if outcome != .success { stats.unauthorized += 1 }
    }

    private func basic(authorization: [String]) -> AuthOriginReply {
        let outcome = self.verifyBasic(authorization: authorization)
        self.state.withLockedValue { self.count(outcome, in: &$0.stats) }
        guard outcome == .success else {
            return AuthOriginReply(
                status: .unauthorized,
                headers: [("WWW-Authenticate", #"Basic realm="\#(Self.basicRealm)", charset="UTF-8""#)],
                body: "basic authentication required"
            )
        }
        return AuthOriginReply(status: .ok, body: "hello \(self.user)")
    }

    private static let basicRealm = TestAuthOrigin.basicRealm
    private static let digestRealm = TestAuthOrigin.digestRealm

    private func verifyBasic(authorization: [String]) -> Outcome {
        guard let field = authorization.first else { return .challenge }
        guard authorization.count == 1 else { return .rejection }
        let pieces = field.split(separator: " ", omittingEmptySubsequences: true)
        guard pieces.count == 2, pieces[0].lowercased() == "basic",
            let data = Data(base64Encoded: String(pieces[1])),
            let pair = String(data: data, encoding: .utf8),
            let colon = pair.firstIndex(of: ":")
        else { return .rejection }
        // charset="UTF-8" was announced, so both sides compare in NFC (RFC 7617 §2.1).
        let user = String(pair[..<colon]).precomposedStringWithCanonicalMapping
        let password = String(pair[pair.index(after: colon)...]).precomposedStringWithCanonicalMapping
        let expectedUser = self.user.precomposedStringWithCanonicalMapping
        let expectedPassword = self.password.precomposedStringWithCanonicalMapping
        return user == expectedUser && password == expectedPassword ? .success : .failure
    }

    // MARK: Digest (RFC 7616)

    /// What the client sent, checked for form; the response itself is checked later.
    private struct DigestCredentials {
        var username: String
        var userhash: Bool
        var nonce: String
        var uri: String
        var response: String
        /// nil for RFC 2069.
        var qop: DigestQOP?
        /// The `nc` text exactly as sent (it is hashed as sent).
        var nonceCountText: String?
        var nonceCount: UInt32?
        var clientNonce: String?
    }

    private func digest(route: DigestRoute, method: String, target: String, authorization: [String], body: [UInt8]) -> AuthOriginReply {
        let now = ContinuousClock.now
        return self.state.withLockedValue { state -> AuthOriginReply in
            guard !authorization.isEmpty else {
                self.count(.challenge, in: &state.stats)
                return self.digestChallenge(route: route, stale: false, state: &state, now: now)
            }
            guard authorization.count == 1,
                let credentials = self.parseDigest(authorization[0], route: route, target: target)
            else {
                self.count(.rejection, in: &state.stats)
                return self.digestChallenge(route: route, stale: false, state: &state, now: now)
            }
            guard var record = state.nonces[credentials.nonce] else {
                self.count(.rejection, in: &state.stats)
                return self.digestChallenge(route: route, stale: false, state: &state, now: now)
            }
            let hash = route.algorithm.hashFunction
            let expectedUser = credentials.userhash ? hash.hex(self.user + ":" + Self.digestRealm) : self.user
            let sameUser = credentials.userhash ? credentials.username.lowercased() == expectedUser : credentials.username == expectedUser
            let sessionClientNonce = record.sessionClientNonce ?? credentials.clientNonce
            let ha1 = self.ha1(route: route, nonce: credentials.nonce, sessionClientNonce: sessionClientNonce)
            let ha2 = hash.hex(method + ":" + credentials.uri + (credentials.qop == .authInt ? ":" + hash.hex(body) : ""))
            let expected = Self.response(
                hash: hash, ha1: ha1, nonce: credentials.nonce, nonceCountText: credentials.nonceCountText,
                clientNonce: credentials.clientNonce, qop: credentials.qop, ha2: ha2
            )
            guard sameUser, credentials.response.lowercased() == expected else {
                self.count(.failure, in: &state.stats)
                return self.digestChallenge(route: route, stale: false, state: &state, now: now)
            }
            // The credentials are right; now the nonce's freshness and the count.
            if let nonceCount = credentials.nonceCount,
                state.behaviour.strictCountOrder ? nonceCount <= record.highestNonceCount : record.seenNonceCounts.contains(nonceCount)
            {
                self.count(.replay, in: &state.stats)
                return self.digestChallenge(route: route, stale: false, state: &state, now: now)
            }
            let exhausted = state.behaviour.staleAfter.map { record.uses >= $0 } ?? false
            if exhausted || now - record.issued > state.behaviour.nonceLifetime {
                self.count(.stale, in: &state.stats)
                return self.digestChallenge(route: route, stale: true, state: &state, now: now)
            }
            record.uses += 1
            record.highestNonceCount = max(credentials.nonceCount ?? 0, record.highestNonceCount)
            if let nonceCount = credentials.nonceCount, !state.behaviour.strictCountOrder { record.seenNonceCounts.insert(nonceCount) }
            if route.algorithm.isSession, record.sessionClientNonce == nil {
                record.sessionClientNonce = credentials.clientNonce
            }
            state.nonces[credentials.nonce] = record
            self.count(.success, in: &state.stats)

            let body = "hello \(self.user)"
            // rspauth: the response with an empty method in A2 (RFC 7616 §3.5).
            let responseHA2 = hash.hex(":" + credentials.uri + (credentials.qop == .authInt ? ":" + hash.hex(body) : ""))
            let rspauth = Self.response(
                hash: hash, ha1: ha1, nonce: credentials.nonce, nonceCountText: credentials.nonceCountText,
                clientNonce: credentials.clientNonce, qop: credentials.qop, ha2: responseHA2
            )
            var info = [#"rspauth="\#(rspauth)""#]
            if let qop = credentials.qop, let clientNonce = credentials.clientNonce, let nc = credentials.nonceCountText {
                info += ["qop=" + qop.rawValue, "cnonce=" + Self.quoted(clientNonce), "nc=" + nc]
            }
            if let every = state.behaviour.nextNonceEvery, every > 0, record.uses % every == 0 {
                info.append("nextnonce=" + Self.quoted(state.issueNonce(now: now)))
            }
            return AuthOriginReply(status: .ok, headers: [("Authentication-Info", info.joined(separator: ", "))], body: body)
        }
    }

    /// H(A1) (RFC 7616 §3.4.2), for the real user name even when the client hashed it.
    private func ha1(route: DigestRoute, nonce: String, sessionClientNonce: String?) -> String {
        let hash = route.algorithm.hashFunction
        let base = hash.hex(self.user + ":" + Self.digestRealm + ":" + self.password)
        guard route.algorithm.isSession, let sessionClientNonce else { return base }
        return hash.hex(base + ":" + nonce + ":" + sessionClientNonce)
    }

    /// KD(H(A1), nonce:nc:cnonce:qop:H(A2)) (RFC 7616 §3.4.1), or RFC 2069's KD(H(A1), nonce:H(A2)).
    private static func response(
        hash: DigestHashFunction, ha1: String, nonce: String, nonceCountText: String?, clientNonce: String?,
        qop: DigestQOP?, ha2: String
    ) -> String {
        guard let qop, let nonceCountText, let clientNonce else { return hash.hex(ha1 + ":" + nonce + ":" + ha2) }
        return hash.hex(ha1 + ":" + nonce + ":" + nonceCountText + ":" + clientNonce + ":" + qop.rawValue + ":" + ha2)
    }

    /// Reads the client's `Authorization: Digest ...` and checks everything but the response and
    /// the nonce: nil when it is not something this route can accept.
    private func parseDigest(_ field: String, route: DigestRoute, target: String) -> DigestCredentials? {
        // Credentials share the challenge syntax (RFC 9110 §11.4), so the challenge parser reads them.
        let parsed = AuthChallenge.parse(fieldValue: field)
        guard parsed.count == 1, let credentials = parsed.first, credentials.lowercasedScheme == "digest",
            credentials[parameter: "realm"] == Self.digestRealm,
            credentials[parameter: "uri"] == target,
            credentials[parameter: "opaque"] == self.opaque,
            let nonce = credentials[parameter: "nonce"],
            let response = credentials[parameter: "response"],
            // No algorithm means MD5 (RFC 7616 §3.3).
            DigestAlgorithm(token: credentials[parameter: "algorithm"] ?? "MD5") == route.algorithm
        else { return nil }

        let userhash = credentials[parameter: "userhash"]?.lowercased() == "true"
        guard !userhash || route.userhash else { return nil }
        let username: String
        if let plain = credentials[parameter: "username"], credentials[parameter: "username*"] == nil {
            username = plain
        } else if let extended = credentials[parameter: "username*"], credentials[parameter: "username"] == nil, !userhash,
            let decoded = Self.decodeExtValue(extended)
        {
            username = decoded
        } else {
            return nil
        }

        var result = DigestCredentials(
            username: username, userhash: userhash, nonce: nonce, uri: target, response: response
        )
        let qop = credentials[parameter: "qop"]?.lowercased()
        if let routeQOP = route.qop {
            guard qop == routeQOP.rawValue, let nc = credentials[parameter: "nc"], nc.utf8.count == 8,
                nc.allSatisfy(\.isHexDigit), let count = UInt32(nc, radix: 16),
                let clientNonce = credentials[parameter: "cnonce"], !clientNonce.isEmpty
            else { return nil }
            result.qop = routeQOP
            result.nonceCountText = nc
            result.nonceCount = count
            result.clientNonce = clientNonce
        } else {
            guard qop == nil, credentials[parameter: "nc"] == nil, credentials[parameter: "cnonce"] == nil else { return nil }
        }
        return result
    }

    /// A 401 with a new nonce for this route.
    private func digestChallenge(route: DigestRoute, stale: Bool, state: inout State, now: ContinuousClock.Instant) -> AuthOriginReply {
        var parameters: [AuthParameter] = [AuthParameter(name: "realm", value: Self.digestRealm)]
        if let qop = route.qop { parameters.append(AuthParameter(name: "qop", value: qop.rawValue)) }
        parameters.append(AuthParameter(name: "algorithm", value: route.algorithm.rawValue))
        parameters.append(AuthParameter(name: "nonce", value: state.issueNonce(now: now)))
        parameters.append(AuthParameter(name: "opaque", value: self.opaque))
        if let domain = state.behaviour.digestDomain { parameters.append(AuthParameter(name: "domain", value: domain)) }
        if stale { parameters.append(AuthParameter(name: "stale", value: "true")) }
        if route.userhash { parameters.append(AuthParameter(name: "userhash", value: "true")) }
        let field = AuthChallenge(scheme: "Digest", parameters: parameters).serialized() ?? "Digest"
        return AuthOriginReply(status: .unauthorized, headers: [("WWW-Authenticate", field)], body: "digest authentication required")
    }

    /// A quoted-string (RFC 9110 §5.6.4).
    static func quoted(_ value: String) -> String {
        "\"" + value.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }

    /// RFC 8187 `ext-value` with charset UTF-8: `UTF-8'<language>'<percent-encoded>`.
    static func decodeExtValue(_ value: String) -> String? {
        let pieces = value.split(separator: "'", maxSplits: 2, omittingEmptySubsequences: false)
        guard pieces.count == 3, pieces[0].lowercased() == "utf-8" else { return nil }
        var bytes: [UInt8] = []
        var iterator = Array(pieces[2].utf8).makeIterator()
        while let byte = iterator.next() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard let high = iterator.next(), let low = iterator.next(),
                let value = UInt8(String(decoding: [high, low], as: UTF8.self), radix: 16)
            else { return nil }
            bytes.append(value)
        }
        return String(validating: bytes, as: UTF8.self)
    }
}

// MARK: - Connection handler

private final class AuthOriginHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let core: AuthOriginCore
    private var head: HTTPRequestHead?
    private var body: [UInt8] = []
    private var bodyTooLarge = false
    /// The response went before the body (to an `Expect`): the rest of the request is not read.
    private var answeredEarly = false
    private var bodyLength = 0

    init(core: AuthOriginCore) {
        self.core = core
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch self.unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
            self.body = []
            self.bodyTooLarge = false
            self.answeredEarly = false
            self.bodyLength = 0
            let expects = head.headers["expect"].contains { $0.lowercased() == "100-continue" }
            guard expects else { return }
            self.core.record(expectation: true)
            guard !self.core.behaviour.ignoresExpect else { return }
            if self.core.behaviour.refusesExpect {
                self.answeredEarly = true
                self.core.record(earlyAnswer: true)
                let reply = AuthOriginReply(status: .expectationFailed, body: "no expectations here")
                self.write(reply, context: context, keepAlive: false, withBody: head.method != .HEAD)
            } else if self.core.answersOnHead(target: head.uri, headers: head.headers) {
                // Like Apache: refused on the head, the body never read; the connection cannot
                // carry another request.
                self.answeredEarly = true
                self.core.record(earlyAnswer: true)
                let reply = self.core.respond(method: head.method.rawValue, target: head.uri, headers: head.headers, body: [])
                self.write(reply, context: context, keepAlive: false, withBody: head.method != .HEAD)
            } else {
                self.core.record(continued: true)
                context.writeAndFlush(self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .continue))), promise: nil)
            }
        case .body(var buffer):
            self.core.record(bodyBytes: buffer.readableBytes)
            guard !self.answeredEarly else { return }
            self.bodyLength += buffer.readableBytes
            if self.body.count + buffer.readableBytes > AuthOriginCore.maxBodyBytes {
                self.bodyTooLarge = true
                self.body = []
            } else if !self.bodyTooLarge, let bytes = buffer.readBytes(length: buffer.readableBytes) {
                self.body += bytes
            }
        case .end:
            guard let head = self.head, !self.answeredEarly else { return }
            self.head = nil
            let reply =
                self.bodyTooLarge && head.uri.contains("/auth-int/")
                ? AuthOriginReply(status: .payloadTooLarge, body: "auth-int takes at most \(AuthOriginCore.maxBodyBytes) bytes of body")
                : self.core.respond(
                    method: head.method.rawValue, target: head.uri, headers: head.headers, body: self.body, bodyLength: self.bodyLength
                )
            self.body = []
            let keepAlive = head.isKeepAlive && !self.core.behaviour.speaksHTTP10
            let withBody = head.method != .HEAD
            guard let delay = Self.delay(in: head.uri) else {
                self.write(reply, context: context, keepAlive: keepAlive, withBody: withBody)
                return
            }
            let bound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.scheduleTask(in: delay) {
                let (handler, context) = bound.value
                handler.write(reply, context: context, keepAlive: keepAlive, withBody: withBody)
            }
        }
    }

    /// The `delay-ms` query parameter's hold, if the target has one.
    private static func delay(in target: String) -> TimeAmount? {
        let items = URLComponents(string: target)?.queryItems ?? []
        guard let value = items.first(where: { $0.name == "delay-ms" })?.value, let milliseconds = Int64(value) else { return nil }
        return .milliseconds(milliseconds)
    }

    /// Writes the reply; a HEAD reply keeps its content-length but sends no body.
    private func write(_ reply: AuthOriginReply, context: ChannelHandlerContext, keepAlive: Bool, withBody: Bool) {
        var headers = HTTPHeaders()
        for (name, value) in reply.headers { headers.add(name: name, value: value) }
        headers.add(name: "content-type", value: reply.contentType)
        headers.add(name: "content-length", value: String(reply.body.utf8.count))
        headers.add(name: "x-origin", value: self.core.name)
        let version: HTTPVersion = self.core.behaviour.speaksHTTP10 ? .http1_0 : .http1_1
        if !keepAlive && version == .http1_1 { headers.add(name: "connection", value: "close") }
        context.write(self.wrapOutboundOut(.head(HTTPResponseHead(version: version, status: reply.status, headers: headers))), promise: nil)
        if withBody {
            context.write(self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: reply.body)))), promise: nil)
        }
        let channel = context.channel
        context.writeAndFlush(self.wrapOutboundOut(.end(nil))).whenComplete { _ in
            if !keepAlive { channel.close(promise: nil) }
        }
    }
}

// MARK: - Proxy authentication (for TestForwardProxy)

/// How a `TestForwardProxy` wants clients to authenticate (407, RFC 9110 §11.7).
package enum TestProxyAuth: Sendable, Hashable {
    case none
    case basic
    /// Digest with this algorithm and qop (`auth`, `auth-int`, `none`), as `/digest/<algorithm>/<qop>`.
    case digest(algorithm: String, qop: String)
}

extension AuthOriginCore {
    /// Checks a request's `Proxy-Authorization` exactly as `/basic` or `/digest/...` check
    /// `Authorization` (Digest's `uri` must equal `target`): nil when accepted, else the 407's
    /// `Proxy-Authenticate` headers. Counted in `stats` like an origin's 401s.
    func proxyChallenge(_ auth: TestProxyAuth, method: String, target: String, proxyAuthorization: [String]) -> [(String, String)]? {
        let reply: AuthOriginReply
        switch auth {
        case .none:
            return nil
        case .basic:
            reply = self.basic(authorization: proxyAuthorization)
        case .digest(let algorithm, let qop):
            guard let route = DigestRoute(pathParts: ["digest", algorithm, qop]) else { return [] }
            reply = self.digest(route: route, method: method, target: target, authorization: proxyAuthorization, body: [])
        }
        guard reply.status == .unauthorized else { return nil }
        return reply.headers.map { name, value in
            (name.lowercased() == "www-authenticate" ? "Proxy-Authenticate" : name, value)
        }
    }
}
