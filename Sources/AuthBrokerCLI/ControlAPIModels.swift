import AuthBrokerCore
import Foundation

// The CLI's view of the control API's JSON (docs/api/openapi.yaml). Decoding is lenient
// where the daemon may grow: optional members are optional here too, and unknown members
// are ignored, so an older authbrokerctl keeps working against a newer daemon.

/// `GET /v1/status`.
package struct StatusReport: Codable, Sendable, Equatable {
    package struct SystemAnchors: Codable, Sendable, Equatable {
        package var path: String?
        package var count: Int
    }

    package var version: String
    package var pid: Int
    package var startedAt: Date?
    package var uptimeSeconds: Double
    package var socket: String
    /// The proxy port's addresses; nil from a daemon without one.
    package var proxyPort: [String]?
    package var configFile: String?
    package var configLoaded: Bool?
    package var stateDirectory: String?
    package var systemAnchors: SystemAnchors?
    /// How many anchors and pins the user added.
    package var userAnchors: Int?
    package var pins: Int?
    /// Named counters; a dictionary so counters the daemon adds later still show.
    package var counters: [String: Int64]
    package struct SecretStoreStatus: Codable, Sendable, Equatable {
        package var backend: String
        package var reason: String
    }
    package var secretStore: SecretStoreStatus?
    package var identities: Int?
    package var warnings: [String]?
    /// The HTTP cache's counters; nil when it is off (or the daemon predates it).
    package var cache: CacheCounters?
    /// The user's Kerberos ticket as the daemon sees it; nil when `[kerberos]` is off.
    package var kerberos: KerberosStatus?

    package struct KerberosStatus: Codable, Sendable, Equatable {
        /// "valid", "expired" or "missing".
        package var ticket: String
        package var principal: String?
        package var expires: Date?
        package var detail: String?
        package var hosts: [String]?
        package var proxy: Bool?
        package var contextsStarted: Int?
        package var contextsAccepted: Int?
        package var failures: Int?
        package var lastFailure: String?

        enum CodingKeys: String, CodingKey {
            case ticket, principal, expires, detail, hosts, proxy, failures
            case contextsStarted = "contexts_started"
            case contextsAccepted = "contexts_accepted"
            case lastFailure = "last_failure"
        }
    }

    enum CodingKeys: String, CodingKey {
        case version, pid, socket, counters, pins, identities, warnings, cache, kerberos
        case secretStore = "secret_store"
        case userAnchors = "user_anchors"
        case startedAt = "started_at"
        case uptimeSeconds = "uptime_seconds"
        case proxyPort = "proxy_port"
        case configFile = "config_file"
        case configLoaded = "config_loaded"
        case stateDirectory = "state_directory"
        case systemAnchors = "system_anchors"
    }
}

/// One trust anchor the user added.
package struct AnchorRecord: Codable, Sendable, Equatable {
    /// SHA-256 of the DER certificate, 64 lower-case hex digits.
    package var id: String
    /// Host patterns the anchor may vouch for; empty means any host.
    package var hosts: [String]
    package var addedAt: Date?
    package var pem: String?
    package var certificate: CertificateInfo

    enum CodingKeys: String, CodingKey {
        case id, hosts, pem, certificate
        case addedAt = "added_at"
    }
}

/// `GET /v1/anchors`, `POST /v1/anchors` (201).
package struct AnchorList: Codable, Sendable, Equatable {
    package var anchors: [AnchorRecord]
}

/// `DELETE /v1/anchors/{id}`.
package struct RemovedAnchor: Codable, Sendable, Equatable {
    package var removed: AnchorRecord
}

/// `POST /v1/anchors` request body.
package struct AddAnchorRequest: Codable, Sendable, Equatable {
    package var pem: String
    package var hosts: [String]
    /// Add `hosts` to an anchor that exists instead of replacing its hosts; nil is false.
    package var widen: Bool? = nil
}

