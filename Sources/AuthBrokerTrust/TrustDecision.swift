import AuthBrokerCore
import Foundation

/// One reason a server's certificate chain was not trusted.
///
/// The evaluator classifies the Verifier's failure with its own cheap checks, so that the user
/// is told the actionable reason (an unknown CA, an expired certificate, a wrong name) rather
/// than a policy trace; `.other` keeps the Verifier's words when nothing else explains them.
package enum TrustFailure: Sendable, Hashable {
    /// No path to any anchor in scope; `issuer` is the name the chain stops at.
    case unknownIssuer(issuer: String)
    /// The leaf is self-signed and is not an anchor for this host.
    case selfSigned
    /// A certificate of the chain is past its notAfter.
    case expired(notAfter: Date)
    /// A certificate of the chain is before its notBefore.
    case notYetValid(notBefore: Date)
    /// The leaf does not name `host`; `names` are its DNS and IP subject alternative names.
    case hostnameMismatch(host: String, names: [String])
    /// A user anchor would verify this chain, but it is limited to other hosts.
    case anchorOutOfScope(anchorID: String, hosts: [HostPattern])
    /// The host is pinned and no certificate of the validated chain has a pinned key.
    case pinMismatch(host: String, pinned: [String], presented: [String])
    /// A certificate could not be parsed, or the chain was empty or too long.
    case malformedCertificate(String)
    /// A Verifier reason the evaluator could not classify, verbatim.
    case other(String)
    /// A certificate below the trust anchor is signed with SHA-1, MD5 or older: anyone who can
    /// forge such a signature (practical for MD5, demonstrated for SHA-1) can impersonate.
    /// `certificate` names it for a sentence: "The certificate 'CN=…'" or its place in the chain.
    case weakSignature(certificate: String, algorithm: String)
    /// A certificate of the chain is not one a TLS server may use: made for other uses (extended
    /// key usage), a CA as the leaf, names that disagree (`ServerUsagePolicy`, `ServerNamePolicy`).
    case unfitForServer(certificate: String, reason: String)

    /// Whether trusting a CA (an anchor) could cure this failure: only when the issuer is the
    /// problem.
    package var isAboutTheIssuer: Bool {
        switch self {
        case .unknownIssuer, .selfSigned, .anchorOutOfScope: true
        default: false
        }
    }

    /// A stable snake_case code for scripts and for the problem+json body.
    package var code: String {
        switch self {
        case .unknownIssuer: "unknown_issuer"
        case .selfSigned: "self_signed"
        case .expired: "expired"
        case .notYetValid: "not_yet_valid"
        case .hostnameMismatch: "hostname_mismatch"
        case .anchorOutOfScope: "anchor_out_of_scope"
        case .pinMismatch: "pin_mismatch"
        case .malformedCertificate: "malformed_certificate"
        case .other: "other"
        case .weakSignature: "weak_signature"
        case .unfitForServer: "unfit_for_server"
        }
    }

    /// One sentence for a human. `TrustDecision.reasons` adds which certificate, where the
    /// failure is about one certificate of the chain.
    package var summary: String {
        switch self {
        case .unknownIssuer(let issuer):
            return
                "Unknown issuer: the server's chain was issued by '\(issuer)', which is neither a system root nor one of your trust anchors for this host."
        case .selfSigned:
            return "The server's certificate is self-signed and is not one of your trust anchors for this host."
        case .expired(let notAfter):
            return "A certificate in the server's chain expired on \(Self.format(notAfter))."
        case .notYetValid(let notBefore):
            return
                "A certificate in the server's chain is not valid before \(Self.format(notBefore)); check this computer's clock."
        case .hostnameMismatch(let host, let names):
            let list = names.isEmpty ? "no host name at all" : names.joined(separator: ", ")
            return "The server's certificate is for \(list), not for \(host)."
        case .anchorOutOfScope(let anchorID, let hosts):
            let list = hosts.map(\.description).joined(separator: ", ")
            return
                "Your trust anchor \(anchorID.prefix(16)) would verify this chain, but it is limited to \(list); add this host to the anchor's hosts to trust it here."
        case .pinMismatch(let host, let pinned, let presented):
            return
                "\(host) is pinned to the public key\(pinned.count == 1 ? "" : "s") \(pinned.joined(separator: ", ")), but the server's chain has \(presented.joined(separator: ", "))."
        case .malformedCertificate(let detail):
            return detail
        case .other(let detail):
            return "The server's chain failed validation: \(detail)"
        case .unfitForServer(let certificate, let reason):
            return "\(certificate) cannot identify a TLS server: \(reason)."
        case .weakSignature(let certificate, let algorithm):
            return
                "\(certificate) is signed with \(algorithm), which can be forged; the broker refuses such chains. Ask the server's operator for a certificate signed with SHA-256 or better."
        }
    }

    static func format(_ date: Date) -> String {
        date.formatted(.iso8601)
    }
}

/// The outcome of evaluating one server chain for one host.
package struct TrustDecision: Sendable, Equatable {
    package var isTrusted: Bool
    /// Empty if and only if trusted; most important first.
    package var failures: [TrustFailure]
    /// The chain as presented, leaf first.
    package var chain: [CertificateInfo]
    /// Whether this decision was served from the evaluator's cache.
    package var fromCache: Bool
    /// Trusted only because of an exact-certificate exception (the chain itself did not verify).
    package var byException = false

    package init(isTrusted: Bool, failures: [TrustFailure], chain: [CertificateInfo], fromCache: Bool) {
        self.isTrusted = isTrusted
        self.failures = failures
        self.chain = chain
        self.fromCache = fromCache
    }

    /// One sentence per failure, naming the certificate of `chain` an expiry is about when it
    /// was presented.
    package var reasons: [String] {
        self.failures.map { failure in
            switch failure {
            case .expired(let notAfter):
                if let info = self.chain.first(where: { $0.notAfter == notAfter }) {
                    return
                        "The certificate '\(info.subject)' (SHA-256 \(info.sha256)) expired on \(TrustFailure.format(notAfter))."
                }
            case .notYetValid(let notBefore):
                if let info = self.chain.first(where: { $0.notBefore == notBefore }) {
                    return
                        "The certificate '\(info.subject)' (SHA-256 \(info.sha256)) is not valid before \(TrustFailure.format(notBefore)); check this computer's clock."
                }
            default:
                break
            }
            return failure.summary
        }
    }
}
