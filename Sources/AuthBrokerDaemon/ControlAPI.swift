import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerKerberos
import AuthBrokerPAM
import AuthBrokerTrust
import Foundation
import NIOCore
import NIOHTTP1

/// A control API response, ready to write.
package struct ControlResponse: Sendable {
    package var status: HTTPResponseStatus
    package var headers: HTTPHeaders
    package var body: ByteBuffer
}

/// What `GET /v1/status` reports.
package struct StatusReport: Codable, Sendable {
    package struct SystemAnchors: Codable, Sendable {
        package var path: String
        package var count: Int
        package init(path: String, count: Int) {
            self.path = path
            self.count = count
        }
    }
    package var version: String
    package var pid: Int
    package var startedAt: Date
    package var uptimeSeconds: Double
    package var socket: String
    /// The proxy port's addresses (`127.0.0.1:21000`); empty when it is off.
    package var proxyPort: [String]
    package var configFile: String
    package var configLoaded: Bool
    package var stateDirectory: String
    package var systemAnchors: SystemAnchors
    package var userAnchors: Int
    package var pins: Int
    package var counters: [String: Int]
    package struct SecretStoreStatus: Codable, Sendable {
        package var backend: String
        package var reason: String
        package init(backend: String, reason: String) {
            self.backend = backend
            self.reason = reason
        }
    }
    /// Which secret store is in use and why.
    package var secretStore: SecretStoreStatus?
    package var identities: Int
    /// Things the user should act on: identities expired or expiring within 30 days, passwords refused.
    package var warnings: [String]
    /// The HTTP cache's counters; nil when it is off.
    package var cache: ResponseCache.Counters?
    /// The user's Kerberos credential and the Negotiate counters; nil when `[kerberos]` names
    /// no host and not the proxy.
    package var kerberos: KerberosStatus?

    /// `kerberos` in `GET /v1/status`.
    package struct KerberosStatus: Codable, Sendable, Equatable {
        /// "valid", "expired" or "missing".
        package var ticket: String
        package var principal: String?
        package var expires: Date?
        /// What GSS-API said when it found no usable ticket.
        package var detail: String?
        package var hosts: [String]
        package var proxy: Bool
        package var contextsStarted: Int
        package var contextsAccepted: Int
        package var mutualVerified: Int
        package var failures: Int
        /// The latest failure (`kind: detail`), while nothing has succeeded since.
        package var lastFailure: String?

        enum CodingKeys: String, CodingKey {
            case ticket, principal, expires, detail, hosts, proxy, failures
            case contextsStarted = "contexts_started"
            case contextsAccepted = "contexts_accepted"
            case mutualVerified = "mutual_verified"
            case lastFailure = "last_failure"
        }

        /// What `status` warns about: no ticket, an expired one, one about to expire.
        package func warnings(now: Date) -> [String] {
            switch self.ticket {
            case "valid":
                guard let expires, expires.timeIntervalSince(now) < KerberosNegotiator.expiryWarning else { return [] }
                let minutes = max(0, Int(expires.timeIntervalSince(now) / 60))
                return ["The Kerberos ticket of \(self.principal ?? "your principal") expires in \(minutes) minutes; run `kinit` (or `kinit -R`) to renew it."]
            case "expired":
                return ["The Kerberos ticket of \(self.principal ?? "your principal") has expired: servers in [kerberos] hosts get no ticket; run `kinit`."]
            default:
                return ["No Kerberos ticket: servers in [kerberos] hosts get none until you run `kinit` (the daemon looks where KRB5CCNAME in its environment points, else the default cache)."]
            }
        }
    }

    package static let offlineWarning = "Offline mode is on: requests are answered from the cache only (`authbrokerctl offline off` ends it)."

    package static func warnings(identities: [ClientIdentity], failedPasswords: Int, now: Date) -> [String] {
        var warnings: [String] = []
        for identity in identities {
            if identity.isExpired(at: now) {
                warnings.append("The client identity '\(identity.name)' has expired and is not presented; import a renewed certificate.")
            } else if identity.expires(within: 30 * 86400, of: now) {
                let days = Int(identity.certificate.notAfter.timeIntervalSince(now) / 86400)
                warnings.append("The client identity '\(identity.name)' expires in \(days) days (\(identity.certificate.notAfter)); import a renewed certificate.")
            }
        }
        if failedPasswords > 0 {
            warnings.append("\(failedPasswords) stored password(s) were refused by their servers and are not sent; `authbrokerctl passwords list` shows them.")
        }
        return warnings
    }

    package init(
        version: String, pid: Int, startedAt: Date, uptimeSeconds: Double, socket: String, proxyPort: [String] = [], configFile: String,
        configLoaded: Bool, stateDirectory: String, systemAnchors: SystemAnchors, userAnchors: Int, pins: Int,
        counters: [String: Int], secretStore: SecretStoreStatus? = nil, identities: Int = 0, warnings: [String] = [],
        cache: ResponseCache.Counters? = nil
    ) {
        self.cache = cache
        self.secretStore = secretStore
        self.identities = identities
        self.warnings = warnings
        self.version = version
        self.pid = pid
        self.startedAt = startedAt
        self.uptimeSeconds = uptimeSeconds
        self.socket = socket
        self.proxyPort = proxyPort
        self.configFile = configFile
        self.configLoaded = configLoaded
        self.stateDirectory = stateDirectory
        self.systemAnchors = systemAnchors
        self.userAnchors = userAnchors
        self.pins = pins
        self.counters = counters
    }

    enum CodingKeys: String, CodingKey {
        case version, pid, socket, counters, pins, identities, warnings, cache, kerberos
        case secretStore = "secret_store"
        case startedAt = "started_at"
        case uptimeSeconds = "uptime_seconds"
        case proxyPort = "proxy_port"
        case configFile = "config_file"
        case configLoaded = "config_loaded"
        case stateDirectory = "state_directory"
        case systemAnchors = "system_anchors"
        case userAnchors = "user_anchors"
    }
}

/// What the daemon saw when it shook hands with a server for `POST /v1/inspect`.
package struct Inspection: Sendable {
    package var decision: TrustDecision
    package var chainPEM: [String]
}

