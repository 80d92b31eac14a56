import AuthBrokerCore
import Foundation
import NIOHTTP1

#if canImport(Glibc)
import Glibc
#endif

/// A failure the daemon itself reported: it could not (or would not) fetch, or a control
/// request was refused. Built from the `Proxy-Status` field (RFC 9209) and the
/// `application/problem+json` body (RFC 9457) the daemon sends.
///
/// For an untrusted server it carries what the user needs to decide: the chain with its
/// fingerprints, and the `authbrokerctl` commands that would trust it.
public struct BrokerError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The HTTP status the daemon answered with (502, 504, 400, ... for control requests 4xx).
    public var status: Int
    /// The RFC 9209 error type from `Proxy-Status` (`tls_certificate_error`, `dns_error`, ...),
    /// nil for errors that are not about an upstream fetch (bad requests, control API errors).
    public var proxyStatus: String?
    /// The daemon's stable error code (`untrusted_server`, `connection_refused`, ...; every one is
    /// listed in docs/api/openapi.yaml, schema `BrokerErrorCode`). When the daemon's problem body
    /// could not be read, the `Proxy-Status` error type instead, or `broker_error`.
    public var code: String
    public var title: String
    /// What happened and what to do about it, in a sentence or two.
    public var detail: String
    /// The upstream host (and port) involved, when there is one.
    public var host: String?
    /// Each reason the daemon gave, most important first.
    public var reasons: [String]
    /// The certificate chain the server presented, leaf first (trust failures).
    public var chain: [BrokerCertificate]
    /// Commands that would fix the problem, ready to paste.
    public var fix: [String]
    /// `Authbroker-Request-Id`: the id in the daemon's log lines about this request.
    public var requestID: String?

    /// The SHA-256 fingerprints of `chain`, leaf first.
    public var fingerprints: [String] { chain.map(\.sha256) }

    public var description: String {
        var text = "authbrokerd: \(title) [\(code)]: \(detail)"
        for command in fix { text += "\n  fix: \(command)" }
        return text
    }

    init(problem: ProblemDetails, proxyStatus: String?, requestID: String?) {
        self.status = problem.status
        self.proxyStatus = proxyStatus ?? problem.proxyStatus?.rawValue
        self.code = problem.code
        self.title = problem.title
        self.detail = problem.detail
        self.host = problem.host
        self.reasons = problem.reasons ?? []
        self.chain = (problem.chain ?? []).map(BrokerCertificate.init)
        self.fix = problem.fix ?? []
        self.requestID = requestID ?? problem.instance
    }

    /// A broker error whose body could not be read: what the head says is all there is.
    init(status: Int, proxyStatus: String?, details: String?, requestID: String?) {
        self.status = status
        self.proxyStatus = proxyStatus
        self.code = proxyStatus ?? "broker_error"
        self.title = "The broker could not complete the request"
        self.detail = details ?? "authbrokerd answered \(status) without a readable problem description."
        self.host = nil
        self.reasons = []
        self.chain = []
        self.fix = []
        self.requestID = requestID
    }
}

/// One certificate of a chain the daemon shows in a `BrokerError`.
public struct BrokerCertificate: Sendable, Hashable {
    /// RFC 4514 subject, e.g. `CN=host.internal.test`.
    public var subject: String
    public var issuer: String
    public var notBefore: Date
    public var notAfter: Date
    /// SHA-256 of the DER certificate, colon-separated upper-case hex.
    public var sha256: String
    /// Base64 SHA-256 of the SubjectPublicKeyInfo (what a pin takes).
    public var spkiSHA256: String
    public var dnsNames: [String]
    public var ipAddresses: [String]
    public var isSelfSigned: Bool
    public var isCA: Bool

    init(_ info: CertificateInfo) {
        self.subject = info.subject
        self.issuer = info.issuer
        self.notBefore = info.notBefore
        self.notAfter = info.notAfter
        self.sha256 = info.sha256
        self.spkiSHA256 = info.spkiSHA256
        self.dnsNames = info.dnsNames
        self.ipAddresses = info.ipAddresses
        self.isSelfSigned = info.isSelfSigned
        self.isCA = info.isCA
    }
}

/// Why a request could not be made or finished, apart from errors the daemon reports
/// (those are `BrokerError`).
public enum BrokerClientError: Error, Sendable, Hashable, CustomStringConvertible {
    /// Nothing listens on the socket: start the daemon (`systemctl --user start authbrokerd.socket`).
    case daemonNotRunning(socketPath: String)
    /// The socket exists but this user may not connect to it.
    case permissionDenied(socketPath: String)
    /// The socket path cannot be used (too long, not a socket, ...).
    case unusableSocket(socketPath: String, reason: String)
    /// The process listening on the socket runs as another user (`listenerUID`, nil when the
    /// kernel could not say), so it is not the user's daemon: nothing was sent to it.
    case foreignListener(socketPath: String, listenerUID: UInt32?)
    /// The daemon closed the connection before the response was complete.
    case connectionClosed
    /// The daemon's bytes were not a valid HTTP/1.1 response.
    case protocolError(reason: String)
    /// The request cannot be sent (not an absolute http(s) URL, a bad header, ...).
    case invalidRequest(reason: String)
    /// A body was larger than the caller allowed (`data(for:maxBytes:)`, control responses).
    case responseTooLarge(limit: Int)
    /// The challenge handler answered `.cancel`.
    case challengeCancelled
    /// A control API answer that was not what its documentation promises.
    case unexpectedResponse(status: Int, reason: String)

    public var description: String {
        switch self {
        case .daemonNotRunning(let path):
            "authbrokerd is not running: nothing listens on \(path). Start it with `systemctl --user start authbrokerd.socket` (or `authbrokerd`)."
        case .permissionDenied(let path): "permission denied connecting to \(path): the socket belongs to another user"
        case .unusableSocket(let path, let reason): "cannot use the socket \(path): \(reason)"
        case .foreignListener(let path, let uid):
            ForeignListener(socketPath: path, listenerUID: uid, ownUID: UInt32(geteuid())).message
        case .connectionClosed: "authbrokerd closed the connection before the response was complete"
        case .protocolError(let reason): "authbrokerd's response was not valid HTTP/1.1: \(reason)"
        case .invalidRequest(let reason): "invalid request: \(reason)"
        case .responseTooLarge(let limit): "the response body is larger than the \(limit) bytes allowed"
        case .challengeCancelled: "the request was cancelled by the challenge handler"
        case .unexpectedResponse(let status, let reason): "unexpected control API response \(status): \(reason)"
        }
    }
}

