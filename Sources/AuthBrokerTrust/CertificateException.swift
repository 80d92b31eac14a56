import AuthBrokerCore
import Foundation

/// "Trust exactly this certificate from this server": the server presenting the leaf whose
/// SHA-256 is `sha256` for a host `host` names (and, when `port` is set, on that port) is
/// trusted although its chain does not verify (an unknown issuer, self-signed, expired, another
/// name). Pins still apply. Another leaf on the same host, or this leaf on another host, is not
/// covered.
package struct CertificateException: Codable, Sendable, Hashable {
    package var host: HostPattern
    /// nil: any port.
    package var port: Int?
    /// SHA-256 of the leaf's DER: upper-case hex pairs joined by colons, as `CertificateInfo.sha256`.
    package var sha256: String
    package var addedAt: Date
    /// When the exception stops applying (nil: never). The user's way to say "trust this
    /// certificate while the server's owner gets a proper one".
    package var expiresAt: Date?

    package init(host: HostPattern, port: Int?, sha256: String, addedAt: Date, expiresAt: Date? = nil) {
        self.host = host
        self.port = port
        self.sha256 = sha256
        self.addedAt = addedAt
        self.expiresAt = expiresAt
    }

    /// Whether the exception has stopped applying at `now`.
    package func isExpired(at now: Date) -> Bool {
        guard let expiresAt else { return false }
        return now >= expiresAt
    }

    /// Whether this exception covers the leaf `leafSHA256` presented by `host` on `port`
    /// (nil: the port is unknown, and only port-less exceptions apply).
    package func covers(host: String, port: Int?, leafSHA256: String) -> Bool {
        self.sha256 == leafSHA256 && self.names(host: host, port: port)
    }

    /// Whether it is for `host` on `port` (nil: unknown, so only port-less exceptions are),
    /// whatever the certificate.
    package func names(host: String, port: Int?) -> Bool {
        guard self.host.matches(host) else { return false }
        guard let own = self.port else { return true }
        return own == port
    }

    /// Same host pattern, port and certificate (the dates aside).
    package func sameTarget(as other: CertificateException) -> Bool {
        self.host == other.host && self.port == other.port && self.sha256 == other.sha256
    }

    /// `host`, `host:port`, `*.example.com`, `192.0.2.7:8443`, `::1`, `[::1]:8443`.
    package var hostDescription: String {
        guard let port else { return self.host.description }
        return self.host.isIPAddress && self.host.description.contains(":")
            ? "[\(self.host)]:\(port)" : "\(self.host):\(port)"
    }

    /// Parses a user-written host for an exception: a host pattern, optionally with `:port`
    /// (an IPv6 address with a port in brackets: `[::1]:8443`).
    package static func parseHost(_ text: String) throws(TrustStoreError) -> (host: HostPattern, port: Int?) {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        var hostText = trimmed
        var portText: Substring?
        if trimmed.hasPrefix("["), let close = trimmed.firstIndex(of: "]") {
            hostText = String(trimmed[...close])
            let rest = trimmed[trimmed.index(after: close)...]
            if rest.hasPrefix(":") { portText = rest.dropFirst() } else if !rest.isEmpty { portText = rest }
        } else if !trimmed.contains("/"), trimmed.filter({ $0 == ":" }).count == 1, let colon = trimmed.firstIndex(of: ":") {
            hostText = String(trimmed[..<colon])
            portText = trimmed[trimmed.index(after: colon)...]
        }
        var port: Int?
        if let portText {
            guard portText.count <= 5, portText.allSatisfy({ $0.isASCII && $0.isNumber }), let value = Int(portText),
                (1...65535).contains(value)
            else {
                throw TrustStoreError(
                    .invalidHost,
                    "'\(text.prefix(100))' has an invalid port. Write host or host:port with a port from 1 to 65535, such as nas.example.com:5001."
                )
            }
            port = value
        }
        do {
            return (try HostPattern(parsing: hostText), port)
        } catch {
            throw TrustStoreError(.invalidHost, error.message)
        }
    }

    /// The canonical form of a user-written SHA-256 fingerprint: 64 hex digits, with or without
    /// colons, any case (`openssl x509 -fingerprint -sha256` prints `SHA256 Fingerprint=…`).
    package static func canonicalFingerprint(_ text: String) throws(TrustStoreError) -> String {
        var value = text.trimmingCharacters(in: .whitespacesAndNewlines)
        if let equals = value.lastIndex(of: "="), value.lowercased().hasPrefix("sha256") {
            value = String(value[value.index(after: equals)...])
        }
        let hex = value.filter { $0 != ":" }
        guard hex.count == 64, hex.allSatisfy({ $0.isASCII && $0.isHexDigit }) else {
            throw TrustStoreError(
                .invalidFingerprint,
                "'\(text.prefix(120))' is not a SHA-256 certificate fingerprint (64 hex digits, colons allowed). Copy the SHA-256 the broker shows for the server's certificate."
            )
        }
        let upper = Array(hex.uppercased())
        return stride(from: 0, to: 64, by: 2).map { String(upper[$0..<$0 + 2]) }.joined(separator: ":")
    }

    enum CodingKeys: String, CodingKey {
        case host, port, sha256
        case addedAt = "added_at"
        case expiresAt = "expires_at"
    }

    package init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        self.host = try container.decode(HostPattern.self, forKey: .host)
        self.port = try container.decodeIfPresent(Int.self, forKey: .port)
        if let port = self.port, !(1...65535).contains(port) {
            throw DecodingError.dataCorruptedError(forKey: .port, in: container, debugDescription: "port \(port) is not 1 to 65535")
        }
        let fingerprint = try container.decode(String.self, forKey: .sha256)
        do {
            self.sha256 = try Self.canonicalFingerprint(fingerprint)
        } catch {
            throw DecodingError.dataCorruptedError(forKey: .sha256, in: container, debugDescription: error.message)
        }
        self.addedAt = try container.decode(Date.self, forKey: .addedAt)
        self.expiresAt = try container.decodeIfPresent(Date.self, forKey: .expiresAt)
    }

    package func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(self.host, forKey: .host)
        try container.encodeIfPresent(self.port, forKey: .port)
        try container.encode(self.sha256, forKey: .sha256)
        try container.encode(self.addedAt, forKey: .addedAt)
        try container.encodeIfPresent(self.expiresAt, forKey: .expiresAt)
    }
}