/// The control API: origin-form requests under `/v1/` (documented in `docs/api/openapi.yaml`).
///
/// One dispatch over (method, path); every failure is a problem+json body with a stable code.
package struct ControlAPI: Sendable {
    package let store: TrustStore
    package let vault: PasswordVault
    /// The PAM gate in front of revealing secrets; nil when this daemon has none (reveal refused).
    package let reauth: ReauthService?
    /// Challenges and agents; nil in tests of the router alone.
    package let challenges: AgentChallenges?
    /// Client identities; nil when the daemon has no secret store for their keys.
    package let identities: ClientIdentities?
    package let status: @Sendable () -> StatusReport
    package let inspect: @Sendable (CanonicalOrigin) async throws -> Inspection
    /// Wildcards that cover one of these are refused as the scope of trust material.
    package let publicSuffixes: PublicSuffixList
    /// The interception CA; nil in tests of the router alone.
    package let localCA: LocalCA?
    /// `POST /v1/reload`; nil in tests of the router alone.
    package let reloader: RulesReloader?
    /// The recent flows; nil in tests of the router alone.
    package let flows: FlowLog?
    /// The HTTP cache; nil when it is off.
    package let cache: ResponseCache?
    /// Negotiate; nil in tests of the router alone.
    package let kerberos: KerberosNegotiator?

    package init(
        store: TrustStore, vault: PasswordVault, reauth: ReauthService? = nil, challenges: AgentChallenges? = nil,
        identities: ClientIdentities? = nil, localCA: LocalCA? = nil, reloader: RulesReloader? = nil, flows: FlowLog? = nil,
        cache: ResponseCache? = nil, kerberos: KerberosNegotiator? = nil, publicSuffixes: PublicSuffixList = .defaultRuleOnly,
        status: @escaping @Sendable () -> StatusReport,
        inspect: @escaping @Sendable (CanonicalOrigin) async throws -> Inspection
    ) {
        self.publicSuffixes = publicSuffixes
        self.store = store
        self.vault = vault
        self.reauth = reauth
        self.challenges = challenges
        self.identities = identities
        self.localCA = localCA
        self.reloader = reloader
        self.flows = flows
        self.cache = cache
        self.kerberos = kerberos
        self.status = status
        self.inspect = inspect
    }

    /// Largest request body the control API accepts (a PEM bundle fits easily).
    package static let maxBodyBytes = 1 << 20

    package func handle(
        method: HTTPMethod, path: String, query: String?, body: ByteBuffer, requestID: String, peer: PeerIdentity? = nil
    ) async -> ControlResponse {
        do {
            return try await self.route(method: method, path: path, query: query, body: body, peer: peer)
        } catch let error as BrokerError {
            return Self.problem(error, requestID: requestID)
        } catch {
            return Self.problem(.internalError("Unexpected control API error: \(error)"), requestID: requestID)
        }
    }

    private func route(
        method: HTTPMethod, path: String, query: String?, body: ByteBuffer, peer: PeerIdentity?
    ) async throws -> ControlResponse {
        let segments = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        switch (method, segments) {
        case (.GET, ["v1", "status"]):
            var report = self.status()
            if let kerberos = self.kerberos, kerberos.policy.isEnabled {
                // The credential cache is read on the blocking pool, never here.
                let status = await Self.kerberosStatus(kerberos)
                report.kerberos = status
                report.warnings += status.warnings(now: Date())
            }
            return try Self.json(.ok, report)

        case (.GET, ["v1", "anchors"]):
            return try Self.json(.ok, ["anchors": self.store.anchors().map(AnchorJSON.init)])
        case (.POST, ["v1", "anchors"]):
            let request = try Self.decode(AddAnchorRequest.self, from: body)
            let hosts = try self.trustScope(request.hosts ?? [])
            let added = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.addAnchors(pem: request.pem, hosts: hosts, widening: request.widen == true) }
            return try Self.json(.created, ["anchors": added.map(AnchorJSON.init)])
        case (.DELETE, let s) where s.count == 3 && s[0] == "v1" && s[1] == "anchors":
            let removed = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.removeAnchor(idPrefix: s[2]) }
            return try Self.json(.ok, ["removed": AnchorJSON(removed)])

        case (.GET, ["v1", "passwords"]):
            return try Self.json(.ok, ["passwords": try await self.vault.list().map(PasswordJSON.init)])
        case (.POST, ["v1", "passwords"]):
            let request = try Self.decode(AddPasswordRequest.self, from: body)
            let origin = try Self.origin(request.url)
            guard !request.user.contains(":") else {
                throw BrokerError.badRequest(
                    code: .invalidUser, detail: "The user name must not contain ':' (Basic authentication cannot carry it, RFC 7617 §2)."
                )
            }
            let persistence = try Self.persistence(request.persistence)
            try await self.vault.add(
                origin: origin, realm: request.realm, credential: PasswordCredential(user: request.user, password: request.password),
                persistence: persistence
            )
            let added = StoredPasswordInfo(origin: origin, realm: request.realm, user: request.user, persistence: persistence, failed: false)
            return try Self.json(.created, ["password": PasswordJSON(added)])
        case (.POST, ["v1", "passwords", "reveal"]):
            let request = try Self.decode(RevealPasswordRequest.self, from: body)
            try self.requireGrant(peer, for: "reveal a password")
            let origin = try Self.origin(request.url)
            let credential = try await self.vault.reveal(origin: origin, realm: request.realm, user: request.user)
            var response = try Self.json(.ok, ["password": credential.password])
            response.headers.replaceOrAdd(name: "Cache-Control", value: "no-store")
            return response

        case (.GET, ["v1", "identities"]):
            return try Self.json(.ok, ["identities": self.store.identities().map { IdentityJSON($0, now: Date()) }])
        case (.POST, ["v1", "identities"]):
            let request = try Self.decode(ImportIdentityRequest.self, from: body)
            let hosts = try self.trustScope(request.hosts ?? [])
            let input: IdentityImport
            if let pkcs12 = request.pkcs12Base64 {
                guard let data = Data(base64Encoded: pkcs12) else {
                    throw BrokerError.badRequest(code: .invalidIdentity, detail: "pkcs12_base64 is not base64.")
                }
                input = .pkcs12(data: Array(data), passphrase: Array((request.passphrase ?? "").utf8))
            } else if let cert = request.certPEM, let key = request.keyPEM {
                input = .pem(chain: Array(cert.utf8), key: Array(key.utf8), passphrase: request.passphrase.map { Array($0.utf8) })
            } else {
                throw BrokerError.badRequest(
                    code: .missingIdentity, detail: "Give pkcs12_base64 (and passphrase), or cert_pem and key_pem."
                )
            }
            let imported = try await self.identityService().importIdentity(
                name: request.name, hosts: hosts, replace: request.replace ?? false, from: input
            )
            return try Self.json(.created, ["identity": IdentityJSON(imported, now: Date())])
        case (.DELETE, let s) where s.count == 3 && s[0] == "v1" && s[1] == "identities":
            let removed = try await self.identityService().remove(name: s[2])
            return try Self.json(.ok, ["removed": IdentityJSON(removed, now: Date())])
        case (.POST, let s) where s.count == 4 && s[0] == "v1" && s[1] == "identities" && s[3] == "export":
            try self.requireGrant(peer, for: "export a client identity")
            let exported = try await self.identityService().export(name: s[2])
            var response = try Self.json(
                .ok,
                ExportedIdentityJSON(
                    format: exported.format, dataBase64: Data(exported.data).base64EncodedString(),
                    passphrase: exported.passphrase.map { String(decoding: $0, as: UTF8.self) }
                )
            )
            response.headers.replaceOrAdd(name: "Cache-Control", value: "no-store")
            return response

        case (.POST, ["v1", "reload"]):
            guard let reloader = self.reloader else {
                throw BrokerError.internalError("This daemon was started without a config reloader.")
            }
            do {
                let report = try reloader.reload()
                return try Self.json(
                    .ok,
                    ReloadJSON(routes: report.routes, responses: report.responses, rewrites: report.rewrites, restartNeeded: report.restartNeeded)
                )
            } catch {
                throw BrokerError(
                    code: .invalidConfig, status: .unprocessableEntity, title: "The config file has an error",
                    detail: "\(error). Nothing was changed: the rules in use stay. Fix the line and reload again."
                )
            }

        case (.GET, ["v1", "ca"]):
            let localCA = try self.localCAAvailable()
            return try Self.json(.ok, await LocalCAJSON(try await localCA.authority(), of: localCA))
        case (.POST, ["v1", "ca", "rotate"]):
            let localCA = try self.localCAAvailable()
            return try Self.json(.ok, await LocalCAJSON(try await localCA.rotate(), of: localCA))

        case (.GET, ["v1", "flows"]):
            let flows = try self.flowLogOn()
            let parameters = Self.queryParameters(query)
            let last = try Self.flowCount(parameters)
            // A valid `follow=true` is served as a stream before it gets here (flow log on).
            _ = try Self.flag(parameters["follow"], name: "follow")
            let wasRecording = flows.startRecording()
            return try Self.json(.ok, FlowListJSON(flows: flows.recent(last).map(FlowSummary.init), recordingStarted: !wasRecording))
        case (.GET, ["v1", "flows", "har"]):
            let flows = try self.flowLogOn()
            let parameters = Self.queryParameters(query)
            let last = try Self.flowCount(parameters)
            let reveal = try Self.flag(parameters["reveal"], name: "reveal")
            if reveal { try self.requireGrant(peer, for: "export flows with their secret header values") }
            flows.startRecording()
            let archive = HTTPArchive(
                flows: flows.recent(last), masking: reveal ? nil : flows.masking, creatorVersion: AuthBrokerVersion.current
            )
            return Self.json(.ok, data: try archive.encoded())

        case (.GET, ["v1", "cache"]):
            return try Self.json(.ok, CacheStatusJSON(self.cache))
        case (.DELETE, ["v1", "cache"]):
            let removed = await (try self.cacheOn()).clear()
            return try Self.json(.ok, ["removed": removed])
        case (.GET, ["v1", "cache", "entries"]):
            let cache = try self.cacheOn()
            let now = Date()
            return try Self.json(.ok, ["entries": cache.entries().map { CacheEntryJSON($0.entry, now: now) }])
        case (.DELETE, ["v1", "cache", "entries"]):
            let cache = try self.cacheOn()
            guard let text = Self.queryParameters(query)["url"], !text.isEmpty else {
                throw BrokerError.badRequest(code: .missingParameter, detail: "Name the URL to remove: DELETE /v1/cache/entries?url=https://host/path.")
            }
            let url: String
            switch RequestTarget.parse(method: "GET", uri: text) {
            case .success(.absolute(let origin, let pathAndQuery)): url = origin.description + pathAndQuery
            default:
                throw BrokerError.badRequest(code: .invalidURL, detail: "\(text.prefix(200)) is not an http:// or https:// URL.")
            }
            return try Self.json(.ok, ["removed": await cache.remove(urls: [url])])
        case (.PUT, ["v1", "cache", "offline"]):
            let cache = try self.cacheOn()
            let request = try Self.decode(OfflineRequest.self, from: body)
            cache.setOffline(request.offline)
            return try Self.json(.ok, CacheStatusJSON(cache))

        case (.GET, ["v1", "challenges"]):
            let pending = await (try self.agentsAvailable()).pendingChallenges()
            return try Self.json(
                .ok,
                ["challenges": pending.map { ChallengeJSON($0.challenge.id, space: $0.challenge.space, requester: $0.requester, age: $0.age, waiting: $0.challenge.waiters.count, awaitingAgent: $0.challenge.awaitingAgent) }]
            )
        case (.POST, let s) where s.count == 4 && s[0] == "v1" && s[1] == "agent" && s[3] == "answer":
            guard let agent = UInt64(s[2]) else {
                throw BrokerError.badRequest(code: .invalidAgent, detail: "'\(s[2].prefix(40))' is not an agent id (the first event of GET /v1/agent names it).")
            }
            let request = try Self.decode(AgentAnswerRequest.self, from: body)
            guard let challenge = UInt64(request.challenge) else {
                throw BrokerError.badRequest(code: .invalidChallenge, detail: "'\(request.challenge.prefix(40))' is not a challenge id.")
            }
            let reply: AgentChallenges.AgentReply
            if request.decline == true {
                reply = .decline
            } else if let trust = request.trust {
                reply = try Self.trustReply(trust, scope: request.scope)
            } else if let user = request.user, let password = request.password {
                guard !user.contains(":") else {
                    throw BrokerError.badRequest(code: .invalidUser, detail: "A user name for Basic authentication cannot contain ':' (RFC 7617 §2).")
                }
                let persistence = try Self.persistence(request.persistence ?? "none", allowNone: true)
                reply = .credential(PasswordCredential(user: user, password: password), persistence: persistence)
            } else {
                throw BrokerError.badRequest(
                    code: .missingAnswer,
                    detail: "Answer with {\"challenge\", \"user\", \"password\", \"persistence\"} (a password challenge), {\"challenge\", \"trust\": \"once\"|\"always\"|\"reject\", \"scope\"?} (a server-trust challenge) or {\"challenge\", \"decline\": true}."
                )
            }
            try await (try self.agentsAvailable()).agentReplied(agent: agent, challenge: challenge, reply)
            return try Self.json(.ok, ["accepted": true])

        case (.POST, ["v1", "reauth"]):
            let (reauth, peer) = try self.reauthAndPeer(peer)
            return try Self.reauthResponse(await reauth.begin(for: peer))
        case (.POST, let s) where s.count == 3 && s[0] == "v1" && s[1] == "reauth":
            let (reauth, peer) = try self.reauthAndPeer(peer)
            guard let id = UInt64(s[2]) else {
                throw BrokerError.badRequest(code: .invalidTransaction, detail: "'\(s[2].prefix(40))' is not a re-authentication transaction id.")
            }
            let request = try Self.decode(ReauthAnswerRequest.self, from: body)
            let response: PAMResponse
            if request.cancel == true {
                response = .cancel
            } else if let answer = request.answer {
                response = .answer(PAMSecret(answer))
            } else {
                throw BrokerError.badRequest(code: .missingAnswer, detail: "Send {\"answer\": \"...\"} to answer the prompt, or {\"cancel\": true}.")
            }
            guard let step = await reauth.answer(transaction: id, from: peer, response) else {
                throw BrokerError(
                    code: .transactionNotFound, status: .notFound, title: "No such re-authentication",
                    detail: "Transaction \(id) does not exist, has ended, or belongs to another process. Start again with POST /v1/reauth."
                )
            }
            return try Self.reauthResponse(step)

        case (.DELETE, ["v1", "passwords"]):
            let parameters = Self.queryParameters(query)
            guard let url = parameters["url"], let user = parameters["user"] else {
                throw BrokerError.badRequest(
                    code: .missingParameter,
                    detail: "DELETE /v1/passwords needs the query parameters url and user (and realm, if the password has one), percent-encoded."
                )
            }
            let removed = try await self.vault.remove(origin: try Self.origin(url), realm: parameters["realm"], user: user)
            return try Self.json(.ok, ["removed": PasswordJSON(removed)])

        case (.GET, ["v1", "pins"]):
            return try Self.json(.ok, ["pins": self.store.pins().map(PinJSON.init)])
        case (.POST, ["v1", "pins"]):
            let request = try Self.decode(PinRequest.self, from: body)
            let host = try Self.hostPatterns([request.host])[0]
            let pin = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.addPin(host: host, spkiSHA256: request.spkiSHA256) }
            return try Self.json(.created, ["pin": PinJSON(pin)])
        case (.DELETE, ["v1", "pins"]):
            let parameters = Self.queryParameters(query)
            guard let hostText = parameters["host"], let spki = parameters["spki_sha256"] else {
                throw BrokerError.badRequest(
                    code: .missingParameter,
                    detail: "DELETE /v1/pins needs the query parameters host and spki_sha256 (percent-encoded)."
                )
            }
            let host = try Self.hostPatterns([hostText])[0]
            let removed = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.removePin(host: host, spkiSHA256: spki) }
            return try Self.json(.ok, ["removed": PinJSON(removed)])

        case (.GET, ["v1", "exceptions"]):
            let (saved, session) = self.store.exceptions()
            return try Self.json(
                .ok, ["exceptions": saved.map { ExceptionJSON($0, persistent: true) } + session.map { ExceptionJSON($0, persistent: false) }]
            )
        case (.POST, ["v1", "exceptions"]):
            let request = try Self.decode(ExceptionRequest.self, from: body)
            let target = try Self.mapStoreError { () throws(TrustStoreError) in try CertificateException.parseHost(request.host) }
            try self.refuseIfCoversPublicSuffix(target.host)
            var expiresAt: Date?
            if let lifetime = request.expires {
                do {
                    expiresAt = Date().addingTimeInterval(TimeInterval(try LifetimeText.seconds(lifetime)))
                } catch {
                    throw BrokerError.badRequest(code: .invalidLifetime, detail: "expires: \(error.message)")
                }
            }
            let added = try Self.mapStoreError { () throws(TrustStoreError) in
                try self.store.addException(
                    host: target.host, port: target.port, sha256: request.sha256, persistent: true, expiresAt: expiresAt
                )
            }
            return try Self.json(.created, ["exception": ExceptionJSON(added, persistent: true)])
        case (.DELETE, ["v1", "exceptions"]):
            let parameters = Self.queryParameters(query)
            guard let hostText = parameters["host"], let sha256 = parameters["sha256"] else {
                throw BrokerError.badRequest(
                    code: .missingParameter,
                    detail: "DELETE /v1/exceptions needs the query parameters host (host or host:port, as listed) and sha256 (percent-encoded)."
                )
            }
            let target = try Self.mapStoreError { () throws(TrustStoreError) in try CertificateException.parseHost(hostText) }
            let removed = try Self.mapStoreError { () throws(TrustStoreError) in
                try self.store.removeException(host: target.host, port: target.port, sha256: sha256)
            }
            return try Self.json(.ok, ["removed": ExceptionJSON(removed.exception, persistent: removed.persistent)])

        case (.POST, ["v1", "inspect"]):
            let request = try Self.decode(InspectRequest.self, from: body)
            let origin: CanonicalOrigin
            do {
                origin = try CanonicalOrigin(parsing: request.url)
            } catch {
                throw BrokerError.badRequest(code: .invalidURL, detail: "\(request.url) is not a usable URL: \(error.message)")
            }
            guard origin.scheme == .https else {
                throw BrokerError.badRequest(
                    code: .invalidURL, detail: "Only https:// URLs present certificates; got \(request.url)."
                )
            }
            let inspection = try await self.inspect(origin)
            return try Self.json(.ok, InspectResponse(origin: origin, inspection: inspection))

        default:
            let allowed = Self.allowedMethods(segments)
            guard !allowed.isEmpty else {
                throw BrokerError(
                    code: .notFound, status: .notFound, title: "No such control endpoint",
                    detail: "\(path) is not a control API endpoint. See docs/api/openapi.yaml; `authbrokerctl --help` lists what the CLI can do."
                )
            }
            var error = BrokerError(
                code: .methodNotAllowed, status: .methodNotAllowed, title: "Method not allowed",
                detail: "\(path) accepts \(allowed.joined(separator: ", ")), not \(method.rawValue)."
            )
            error.reasons = nil
            var response = Self.problem(error, requestID: nil)
            response.headers.add(name: "Allow", value: allowed.joined(separator: ", "))
            return response
        }
    }

    private static func allowedMethods(_ segments: [String]) -> [String] {
        switch segments {
        case ["v1", "status"]: ["GET"]
        case ["v1", "anchors"]: ["GET", "POST"]
        case let s where s.count == 3 && s[0] == "v1" && s[1] == "anchors": ["DELETE"]
        case ["v1", "pins"]: ["GET", "POST", "DELETE"]
        case ["v1", "exceptions"]: ["GET", "POST", "DELETE"]
        case ["v1", "passwords"]: ["GET", "POST", "DELETE"]
        case ["v1", "passwords", "reveal"], ["v1", "reauth"]: ["POST"]
        case ["v1", "challenges"], ["v1", "agent"], ["v1", "flows"], ["v1", "flows", "har"]: ["GET"]
        case ["v1", "identities"]: ["GET", "POST"]
        case let s where s.count == 3 && s[0] == "v1" && s[1] == "identities": ["DELETE"]
        case let s where s.count == 4 && s[0] == "v1" && s[1] == "identities" && s[3] == "export": ["POST"]
        case let s where s.count == 4 && s[0] == "v1" && s[1] == "agent" && s[3] == "answer": ["POST"]
        case let s where s.count == 3 && s[0] == "v1" && s[1] == "reauth": ["POST"]
        case ["v1", "inspect"]: ["POST"]
        case ["v1", "cache"], ["v1", "cache", "entries"]: ["GET", "DELETE"]
        case ["v1", "cache", "offline"]: ["PUT"]
        default: []
        }
    }

    // MARK: - Helpers

    private static func mapStoreError<T>(_ body: () throws(TrustStoreError) -> T) throws -> T {
        do {
            return try body()
        } catch {
            let status: HTTPResponseStatus =
                switch error.kind {
                case .notFound: .notFound
                case .ambiguous: .conflict
                case .ioError, .corruptFile: .internalServerError
                case .changedOnDisk: .conflict
                default: .badRequest
                }
            throw BrokerError(code: BrokerErrorCode(error.kind), status: status, title: "Trust store request failed", detail: error.description)
        }
    }

    static func kerberosStatus(_ kerberos: KerberosNegotiator) async -> StatusReport.KerberosStatus {
        let credential = await kerberos.credentialStatus()
        let (ticket, principal, expires, detail): (String, String?, Date?, String?) =
            switch credential {
            case .valid(let name, let remaining): ("valid", name, Date().addingTimeInterval(TimeInterval(remaining)), nil)
            case .expired(let name): ("expired", name, nil, nil)
            case .missing(let reason): ("missing", nil, nil, reason)
            }
        let counts = kerberos.counters
        return StatusReport.KerberosStatus(
            ticket: ticket, principal: principal, expires: expires, detail: detail,
            hosts: kerberos.policy.hosts.map(\.description), proxy: kerberos.policy.proxy, contextsStarted: counts.contextsStarted,
            contextsAccepted: counts.contextsAccepted, mutualVerified: counts.mutualVerified, failures: counts.failures,
            lastFailure: kerberos.latestFailure.map { "\($0.failure)" }
        )
    }

    func cacheOn() throws -> ResponseCache {
        guard let cache = self.cache else {
            throw BrokerError(
                code: .cacheOff, status: .conflict, title: "The HTTP cache is off",
                detail: "This daemon caches nothing: [cache] enabled is false (the default), or its directory could not be opened (`authbrokerctl status` says why). Set enabled = true under [cache] in config.toml and restart the daemon."
            )
        }
        return cache
    }

    func flowLogOn() throws -> FlowLog {
        guard let flows = self.flows, flows.isEnabled else {
            throw BrokerError(
                code: .flowLogOff, status: .conflict, title: "The flow log is off",
                detail: "This daemon keeps no flows ([flows] keep = 0 in config.toml). Set keep to a number of flows, like 500, and restart the daemon."
            )
        }
        return flows
    }

    /// `last=N`: how many of the most recent flows; nil (absent) means all that are kept.
    static func flowCount(_ parameters: [String: String]) throws -> Int? {
        guard let text = parameters["last"] else { return nil }
        guard let count = Int(text), count >= 0 else {
            throw BrokerError.badRequest(
                code: .invalidParameter, detail: "last=\(text.prefix(40)) is not a count of flows; give a whole number like last=50."
            )
        }
        return count
    }

    /// A boolean query parameter: `true`/`1` or `false`/`0`; absent is false.
    static func flag(_ text: String?, name: String) throws -> Bool {
        switch text {
        case nil, "false", "0": return false
        case "true", "1", "": return true
        case let other?:
            throw BrokerError.badRequest(code: .invalidParameter, detail: "\(name)=\(other.prefix(40)) is not true or false.")
        }
    }

    /// Refuses unless `peer` re-authenticated recently (PAM); the error says how to.
    private func requireGrant(_ peer: PeerIdentity?, for action: String) throws {
        guard let reauth = self.reauth, let peer, reauth.hasGrant(peer) else {
            throw BrokerError(
                code: .reauthenticationRequired, status: .forbidden, title: "Re-authentication required",
                detail:
                    "To \(action), first prove you are the user: POST /v1/reauth and answer its prompts (authbrokerctl does this for you, asking for your login password)."
            )
        }
    }

    private func reauthAndPeer(_ peer: PeerIdentity?) throws -> (ReauthService, PeerIdentity) {
        guard let reauth = self.reauth else {
            throw BrokerError(
                code: .reauthenticationUnavailable, status: .serviceUnavailable, title: "Re-authentication unavailable",
                detail: "This daemon cannot run PAM, so it reveals no secrets. See the daemon's log for why."
            )
        }
        guard let peer else {
            throw BrokerError(
                code: .peerUnknown, status: .forbidden, title: "Unknown peer",
                detail: "The daemon could not identify the process on this connection (SO_PEERCRED and /proc), so it grants nothing to it."
            )
        }
        return (reauth, peer)
    }

    private static func reauthResponse(_ step: ReauthService.Step) throws -> ControlResponse {
        switch step {
        case .prompt(let transaction, let prompt, let messages):
            return try Self.json(
                .ok,
                ReauthStepJSON(
                    state: "prompt", transaction: String(transaction),
                    prompt: .init(style: prompt.style.rawValue, text: prompt.text), messages: messages
                )
            )
        case .granted(let expiresIn, let messages):
            return try Self.json(.ok, ReauthStepJSON(state: "granted", expiresInSeconds: expiresIn, messages: messages))
        case .refused(let code, let message, let messages):
            let status: HTTPResponseStatus =
                switch code {
                case .authenticationFailed, .accountUnavailable, .userUnknown, .cancelled: .forbidden
                case .attemptInProgress: .conflict
                case .timedOut: .gatewayTimeout
                default: .internalServerError
                }
            let extra = messages.isEmpty ? "" : " PAM said: " + messages.joined(separator: " ")
            throw BrokerError(code: code, status: status, title: "Re-authentication refused", detail: message + extra)
        case .retryAfter(let delay):
            let seconds = max(1, Int(delay.components.seconds) + (delay.components.attoseconds > 0 ? 1 : 0))
            throw BrokerError(
                code: .tooManyAttempts, status: .tooManyRequests, title: "Too many failed attempts",
                detail: "Re-authentication failed several times; try again in \(seconds) s.",
                retryAfterSeconds: seconds
            )
        }
    }

    /// The origin of a password's URL (path and query are ignored: a password is per origin and realm).
    private static func origin(_ url: String) throws -> CanonicalOrigin {
        do {
            return try CanonicalOrigin(parsing: url)
        } catch {
            throw BrokerError.badRequest(code: .invalidURL, detail: "'\(url.prefix(200))' is not a usable URL: \(error.message)")
        }
    }

    private func identityService() throws -> ClientIdentities {
        guard let identities = self.identities else {
            throw BrokerError(
                code: .secretStoreUnavailable, status: .serviceUnavailable, title: "No secret store",
                detail: "Client identities keep their keys in the secret store, which this daemon could not open; `authbrokerctl status` says why."
            )
        }
        return identities
    }

    private func localCAAvailable() throws -> LocalCA {
        guard let localCA = self.localCA else {
            throw BrokerError.internalError("This daemon was started without a local CA.")
        }
        return localCA
    }

    package func agentsAvailable() throws -> AgentChallenges {
        guard let challenges = self.challenges else {
            throw BrokerError.internalError("This daemon was started without a challenge broker.")
        }
        return challenges
    }

    /// `"trust": "once"|"always"|"reject"` with `"scope": "exception"` (the default) or `"anchor"` for `always`.
    private static func trustReply(_ trust: String, scope: String?) throws -> AgentChallenges.AgentReply {
        switch (trust, scope) {
        case ("once", nil), ("once", "exception"): return .serverTrust(.once)
        case ("always", nil), ("always", "exception"): return .serverTrust(.alwaysException)
        case ("always", "anchor"): return .serverTrust(.alwaysAnchor)
        case ("reject", _): return .decline
        case ("once", _), ("always", _):
            throw BrokerError.badRequest(
                code: .invalidScope,
                detail: "scope must be \"exception\" (trust exactly this certificate from this server) or \"anchor\" (for always: trust the chain's topmost certificate as an anchor for this host), not '\(scope?.prefix(40) ?? "")'."
            )
        default:
            throw BrokerError.badRequest(
                code: .invalidTrust,
                detail: "trust must be \"once\" (until the daemon stops), \"always\" (saved) or \"reject\", not '\(trust.prefix(40))'."
            )
        }
    }

    private static func persistence(_ text: String?, allowNone: Bool = false) throws -> CredentialPersistence {
        guard let text else { return .session }
        guard let persistence = CredentialPersistence(rawValue: text), allowNone || persistence != .none else {
            throw BrokerError.badRequest(
                code: .invalidPersistence,
                detail: "persistence must be \"session\" (kept until the daemon stops) or \"permanent\" (kept in the secret store), not '\(text.prefix(40))'."
            )
        }
        return persistence
    }

    /// Host patterns that scope trust material (anchors, client identities): parsed, and none
    /// may cover a public suffix.
    private func trustScope(_ texts: [String]) throws -> [HostPattern] {
        let patterns = try Self.hostPatterns(texts)
        for pattern in patterns { try self.refuseIfCoversPublicSuffix(pattern) }
        return patterns
    }

    private func refuseIfCoversPublicSuffix(_ pattern: HostPattern) throws {
        guard let suffix = self.publicSuffixes.coveredSuffix(by: pattern) else { return }
        throw BrokerError.badRequest(
            code: .publicSuffixPattern,
            detail: "'\(pattern)' covers the public suffix \(suffix) (Public Suffix List): the names under it belong to unrelated owners, "
                + "so trust scoped to it would reach their servers too. Name your own domain instead, such as *.example.\(suffix.hasPrefix("*.") ? suffix.dropFirst(2) : Substring(suffix)) or a host name."
        )
    }

    private static func hostPatterns(_ texts: [String]) throws -> [HostPattern] {
        try texts.map { text in
            do {
                return try HostPattern(parsing: text)
            } catch {
                throw BrokerError.badRequest(code: .invalidHostPattern, detail: "\(error)")
            }
        }
    }

    private static func decode<T: Decodable>(_ type: T.Type, from body: ByteBuffer) throws -> T {
        do {
            return try BrokerJSON.decoder().decode(T.self, from: Data(body.readableBytesView))
        } catch {
            throw BrokerError.badRequest(
                code: .invalidJSON,
                detail: "The request body is not the JSON this endpoint takes (\(Self.describe(decodingError: error))). See docs/api/openapi.yaml."
            )
        }
    }

    private static func describe(decodingError error: any Error) -> String {
        switch error as? DecodingError {
        case .keyNotFound(let key, _)?: "missing \"\(key.stringValue)\""
        case .typeMismatch(_, let context)?, .valueNotFound(_, let context)?:
            "wrong type at \"\(context.codingPath.map(\.stringValue).joined(separator: "."))\""
        case .dataCorrupted?: "not valid JSON"
        default: "unreadable"
        }
    }

    static func queryParameters(_ query: String?) -> [String: String] {
        var result: [String: String] = [:]
        for pair in (query ?? "").split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1).map(String.init)
            guard let name = parts.first?.removingPercentEncoding else { continue }
            let raw = parts.count > 1 ? parts[1].replacingOccurrences(of: "+", with: " ") : ""
            result[name] = raw.removingPercentEncoding ?? raw
        }
        return result
    }

    static func json<T: Encodable>(_ status: HTTPResponseStatus, _ value: T) throws -> ControlResponse {
        Self.json(status, data: try BrokerJSON.encoder().encode(value))
    }

    /// JSON already encoded (the HAR export has its own encoder).
    static func json(_ status: HTTPResponseStatus, data: Data) -> ControlResponse {
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "application/json")
        headers.add(name: "Content-Length", value: String(data.count))
        headers.add(name: "Cache-Control", value: "no-store")
        return ControlResponse(status: status, headers: headers, body: ByteBuffer(bytes: data))
    }

    package static func problem(_ error: BrokerError, requestID: String?) -> ControlResponse {
        let (head, body) = error.response(requestID: requestID)
        var headers = head.headers
        headers.remove(name: BrokerHeaders.requestID)
        return ControlResponse(status: head.status, headers: headers, body: body)
    }
}

