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

    /// What kind of failure this is, for programs that branch on it: ask the user to trust a
    /// server, retry later, report a bug. Decided by `code`, then the RFC 9209 error type in
    /// `proxyStatus`, then the HTTP `status`.
    public var kind: Kind {
        if code == BrokerErrorCode.untrustedServer.rawValue { return .untrustedServer }
        // RFC 9209 files these under tls_certificate_error too, but the certificate in question
        // is ours: the server refused the handshake, which no anchor changes.
        if code == BrokerErrorCode.clientCertificateRequired.rawValue || code == BrokerErrorCode.clientCertificateRejected.rawValue {
            return .upstreamProtocol
        }
        if let proxyStatus {
            guard let type = ProxyErrorType(rawValue: proxyStatus) else { return .brokerFailure }
            switch type {
            case .tlsCertificateError:
                return .untrustedServer
            case .dnsError, .dnsTimeout, .destinationNotFound, .destinationUnavailable, .connectionRefused,
                .connectionTerminated, .connectionTimeout, .connectionLimitReached, .httpResponseTimeout:
                return .unreachable
            case .tlsProtocolError, .httpResponseIncomplete, .httpResponseHeaderSectionSize, .httpProtocolError:
                return .upstreamProtocol
            case .httpRequestError, .httpRequestDenied:
                return .rejectedRequest
            case .proxyInternalError, .proxyConfigurationError:
                return .brokerFailure
            }
        }
        switch status {
        case 404: return .notFound
        case 400..<500, 501: return .rejectedRequest
        default: return .brokerFailure
        }
    }

    /// The classes of `BrokerError`, coarse enough to branch on (`authbrokerctl`'s exit statuses
    /// are these); `code` says exactly what happened.
    public enum Kind: Sendable, Hashable, CaseIterable {
        /// The server's certificate is not trusted, or not the one a pin requires: `chain` shows
        /// what it presented and `fix` how to trust it.
        case untrustedServer
        /// The server could not be reached: DNS failure or timeout, connection refused, reset or
        /// timed out, no response in time, the daemon's connection limit. Retrying later may work.
        case unreachable
        /// The server was reached but broke the protocol: a failed TLS handshake, a malformed,
        /// oversized or cut-off HTTP response.
        case upstreamProtocol
        /// The daemon refused the request as invalid or not allowed (a bad URL, certificate or
        /// host pattern, an unknown identity, re-authentication refused or required, ...).
        case rejectedRequest
        /// A control request named an anchor, pin, exception, password or identity that does not exist.
        case notFound
        /// The daemon itself failed (an internal or configuration error, a locked secret store),
        /// or reported an error type this library does not know.
        case brokerFailure
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

    /// A broker error whose problem body could not be read (the answer to a `HEAD` request has
    /// none): what the head says is all there is. `code` is the `Authbroker-Error` mark's value.
    init(status: Int, code: String?, proxyStatus: String?, details: String?, requestID: String?) {
        self.status = status
        self.proxyStatus = proxyStatus
        self.code = code ?? proxyStatus ?? "broker_error"
        self.title = proxyStatus.flatMap(ProxyErrorType.init(rawValue:))?.summary ?? "The broker could not complete the request"
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

extension CertificateInfo {
    /// The certificate as the daemon's JSON describes it, for code that formats both alike.
    package init(_ certificate: BrokerCertificate) {
        self.init(
            subject: certificate.subject, issuer: certificate.issuer, notBefore: certificate.notBefore,
            notAfter: certificate.notAfter, sha256: certificate.sha256, spkiSHA256: certificate.spkiSHA256,
            dnsNames: certificate.dnsNames, ipAddresses: certificate.ipAddresses, isSelfSigned: certificate.isSelfSigned,
            isCA: certificate.isCA
        )
    }
}

extension ProxyErrorType {
    /// What the RFC 9209 error type means, as a problem title: for a broker error whose problem
    /// body could not be read.
    var summary: String {
        switch self {
        case .dnsError: "The host name could not be resolved"
        case .dnsTimeout: "The DNS lookup timed out"
        case .destinationNotFound: "The destination was not found"
        case .destinationUnavailable: "The destination is unavailable"
        case .connectionRefused: "The server refused the connection"
        case .connectionTerminated: "The server closed the connection"
        case .connectionTimeout: "Connecting to the server timed out"
        case .connectionLimitReached: "The broker's upstream connection limit was reached"
        case .tlsProtocolError: "The TLS handshake failed"
        case .tlsCertificateError: "The server's certificate is not trusted"
        case .httpRequestError: "The request was rejected"
        case .httpRequestDenied: "The request was denied by the broker's configuration"
        case .httpResponseIncomplete: "The server's response was incomplete"
        case .httpResponseHeaderSectionSize: "The server's response headers were too large"
        case .httpResponseTimeout: "The server did not answer in time"
        case .httpProtocolError: "The server broke the HTTP protocol"
        case .proxyInternalError: "The broker had an internal error"
        case .proxyConfigurationError: "The broker's configuration is wrong"
        }
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
    /// A control API answer that was not what its documentation promises: a status other than
    /// 2xx without the daemon's problem document (`reason` names the request), or JSON a wrapper
    /// could not decode. The socket is most likely not served by a daemon of this version.
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