/// One SPKI pin: the host pattern and the base64 SHA-256 of the public key it requires.
package struct PinRecord: Codable, Sendable, Equatable {
    package var host: String
    package var spkiSHA256: String
    package var addedAt: Date?

    enum CodingKeys: String, CodingKey {
        case host
        case spkiSHA256 = "spki_sha256"
        case addedAt = "added_at"
    }
}

/// `GET /v1/pins`.
package struct PinList: Codable, Sendable, Equatable {
    package var pins: [PinRecord]
}

/// `POST /v1/pins` (201).
package struct AddedPin: Codable, Sendable, Equatable {
    package var pin: PinRecord
}

/// `DELETE /v1/pins`.
package struct RemovedPin: Codable, Sendable, Equatable {
    package var removed: PinRecord
}

/// `POST /v1/pins` request body.
package struct AddPinRequest: Codable, Sendable, Equatable {
    package var host: String
    package var spkiSHA256: String

    enum CodingKeys: String, CodingKey {
        case host
        case spkiSHA256 = "spki_sha256"
    }
}

/// An exact-certificate exception: this leaf from this host (and port) is trusted.
package struct ExceptionRecord: Codable, Sendable, Equatable {
    package var host: String
    /// nil: any port.
    package var port: Int?
    package var sha256: String
    package var addedAt: Date?
    /// nil: until removed.
    package var expiresAt: Date?
    /// false: a "trust once" answer, kept until the daemon stops.
    package var persistent: Bool

    /// `host`, `host:port` or `[v6]:port`: what `exceptions remove` takes.
    package var target: String {
        guard let port else { return self.host }
        return self.host.contains(":") ? "[\(self.host)]:\(port)" : "\(self.host):\(port)"
    }

    enum CodingKeys: String, CodingKey {
        case host, port, sha256, persistent
        case addedAt = "added_at"
        case expiresAt = "expires_at"
    }
}

/// `GET /v1/exceptions`.
package struct ExceptionList: Codable, Sendable, Equatable {
    package var exceptions: [ExceptionRecord]
}

/// `POST /v1/exceptions` (201).
package struct AddedException: Codable, Sendable, Equatable {
    package var exception: ExceptionRecord
}

/// `DELETE /v1/exceptions`.
package struct RemovedException: Codable, Sendable, Equatable {
    package var removed: ExceptionRecord
}

/// `POST /v1/exceptions` request body.
package struct AddExceptionRequest: Codable, Sendable, Equatable {
    package var host: String
    package var sha256: String
    /// `30d`, `12h` (`LifetimeText`); nil: until removed.
    package var expires: String?
}

/// `POST /v1/inspect` request body.
package struct InspectRequest: Codable, Sendable, Equatable {
    package var url: String
}

/// `POST /v1/inspect`: what a server presents and whether the broker would trust it.
package struct InspectReport: Codable, Sendable, Equatable {
    package struct Failure: Codable, Sendable, Equatable {
        package var code: String
        package var summary: String
    }

    package var url: String
    package var host: String
    package var port: Int
    package var trusted: Bool
    package var failures: [Failure]
    /// Leaf first.
    package var chain: [CertificateInfo]
    /// PEM of each certificate in `chain`, same order; nil from a daemon that predates it.
    package var chainPEM: [String]?

    enum CodingKeys: String, CodingKey {
        case url, host, port, trusted, failures, chain
        case chainPEM = "chain_pem"
    }
}

/// One stored password's public part.
package struct PasswordRecord: Codable, Sendable, Equatable {
    package var url: String
    package var realm: String?
    package var user: String
    package var persistence: String
    package var failed: Bool
}

/// `GET /v1/passwords`.
package struct PasswordList: Codable, Sendable, Equatable {
    package var passwords: [PasswordRecord]
}

/// `POST /v1/passwords` (the password travels only over the user's own socket).
package struct AddPasswordRequest: Codable, Sendable {
    package var url: String
    package var user: String
    package var realm: String?
    package var password: String
    package var persistence: String
}