// MARK: - Wire models

struct ImportIdentityRequest: Decodable {
    var name: String
    var hosts: [String]?
    var replace: Bool?
    var pkcs12Base64: String?
    var passphrase: String?
    var certPEM: String?
    var keyPEM: String?

    enum CodingKeys: String, CodingKey {
        case name, hosts, replace, passphrase
        case pkcs12Base64 = "pkcs12_base64"
        case certPEM = "cert_pem"
        case keyPEM = "key_pem"
    }
}

/// A client identity's public part (`GET /v1/identities`): never the key.
struct IdentityJSON: Encodable {
    var name: String
    var hosts: [String]
    var subject: String
    var issuer: String
    var notBefore: Date
    var notAfter: Date
    var sha256: String
    var expired: Bool
    var expiresWithin30Days: Bool

    init(_ identity: ClientIdentity, now: Date) {
        self.name = identity.name
        self.hosts = identity.hosts.map(\.description)
        self.subject = identity.certificate.subject
        self.issuer = identity.certificate.issuer
        self.notBefore = identity.certificate.notBefore
        self.notAfter = identity.certificate.notAfter
        self.sha256 = identity.certificate.sha256
        self.expired = identity.isExpired(at: now)
        self.expiresWithin30Days = identity.expires(within: 30 * 86400, of: now)
    }

