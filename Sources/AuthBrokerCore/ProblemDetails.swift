import Foundation

/// An `application/problem+json` body (RFC 9457) for every error the broker produces itself,
/// on the data plane and the control API alike.
///
/// The standard members say what happened; the extension members carry what a user or a
/// script needs to act on it (the chain and its fingerprints for a trust failure, the exact
/// `authbrokerctl` commands that would fix it).
package struct ProblemDetails: Codable, Sendable, Equatable {
    /// A stable URI naming the kind of problem: `urn:authbroker:problem:<code>`.
    package var type: String
    package var title: String
    package var status: Int
    package var detail: String
    /// The request id (`Authbroker-Request-Id`) of the request that failed.
    package var instance: String?
    /// The broker's error code, the part of `type` after the last colon.
    package var code: String
    /// The RFC 9209 error type, when the problem is about an upstream fetch.
    package var proxyStatus: ProxyErrorType?
    /// The upstream host (and port) involved, when there is one.
    package var host: String?
    /// Each reason the broker gave, most important first (for trust failures: one per failed check).
    package var reasons: [String]?
    /// The certificate chain the server presented, leaf first.
    package var chain: [CertificateInfo]?
    /// Commands that would fix the problem, ready to paste.
    package var fix: [String]?

    package init(
        code: String, title: String, status: Int, detail: String,
        instance: String? = nil, proxyStatus: ProxyErrorType? = nil, host: String? = nil,
        reasons: [String]? = nil, chain: [CertificateInfo]? = nil, fix: [String]? = nil
    ) {
        self.type = "urn:authbroker:problem:\(code)"
        self.code = code
        self.title = title
        self.status = status
        self.detail = detail
        self.instance = instance
        self.proxyStatus = proxyStatus
        self.host = host
        self.reasons = reasons
        self.chain = chain
        self.fix = fix
    }

    enum CodingKeys: String, CodingKey {
        case type, title, status, detail, instance, code, host, reasons, chain, fix
        case proxyStatus = "proxy_status"
    }

    package static let mediaType = "application/problem+json"
}

/// What the broker shows about one certificate: enough to recognise it and to pin or trust it.
package struct CertificateInfo: Codable, Sendable, Hashable {
    /// RFC 4514 form of the subject distinguished name.
    package var subject: String
    package var issuer: String
    package var notBefore: Date
    package var notAfter: Date
    /// SHA-256 of the DER certificate, upper-case hex pairs joined by colons (as `openssl x509 -fingerprint -sha256`).
    package var sha256: String
    /// Base64 SHA-256 of the DER SubjectPublicKeyInfo: the value a pin takes (as curl's `--pinnedpubkey sha256//`).
    package var spkiSHA256: String
    package var dnsNames: [String]
    package var ipAddresses: [String]
    package var isSelfSigned: Bool
    package var isCA: Bool

    package init(
        subject: String, issuer: String, notBefore: Date, notAfter: Date, sha256: String,
        spkiSHA256: String, dnsNames: [String], ipAddresses: [String], isSelfSigned: Bool, isCA: Bool
    ) {
        self.subject = subject
        self.issuer = issuer
        self.notBefore = notBefore
        self.notAfter = notAfter
        self.sha256 = sha256
        self.spkiSHA256 = spkiSHA256
        self.dnsNames = dnsNames
        self.ipAddresses = ipAddresses
        self.isSelfSigned = isSelfSigned
        self.isCA = isCA
    }

    enum CodingKeys: String, CodingKey {
        case subject, issuer, sha256
        case notBefore = "not_before"
        case notAfter = "not_after"
        case spkiSHA256 = "spki_sha256"
        case dnsNames = "dns_names"
        case ipAddresses = "ip_addresses"
        case isSelfSigned = "self_signed"
        case isCA = "ca"
    }
}

/// The one JSON dialect of the control API: ISO 8601 dates, sorted keys (stable output for
/// scripts and tests).
package enum BrokerJSON {
    package static func encoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.dateEncodingStrategy = .iso8601
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return encoder
    }

    package static func decoder() -> JSONDecoder {
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return decoder
    }
}