package struct AddedPassword: Codable, Sendable, Equatable {
    package var password: PasswordRecord
}

package struct RemovedPassword: Codable, Sendable, Equatable {
    package var removed: PasswordRecord
}

package struct RevealPasswordRequest: Codable, Sendable {
    package var url: String
    package var user: String
    package var realm: String?
}

package struct RevealedPassword: Codable, Sendable {
    package var password: String
}

/// One step of `POST /v1/reauth`: a prompt to answer, or the grant.
package struct ReauthStep: Codable, Sendable {
    package struct Prompt: Codable, Sendable {
        package var style: String
        package var text: String
    }
    package var state: String
    package var transaction: String?
    package var prompt: Prompt?
    package var expiresInSeconds: Int?
    package var messages: [String]

    enum CodingKeys: String, CodingKey {
        case state, transaction, prompt, messages
        case expiresInSeconds = "expires_in_seconds"
    }
}

package struct ReauthAnswer: Codable, Sendable {
    package var answer: String
}

/// Ends a re-authentication dialogue (`POST /v1/reauth/{transaction}`).
package struct ReauthCancel: Codable, Sendable {
    package var cancel: Bool
}

/// A pending challenge (`GET /v1/challenges`, and the agent stream).
package struct ChallengeRecord: Codable, Sendable, Equatable {
    package struct Requester: Codable, Sendable, Equatable {
        package var pid: Int32
        package var uid: UInt32
        package var executable: String?
    }
    package var id: String
    /// `http_auth` or `server_trust` (absent from older daemons: `http_auth`).
    package var kind: String?
    package var scheme: String
    package var host: String
    package var port: Int
    /// HTTP authentication challenges.
    package var realm: String?
    package var authScheme: String?
    /// Server-trust challenges: failure codes, one sentence each, and the chain (leaf first).
    package var failures: [String]?
    package var reasons: [String]?
    package var chain: [CertificateInfo]?
    package var requester: Requester?
    package var ageSeconds: Double?
    package var waiting: Int?
    package var awaitingAgent: Bool?

    package var isServerTrust: Bool { self.kind == "server_trust" }

    enum CodingKeys: String, CodingKey {
        case id, kind, scheme, host, port, realm, failures, reasons, chain, requester, waiting
        case authScheme = "auth_scheme"
        case ageSeconds = "age_seconds"
        case awaitingAgent = "awaiting_agent"
    }
}

package struct ChallengeList: Codable, Sendable, Equatable {
    package var challenges: [ChallengeRecord]
}

/// One line of `GET /v1/agent`.
package struct AgentEvent: Codable, Sendable {
    /// `notice`: something to act on that no answer settles (no Kerberos ticket).
    package struct Notice: Codable, Sendable {
        package var code: String
        package var host: String?
        package var message: String
    }

    package var event: String
    package var agent: String?
    package var id: String?
    package var challenge: ChallengeRecord?
    package var notice: Notice?
}

/// `POST /v1/agent/{id}/answer`.
package struct AgentAnswer: Codable, Sendable {
    package var challenge: String
    package var user: String?
    package var password: String?
    package var persistence: String?
    package var decline: Bool?
    /// Server-trust challenges: `once`, `always` or `reject`; with `always`, `scope` `exception` or `anchor`.
    package var trust: String?
    package var scope: String?

    package init(
        challenge: String, user: String? = nil, password: String? = nil, persistence: String? = nil, decline: Bool? = nil,
        trust: String? = nil, scope: String? = nil
    ) {
        self.challenge = challenge
        self.user = user
        self.password = password
        self.persistence = persistence
        self.decline = decline
        self.trust = trust
        self.scope = scope
    }
}

package struct AgentAnswerAccepted: Codable, Sendable {
    package var accepted: Bool
}