    enum CodingKeys: String, CodingKey {
        case name, hosts, subject, issuer, sha256, expired
        case notBefore = "not_before"
        case notAfter = "not_after"
        case expiresWithin30Days = "expires_within_30_days"
    }
}

struct ExportedIdentityJSON: Encodable {
    var format: String
    var dataBase64: String
    var passphrase: String?

    enum CodingKeys: String, CodingKey {
        case format, passphrase
        case dataBase64 = "data_base64"
    }
}

struct AgentAnswerRequest: Decodable {
    var challenge: String
    var user: String?
    var password: String?
    var persistence: String?
    var decline: Bool?
    /// Server-trust challenges: `once`, `always` or `reject`.
    var trust: String?
    /// With `always`: `exception` (the default) or `anchor`.
    var scope: String?
}

/// A pending challenge, for `GET /v1/challenges` and the agent stream.
///
/// `kind` is `http_auth` (a Basic/Digest 401: `realm` and `auth_scheme` are set) or
/// `server_trust` (a certificate chain that did not verify: `failures`, `reasons` and `chain`).
package struct ChallengeJSON: Encodable {
    var id: String
    var kind: String
    var scheme: String
    var host: String
    var port: Int
    var realm: String?
    var authScheme: String?
    var failures: [String]?
    var reasons: [String]?
    var chain: [CertificateInfo]?
    var requester: Requester?
    var ageSeconds: Double?
    var waiting: Int?
    var awaitingAgent: Bool?

    package init(_ id: UInt64, space: ChallengeSpace, requester: Requester?, age: Duration? = nil, waiting: Int? = nil, awaitingAgent: Bool? = nil) {
        self.id = String(id)
        switch space {
        case .http(let space):
            self.kind = "http_auth"
            self.scheme = space.origin.scheme.rawValue
            self.host = space.origin.host
            self.port = space.origin.port
            self.realm = space.realm
            self.authScheme = space.authScheme
        case .serverTrust(let server):
            self.kind = "server_trust"
            self.scheme = "https"
            self.host = server.host
            self.port = server.port
            self.failures = server.failureCodes
            self.reasons = server.reasons
            self.chain = server.chain
        }
        self.requester = requester
        self.ageSeconds = age.map { Double($0.components.seconds) + Double($0.components.attoseconds) / 1e18 }
        self.waiting = waiting
        self.awaitingAgent = awaitingAgent
    }

    enum CodingKeys: String, CodingKey {
        case id, kind, scheme, host, port, realm, failures, reasons, chain, requester, waiting
        case authScheme = "auth_scheme"
        case ageSeconds = "age_seconds"
        case awaitingAgent = "awaiting_agent"
    }
}

