import AuthBrokerCore
import Foundation
import NIOHTTP1

/// `GET /v1/status`: what the daemon reports about itself.
public struct BrokerStatus: Sendable, Hashable {
    public var version: String
    public var pid: Int
    public var uptimeSeconds: Double
    public var socket: String
    public var configFile: String?
    public var stateDirectory: String?
    /// Anchors and pins the user added.
    public var userAnchors: Int?
    public var pins: Int?
    /// Named counters (requests, errors, ...); new counters appear without a library update.
    public var counters: [String: Int64]
}

/// A trust anchor the user added: a CA (or exact certificate) the daemon trusts for `hosts`.
public struct BrokerAnchor: Sendable, Hashable {
    /// SHA-256 of the DER certificate, 64 lower-case hex digits (any unique 8+ digit prefix
    /// removes it).
    public var id: String
    /// Host patterns the anchor may vouch for; empty: any host.
    public var hosts: [String]
    public var addedAt: Date?
    public var certificate: BrokerCertificate
}

/// A password the daemon holds (never the password itself).
public struct StoredPassword: Sendable, Hashable {
    /// The origin it is for (`https://host[:port]`).
    public var url: String
    public var realm: String?
    public var user: String
    /// `session` or `permanent`.
    public var persistence: String
    /// The origin refused it the last time it was tried.
    public var failed: Bool
}

/// A client identity (certificate and key) the daemon can present; metadata only, the key
/// never leaves the daemon.
public struct BrokerIdentity: Sendable, Hashable, Decodable {
    /// The name `Authbroker-Identity` selects it by.
    public var name: String
    public var subject: String
    public var issuer: String
    public var notAfter: Date
    /// SHA-256 of the certificate, colon-separated hex.
    public var sha256: String
    /// Host patterns it is presented to.
    public var hosts: [String]

    enum CodingKeys: String, CodingKey {
        case name, subject, issuer, sha256, hosts
        case notAfter = "not_after"
    }
}

// The daemon's JSON (docs/api/openapi.yaml), decoded leniently: optional members optional.
private struct StatusJSON: Decodable {
    var version: String
    var pid: Int
    var uptimeSeconds: Double
    var socket: String
    var configFile: String?
    var stateDirectory: String?
    var userAnchors: Int?
    var pins: Int?
    var counters: [String: Int64]?

    enum CodingKeys: String, CodingKey {
        case version, pid, socket, counters, pins
        case uptimeSeconds = "uptime_seconds"
        case configFile = "config_file"
        case stateDirectory = "state_directory"
        case userAnchors = "user_anchors"
    }
}

private struct AnchorJSON: Decodable {
    var id: String
    var hosts: [String]
    var addedAt: Date?
    var certificate: CertificateInfo

    enum CodingKeys: String, CodingKey {
        case id, hosts, certificate
        case addedAt = "added_at"
    }

    var anchor: BrokerAnchor {
        BrokerAnchor(id: id, hosts: hosts, addedAt: addedAt, certificate: BrokerCertificate(certificate))
    }
}

private struct PasswordJSON: Decodable {
    var url: String
    var realm: String?
    var user: String
    var persistence: String
    var failed: Bool?

    var stored: StoredPassword {
        StoredPassword(url: url, realm: realm, user: user, persistence: persistence, failed: failed ?? false)
    }
}

private struct AnchorList: Decodable { var anchors: [AnchorJSON] }
private struct RemovedAnchor: Decodable { var removed: AnchorJSON }
private struct PasswordList: Decodable { var passwords: [PasswordJSON] }
private struct AddedPassword: Decodable { var password: PasswordJSON }
private struct RemovedPassword: Decodable { var removed: PasswordJSON }
private struct IdentityList: Decodable { var identities: [BrokerIdentity] }

extension BrokerClient {
    /// Largest control-API response accepted.
    static let maxControlResponseBytes = 16 * 1024 * 1024

    /// The daemon's version, uptime and counters.
    public func status() async throws -> BrokerStatus {
        let json: StatusJSON = try await control(.GET, "/v1/status")
        return BrokerStatus(
            version: json.version, pid: json.pid, uptimeSeconds: json.uptimeSeconds, socket: json.socket,
            configFile: json.configFile, stateDirectory: json.stateDirectory, userAnchors: json.userAnchors,
            pins: json.pins, counters: json.counters ?? [:]
        )
    }

    /// The anchors the user added.
    public func anchors() async throws -> [BrokerAnchor] {
        let list: AnchorList = try await control(.GET, "/v1/anchors")
        return list.anchors.map(\.anchor)
    }

