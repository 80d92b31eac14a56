import AuthBrokerCore
import AuthBrokerHTTPAuth
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
    package var configFile: String
    package var configLoaded: Bool
    package var stateDirectory: String
    package var systemAnchors: SystemAnchors
    package var userAnchors: Int
    package var pins: Int
    package var counters: [String: Int]

    package init(
        version: String, pid: Int, startedAt: Date, uptimeSeconds: Double, socket: String, configFile: String,
        configLoaded: Bool, stateDirectory: String, systemAnchors: SystemAnchors, userAnchors: Int, pins: Int,
        counters: [String: Int]
    ) {
        self.version = version
        self.pid = pid
        self.startedAt = startedAt
        self.uptimeSeconds = uptimeSeconds
        self.socket = socket
        self.configFile = configFile
        self.configLoaded = configLoaded
        self.stateDirectory = stateDirectory
        self.systemAnchors = systemAnchors
        self.userAnchors = userAnchors
        self.pins = pins
        self.counters = counters
    }

    enum CodingKeys: String, CodingKey {
        case version, pid, socket, counters, pins
        case startedAt = "started_at"
        case uptimeSeconds = "uptime_seconds"
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
    package let status: @Sendable () -> StatusReport
    package let inspect: @Sendable (CanonicalOrigin) async throws -> Inspection

    package init(
        store: TrustStore, vault: PasswordVault, status: @escaping @Sendable () -> StatusReport,
        inspect: @escaping @Sendable (CanonicalOrigin) async throws -> Inspection
    ) {
        self.store = store
        self.vault = vault
        self.status = status
        self.inspect = inspect
    }

    /// Largest request body the control API accepts (a PEM bundle fits easily).
    package static let maxBodyBytes = 1 << 20

    package func handle(
        method: HTTPMethod, path: String, query: String?, body: ByteBuffer, requestID: String
    ) async -> ControlResponse {
        do {
            return try await self.route(method: method, path: path, query: query, body: body)
        } catch let error as BrokerError {
            return Self.problem(error, requestID: requestID)
        } catch {
            return Self.problem(.internalError("Unexpected control API error: \(error)"), requestID: requestID)
        }
    }

    private func route(method: HTTPMethod, path: String, query: String?, body: ByteBuffer) async throws -> ControlResponse {
        let segments = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        switch (method, segments) {
        case (.GET, ["v1", "status"]):
            return try Self.json(.ok, self.status())

        case (.GET, ["v1", "anchors"]):
            return try Self.json(.ok, ["anchors": self.store.anchors().map(AnchorJSON.init)])
        case (.POST, ["v1", "anchors"]):
            let request = try Self.decode(AddAnchorRequest.self, from: body)
            let hosts = try Self.hostPatterns(request.hosts ?? [])
            let added = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.addAnchors(pem: request.pem, hosts: hosts) }
            return try Self.json(.created, ["anchors": added.map(AnchorJSON.init)])
        case (.DELETE, let s) where s.count == 3 && s[0] == "v1" && s[1] == "anchors":
            let removed = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.removeAnchor(idPrefix: s[2]) }
            return try Self.json(.ok, ["removed": AnchorJSON(removed)])

        case (.GET, ["v1", "passwords"]):
            return try Self.json(.ok, ["passwords": self.vault.list().map(PasswordJSON.init)])
        case (.POST, ["v1", "passwords"]):
            let request = try Self.decode(AddPasswordRequest.self, from: body)
            let origin = try Self.origin(request.url)
            let persistence = try Self.persistence(request.persistence)
            try self.vault.add(
                origin: origin, realm: request.realm, credential: PasswordCredential(user: request.user, password: request.password),
                persistence: persistence
            )
            let added = StoredPasswordInfo(origin: origin, realm: request.realm, user: request.user, persistence: persistence, failed: false)
            return try Self.json(.created, ["password": PasswordJSON(added)])
        case (.DELETE, ["v1", "passwords"]):
            let parameters = Self.queryParameters(query)
            guard let url = parameters["url"], let user = parameters["user"] else {
                throw BrokerError.badRequest(
                    code: "missing_parameter",
                    detail: "DELETE /v1/passwords needs the query parameters url and user (and realm, if the password has one), percent-encoded."
                )
            }
            let removed = try self.vault.remove(origin: try Self.origin(url), realm: parameters["realm"], user: user)
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
                    code: "missing_parameter",
                    detail: "DELETE /v1/pins needs the query parameters host and spki_sha256 (percent-encoded)."
                )
            }
            let host = try Self.hostPatterns([hostText])[0]
            let removed = try Self.mapStoreError { () throws(TrustStoreError) in try self.store.removePin(host: host, spkiSHA256: spki) }
            return try Self.json(.ok, ["removed": PinJSON(removed)])

        case (.POST, ["v1", "inspect"]):
            let request = try Self.decode(InspectRequest.self, from: body)
            let origin: CanonicalOrigin
            do {
                origin = try CanonicalOrigin(parsing: request.url)
            } catch {
                throw BrokerError.badRequest(code: "invalid_url", detail: "\(request.url) is not a usable URL: \(error.message)")
            }
            guard origin.scheme == .https else {
                throw BrokerError.badRequest(
                    code: "invalid_url", detail: "Only https:// URLs present certificates; got \(request.url)."
                )
            }
            let inspection = try await self.inspect(origin)
            return try Self.json(.ok, InspectResponse(origin: origin, inspection: inspection))

        default:
            let allowed = Self.allowedMethods(segments)
            guard !allowed.isEmpty else {
                throw BrokerError(
                    code: "not_found", status: .notFound, title: "No such control endpoint",
                    detail: "\(path) is not a control API endpoint. See docs/api/openapi.yaml; `authbrokerctl --help` lists what the CLI can do."
                )
            }
            var error = BrokerError(
                code: "method_not_allowed", status: .methodNotAllowed, title: "Method not allowed",
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
        case ["v1", "passwords"]: ["GET", "POST", "DELETE"]
        case ["v1", "inspect"]: ["POST"]
        default: []
        }
    }

    // MARK: - Helpers

    private static func mapStoreError<T>(_ body: () throws(TrustStoreError) -> T) throws -> T {
        do {
            return try body()
        } catch {
            let status: HTTPResponseStatus =
                switch error.code {
                case "not_found": .notFound
                case "ambiguous": .conflict
                case "io_error", "corrupt_file": .internalServerError
                default: .badRequest
                }
            throw BrokerError(code: error.code, status: status, title: "Trust store request failed", detail: error.description)
        }
    }

    /// The origin of a password's URL (path and query are ignored: a password is per origin and realm).
    private static func origin(_ url: String) throws -> CanonicalOrigin {
        do {
            return try CanonicalOrigin(parsing: url)
        } catch {
            throw BrokerError.badRequest(code: "invalid_url", detail: "'\(url.prefix(200))' is not a usable URL: \(error.message)")
        }
    }

    private static func persistence(_ text: String?) throws -> CredentialPersistence {
        guard let text else { return .session }
        guard let persistence = CredentialPersistence(rawValue: text), persistence != .none else {
            throw BrokerError.badRequest(
                code: "invalid_persistence",
                detail: "persistence must be \"session\" (kept until the daemon stops) or \"permanent\" (kept in the secret store), not '\(text.prefix(40))'."
            )
        }
        return persistence
    }

    private static func hostPatterns(_ texts: [String]) throws -> [HostPattern] {
        try texts.map { text in
            do {
                return try HostPattern(parsing: text)
            } catch {
                throw BrokerError.badRequest(code: "invalid_host_pattern", detail: "\(error)")
            }
        }
    }

    private static func decode<T: Decodable>(_ type: T.Type, from body: ByteBuffer) throws -> T {
        do {
            return try BrokerJSON.decoder().decode(T.self, from: Data(body.readableBytesView))
        } catch {
            throw BrokerError.badRequest(
                code: "invalid_json",
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
        let data = try BrokerJSON.encoder().encode(value)
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
}

struct PinRequest: Decodable {
    var host: String
    var spkiSHA256: String
    enum CodingKeys: String, CodingKey {
        case host
        case spkiSHA256 = "spki_sha256"
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