struct RevealPasswordRequest: Decodable {
    var url: String
    var user: String
    var realm: String?
}

struct ReauthAnswerRequest: Decodable {
    var answer: String?
    var cancel: Bool?
}

struct ReauthStepJSON: Encodable {
    struct Prompt: Encodable {
        var style: String
        var text: String
    }
    var state: String
    var transaction: String?
    var prompt: Prompt?
    var expiresInSeconds: Int?
    var messages: [String]

    enum CodingKeys: String, CodingKey {
        case state, transaction, prompt, messages
        case expiresInSeconds = "expires_in_seconds"
    }
}

struct AddPasswordRequest: Decodable {
    var url: String
    var user: String
    var realm: String?
    var password: String
    var persistence: String?
}

struct PasswordJSON: Encodable {
    var url: String
    var realm: String?
    var user: String
    var persistence: String
    var failed: Bool

    init(_ info: StoredPasswordInfo) {
        self.url = info.origin.description
        self.realm = info.realm
        self.user = info.user
        self.persistence = info.persistence.rawValue
        self.failed = info.failed
    }
}

struct AddAnchorRequest: Decodable {
    var pem: String
    var hosts: [String]?
    /// Add `hosts` to an existing anchor's instead of replacing them (`TrustStore.addAnchors`).
    var widen: Bool?
}