    /// Adds every certificate in `pem` as an anchor for `hosts` (patterns like `*.corp.example`;
    /// empty: any host). Returns the anchors added.
    @discardableResult
    public func addAnchor(pem: String, hosts: [String]) async throws -> [BrokerAnchor] {
        let list: AnchorList = try await control(.POST, "/v1/anchors", json: ["pem": .string(pem), "hosts": .strings(hosts)])
        return list.anchors.map(\.anchor)
    }

    /// Removes the anchor whose id starts with `id` (8 or more hex digits).
    @discardableResult
    public func removeAnchor(id: String) async throws -> BrokerAnchor {
        let removed: RemovedAnchor = try await control(.DELETE, "/v1/anchors/" + Self.percentEncoded(id))
        return removed.removed.anchor
    }

    /// The passwords the daemon holds (user names and where they apply, never the passwords).
    public func passwords() async throws -> [StoredPassword] {
        let list: PasswordList = try await control(.GET, "/v1/passwords")
        return list.passwords.map(\.stored)
    }

    /// Stores a password the daemon answers Basic/Digest challenges with for `url`'s origin
    /// (and `realm`, when given). `.permanent` needs the daemon's secret store.
    @discardableResult
    public func addPassword(
        url: String, user: String, realm: String? = nil, password: String, persistence: CredentialPersistence = .forSession
    ) async throws -> StoredPassword {
        var body: [String: JSONValue] = [
            "url": .string(url), "user": .string(user), "password": .string(password),
            "persistence": .string(persistence.controlValue),
        ]
        if let realm { body["realm"] = .string(realm) }
        let added: AddedPassword = try await control(.POST, "/v1/passwords", json: body)
        return added.password.stored
    }

    /// Removes a stored password.
    @discardableResult
    public func removePassword(url: String, user: String, realm: String? = nil) async throws -> StoredPassword {
        var query = "url=\(Self.percentEncoded(url))&user=\(Self.percentEncoded(user))"
        if let realm { query += "&realm=\(Self.percentEncoded(realm))" }
        let removed: RemovedPassword = try await control(.DELETE, "/v1/passwords?" + query)
        return removed.removed.stored
    }

    /// The client identities the daemon holds (metadata only), from `GET /v1/identities`
    /// answering `{"identities": [{"name", "subject", "issuer", "not_after", "sha256", "hosts"}]}`.
    ///
    /// - Note: daemons without identity support answer 404; that arrives as a `BrokerError`
    ///   (code `not_found`).
    public func identities() async throws -> [BrokerIdentity] {
        let list: IdentityList = try await control(.GET, "/v1/identities")
        return list.identities
    }

    // MARK: Plumbing

    /// A JSON value small enough for control request bodies.
    enum JSONValue: Encodable {
        case string(String)
        case strings([String])

        func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .string(let value): try container.encode(value)
            case .strings(let values): try container.encode(values)
            }
        }
    }

    /// One control request: JSON in and out; a non-2xx answer becomes `BrokerError`.
    func control<Response: Decodable>(_ method: HTTPMethod, _ path: String, json: [String: JSONValue]? = nil) async throws -> Response {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "authbrokerd")
        headers.add(name: "Accept", value: "application/json")
        headers.add(name: "Connection", value: "close")
        var body = BrokerRequestBody.Storage.empty
        if let json {
            let data = try BrokerJSON.encoder().encode(json)
            headers.add(name: "Content-Type", value: "application/json")
            headers.add(name: "Content-Length", value: String(data.count))
            body = .bytes(Array(data))
        } else if method == .POST || method == .PUT {
            headers.add(name: "Content-Length", value: "0")
        }
        let response = try await exchange(HTTPRequestHead(version: .http1_1, method: method, uri: path, headers: headers), body: body)
        let data = try await response.body.collect(maxBytes: Self.maxControlResponseBytes)
        guard (200..<300).contains(response.status) else {
            if let problem = try? BrokerJSON.decoder().decode(ProblemDetails.self, from: data) {
                throw BrokerError(problem: problem, proxyStatus: nil, requestID: response.head.requestID)
            }
            throw BrokerClientError.unexpectedResponse(status: response.status, reason: String(decoding: data.prefix(200), as: UTF8.self))
        }
        do {
            return try BrokerJSON.decoder().decode(Response.self, from: data)
        } catch {
            throw BrokerClientError.unexpectedResponse(status: response.status, reason: "\(path): \(error)")
        }
    }

    /// RFC 3986 unreserved characters kept, everything else percent-encoded.
    static func percentEncoded(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(CharacterSet(charactersIn: Unicode.Scalar(0)...Unicode.Scalar(127)))
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}