/// A client identity's public part.
package struct IdentityRecord: Codable, Sendable, Equatable {
    package var name: String
    package var hosts: [String]
    package var subject: String
    package var issuer: String
    package var notBefore: Date
    package var notAfter: Date
    package var sha256: String
    package var expired: Bool
    package var expiresWithin30Days: Bool

    enum CodingKeys: String, CodingKey {
        case name, hosts, subject, issuer, sha256, expired
        case notBefore = "not_before"
        case notAfter = "not_after"
        case expiresWithin30Days = "expires_within_30_days"
    }
}

package struct IdentityList: Codable, Sendable { package var identities: [IdentityRecord] }
package struct ImportedIdentity: Codable, Sendable { package var identity: IdentityRecord }
package struct RemovedIdentity: Codable, Sendable { package var removed: IdentityRecord }

package struct ImportIdentityRequest: Codable, Sendable {
    package var name: String
    package var hosts: [String]
    package var replace: Bool
    package var pkcs12Base64: String?
    package var certPEM: String?
    package var keyPEM: String?
    package var passphrase: String?

    package init(
        name: String, hosts: [String], replace: Bool, pkcs12Base64: String? = nil, certPEM: String? = nil,
        keyPEM: String? = nil, passphrase: String? = nil
    ) {
        self.name = name
        self.hosts = hosts
        self.replace = replace
        self.pkcs12Base64 = pkcs12Base64
        self.certPEM = certPEM
        self.keyPEM = keyPEM
        self.passphrase = passphrase
    }

    enum CodingKeys: String, CodingKey {
        case name, hosts, replace, passphrase
        case pkcs12Base64 = "pkcs12_base64"
        case certPEM = "cert_pem"
        case keyPEM = "key_pem"
    }
}

package struct ExportedIdentity: Codable, Sendable {
    package var format: String
    package var dataBase64: String
    package var passphrase: String?

    enum CodingKeys: String, CodingKey {
        case format, passphrase
        case dataBase64 = "data_base64"
    }
}

/// `GET /v1/ca`, `POST /v1/ca/rotate`.
package struct LocalCARecord: Codable, Sendable, Equatable {
    package var certificate: CertificateInfo
    package var pem: String
    package var certificateFile: String
    package var bundleFile: String
    package var leavesMinted: Int
    package var mintingMicroseconds: Int?

    enum CodingKeys: String, CodingKey {
        case certificate, pem
        case certificateFile = "certificate_file"
        case bundleFile = "bundle_file"
        case leavesMinted = "leaves_minted"
        case mintingMicroseconds = "minting_microseconds"
    }
}

/// `POST /v1/reload`.
/// `GET /v1/cache`: whether the cache is on, where, and its counters.
package struct CacheStatusRecord: Decodable, Sendable, Equatable {
    package var enabled: Bool
    package var directory: String?
    package var counters: CacheCounters?

    enum CodingKeys: String, CodingKey { case enabled, directory }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.enabled = try container.decode(Bool.self, forKey: .enabled)
        self.directory = try container.decodeIfPresent(String.self, forKey: .directory)
        // The counters sit beside `enabled`, when the cache is on.
        self.counters = self.enabled ? try CacheCounters(from: decoder) : nil
    }
}

/// One entry of `GET /v1/cache/entries`.
package struct CacheEntryRecord: Codable, Sendable, Equatable {
    package var url: String
    package var status: Int
    package var bodyBytes: Int64
    package var storedAt: Date?
    package var ageSeconds: Int
    package var fresh: Bool
    package var vary: [String]?

    enum CodingKeys: String, CodingKey {
        case url, status, fresh, vary
        case bodyBytes = "body_bytes"
        case storedAt = "stored_at"
        case ageSeconds = "age_seconds"
    }
}

package struct ReloadRecord: Codable, Sendable, Equatable {
    package var routes: Int
    package var responses: Int
    package var rewrites: Int
    package var restartNeeded: Bool

    enum CodingKeys: String, CodingKey {
        case routes, responses, rewrites
        case restartNeeded = "restart_needed"
    }
}