struct PinRequest: Decodable {
    var host: String
    var spkiSHA256: String
    enum CodingKeys: String, CodingKey {
        case host
        case spkiSHA256 = "spki_sha256"
    }
}

struct ExceptionRequest: Decodable {
    /// `host`, `host:port`, `*.example.com`, `[::1]:8443`.
    var host: String
    var sha256: String
    /// How long the exception lasts (`30d`, `12h`; `LifetimeText`); absent: until removed.
    var expires: String?
}

/// An exact-certificate exception; `persistent` false: a "trust once" answer, gone at restart.
struct ExceptionJSON: Encodable {
    var host: String
    var port: Int?
    var sha256: String
    var addedAt: Date
    var expiresAt: Date?
    var persistent: Bool

    init(_ exception: CertificateException, persistent: Bool) {
        self.host = exception.host.description
        self.port = exception.port
        self.sha256 = exception.sha256
        self.addedAt = exception.addedAt
        self.expiresAt = exception.expiresAt
        self.persistent = persistent
    }

    enum CodingKeys: String, CodingKey {
        case host, port, sha256, persistent
        case addedAt = "added_at"
        case expiresAt = "expires_at"
    }
}

struct InspectRequest: Decodable {
    var url: String
}

struct AnchorJSON: Encodable {
    var id: String
    var hosts: [String]
    var addedAt: Date
    var pem: String
    var certificate: CertificateInfo

