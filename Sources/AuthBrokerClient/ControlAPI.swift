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

    // MARK: Any control request

    /// Sends one request to the daemon's control API (`/v1/...`, docs/api/openapi.yaml) and
    /// returns its answer as it arrives: the head at once, the body streaming. For endpoints
    /// without a wrapper here (pins, exceptions, inspect, challenges, reauth, ...), for the
    /// `GET /v1/agent` event stream (one JSON object per line, for as long as the connection
    /// stays open), and for programs that pass the daemon's JSON on unchanged.
    ///
    /// - Parameters:
    ///   - method: `GET`, `POST`, `DELETE`, ...
    ///   - path: the path and query, already percent-encoded (`/v1/pins?host=a.test&spki_sha256=...`).
    ///   - json: the request body, sent as `application/json`; nil sends none.
    /// - Returns: a 2xx answer.
    /// - Throws: `BrokerError` when the daemon refused the request (its problem document: `code`
    ///   `not_found`, `reauthentication_required`, ...; `kind` classifies it);
    ///   `BrokerClientError.unexpectedResponse` for any other answer that is not 2xx;
    ///   `.invalidRequest` for a method or path that cannot be sent; as `send` when the daemon
    ///   cannot be reached.
    public func sendControl(method: String, path: String, json: Data? = nil) async throws -> BrokerResponse {
        try Self.checkMethod(method)
        // Only what RFC 3986 allows in a path and query goes in the request line: anything else
        // (a space, a control character, a quote, a brace, non-ASCII) must be percent-encoded.
        guard path.hasPrefix("/"), path.utf8.allSatisfy(HTTPSyntax.isPathOrQueryByte) else {
            throw BrokerClientError.invalidRequest(reason: "'\(path.prefix(200))' is not a percent-encoded control API path")
        }
        if let userAgent { try Self.checkField(name: "User-Agent", value: userAgent) }
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: "authbrokerd")
        if let userAgent { headers.add(name: "User-Agent", value: userAgent) }
        headers.add(name: "Accept", value: "application/json")
        headers.add(name: "Connection", value: "close")
        var body = BrokerRequestBody.Storage.empty
        if let json {
            headers.add(name: "Content-Type", value: "application/json")
            headers.add(name: "Content-Length", value: String(json.count))
            body = .bytes(Array(json))
        } else if ["POST", "PUT", "PATCH"].contains(method.uppercased()) {
            headers.add(name: "Content-Length", value: "0")
        }
        let head = HTTPRequestHead(version: .http1_1, method: HTTPMethod(rawValue: method), uri: path, headers: headers)
        let response = try await exchange(head, body: body)
        guard (200..<300).contains(response.status) else {
            // Not the daemon's own refusal (that is thrown as BrokerError): what answered is no
            // daemon of this version, and its body is not worth reading.
            response.body.cancel()
            throw BrokerClientError.unexpectedResponse(
                status: response.status, reason: "\(response.head.reasonPhrase) for \(method) \(path.prefix(200))"
            )
        }
        return response
    }

    /// `sendControl` with the body collected: the daemon's JSON exactly as it sent it, and the
    /// head.
    /// - Throws: `BrokerClientError.responseTooLarge` when the body exceeds `maxBytes`; as `sendControl`.
    public func controlData(
        method: String, path: String, json: Data? = nil, maxBytes: Int = 16 * 1024 * 1024
    ) async throws -> (Data, BrokerResponseHead) {
        let response = try await sendControl(method: method, path: path, json: json)
        return (try await response.body.collect(maxBytes: maxBytes), response.head)
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

    /// One control request with a typed answer: `controlData`, then the JSON decoded.
    func control<Response: Decodable>(_ method: HTTPMethod, _ path: String, json: [String: JSONValue]? = nil) async throws -> Response {
        let body = try json.map { try BrokerJSON.encoder().encode($0) }
        let (data, head) = try await controlData(method: method.rawValue, path: path, json: body)
        do {
            return try BrokerJSON.decoder().decode(Response.self, from: data)
        } catch {
            throw BrokerClientError.unexpectedResponse(status: head.status, reason: "\(path): \(error)")
        }
    }

    /// RFC 3986 unreserved characters kept, everything else percent-encoded.
    static func percentEncoded(_ text: String) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(CharacterSet(charactersIn: Unicode.Scalar(0)...Unicode.Scalar(127)))
        allowed.insert(charactersIn: "-._~")
        return text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text
    }
}