    init(_ anchor: TrustAnchor) {
        self.id = anchor.id
        self.hosts = anchor.hosts.map(\.description)
        self.addedAt = anchor.addedAt
        self.pem = anchor.pem
        self.certificate = anchor.certificate
    }

    enum CodingKeys: String, CodingKey {
        case id, hosts, pem, certificate
        case addedAt = "added_at"
    }
}

/// `GET /v1/cache`: the cache's settings and counters.
struct CacheStatusJSON: Encodable {
    var enabled: Bool
    var directory: String?
    var counters: ResponseCache.Counters?

    init(_ cache: ResponseCache?) {
        self.enabled = cache != nil
        self.directory = cache?.directory
        self.counters = cache?.counters
    }

    func encode(to encoder: any Encoder) throws {
        // The counters sit beside `enabled` and `directory`, not under a key of their own.
        try self.counters?.encode(to: encoder)
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(self.enabled, forKey: .enabled)
        try container.encodeIfPresent(self.directory, forKey: .directory)
    }

    enum CodingKeys: String, CodingKey { case enabled, directory }
}

/// One entry of `GET /v1/cache/entries`.
struct CacheEntryJSON: Encodable {
    var url: String
    var status: Int
    var bodyBytes: Int64
    var storedAt: Date
    var ageSeconds: Int
    var fresh: Bool
    var vary: [String]

    init(_ entry: ResponseCache.Entry, now: Date) {
        self.url = entry.head.url
        self.status = entry.head.status
        self.bodyBytes = entry.head.bodyLength
        self.storedAt = entry.head.timing.responseTime
        self.ageSeconds = entry.freshness.age(now: now)
        self.fresh = self.ageSeconds < entry.freshness.lifetime
        self.vary = entry.head.varyFields
    }

    enum CodingKeys: String, CodingKey {
        case url, status, fresh, vary
        case bodyBytes = "body_bytes"
        case storedAt = "stored_at"
        case ageSeconds = "age_seconds"
    }
}

/// `PUT /v1/cache/offline`.
struct OfflineRequest: Decodable {
    var offline: Bool
}

/// `GET /v1/flows`.
struct FlowListJSON: Encodable {
    var flows: [FlowSummary]
    /// This request started the recording (`[flows] record = "on_demand"`): earlier requests
    /// were not kept.
    var recordingStarted: Bool

    enum CodingKeys: String, CodingKey {
        case flows
        case recordingStarted = "recording_started"
    }
}

/// `POST /v1/reload`: what the rules now hold.
struct ReloadJSON: Encodable {
    var routes: Int
    var responses: Int
    var rewrites: Int
    var restartNeeded: Bool

    enum CodingKeys: String, CodingKey {
        case routes, responses, rewrites
        case restartNeeded = "restart_needed"
    }
}

/// `GET /v1/ca`: the local CA's certificate and the files programs are pointed at.
struct LocalCAJSON: Encodable {
    var certificate: CertificateInfo
    var pem: String
    var certificateFile: String
    var bundleFile: String
    var leavesMinted: Int
    /// The time all of them took, in microseconds.
    var mintingMicroseconds: Int

    init(_ authority: LocalCertificateAuthority, of localCA: LocalCA) async {
        self.certificate = authority.info
        self.pem = authority.pem
        self.certificateFile = localCA.files.certificate
        self.bundleFile = localCA.files.bundle
        self.leavesMinted = await localCA.leavesMinted
        self.mintingMicroseconds = Int(await localCA.mintingTime.microseconds)
    }

    enum CodingKeys: String, CodingKey {
        case certificate, pem
        case certificateFile = "certificate_file"
        case bundleFile = "bundle_file"
        case leavesMinted = "leaves_minted"
        case mintingMicroseconds = "minting_microseconds"
    }
}

struct PinJSON: Encodable {
    var host: String
    var spkiSHA256: String
    var addedAt: Date

    init(_ pin: SPKIPin) {
        self.host = pin.host.description
        self.spkiSHA256 = pin.spkiSHA256
        self.addedAt = pin.addedAt
    }

    enum CodingKeys: String, CodingKey {
        case host
        case spkiSHA256 = "spki_sha256"
        case addedAt = "added_at"
    }
}

struct InspectResponse: Encodable {
    struct Failure: Encodable {
        var code: String
        var summary: String
    }
    var url: String
    var host: String
    var port: Int
    var trusted: Bool
    var failures: [Failure]
    var chain: [CertificateInfo]
    var chainPEM: [String]

    init(origin: CanonicalOrigin, inspection: Inspection) {
        self.url = origin.description
        self.host = origin.host
        self.port = origin.port
        self.trusted = inspection.decision.isTrusted
        self.failures = inspection.decision.failures.map { Failure(code: $0.code, summary: $0.summary) }
        self.chain = inspection.decision.chain
        self.chainPEM = inspection.chainPEM
    }

    enum CodingKeys: String, CodingKey {
        case url, host, port, trusted, failures, chain
        case chainPEM = "chain_pem"
    }
}
