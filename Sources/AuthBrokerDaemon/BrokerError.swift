import AuthBrokerCore
import AuthBrokerKerberos
import AuthBrokerPAM
import AuthBrokerSecrets
import AuthBrokerTrust
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL

/// An error the broker produces itself, on the data plane or the control API.
///
/// One value carries everything the one mapping needs: the HTTP status, the RFC 9209 error type
/// for `Proxy-Status`, and the RFC 9457 problem body that tells the user what to do.
package struct BrokerError: Error, CustomStringConvertible, Sendable {
    /// Stable snake_case code; also the last part of the problem `type`, and `Authbroker-Error`.
    package var code: BrokerErrorCode
    package var status: HTTPResponseStatus
    package var proxyErrorType: ProxyErrorType?
    package var title: String
    package var detail: String
    package var host: String?
    package var reasons: [String]?
    package var chain: [CertificateInfo]?
    package var fix: [String]?
    /// Sent as `Retry-After` (RFC 9110 §10.2.3).
    package var retryAfterSeconds: Int?
    /// The hop the broker was talking to when it failed, when that was the upstream proxy
    /// (`next-hop` in `Proxy-Status`, RFC 9209 §2.1.3).
    package var nextHop: String?
    /// The upstream proxy's Basic and Digest challenges, sent as `Proxy-Authenticate` with a 407.
    package var proxyChallenges: [String] = []
    /// For `untrusted_server`: what the server presented, so that an agent can be asked about
    /// it (`ServerTrustChallenges`). Never rendered.
    package var serverTrustFailure: UntrustedServer?

    package init(
        code: BrokerErrorCode, status: HTTPResponseStatus, proxyErrorType: ProxyErrorType? = nil,
        title: String, detail: String, host: String? = nil, reasons: [String]? = nil,
        chain: [CertificateInfo]? = nil, fix: [String]? = nil, retryAfterSeconds: Int? = nil, nextHop: String? = nil,
        proxyChallenges: [String] = [], serverTrustFailure: UntrustedServer? = nil
    ) {
        self.nextHop = nextHop
        self.proxyChallenges = proxyChallenges
        self.serverTrustFailure = serverTrustFailure
        self.retryAfterSeconds = retryAfterSeconds
        self.code = code
        self.status = status
        self.proxyErrorType = proxyErrorType
        self.title = title
        self.detail = detail
        self.host = host
        self.reasons = reasons
        self.chain = chain
        self.fix = fix
    }

    package var description: String { "\(self.code): \(self.detail)" }

    package func problem(requestID: String?) -> ProblemDetails {
        ProblemDetails(
            code: self.code.rawValue, title: self.title, status: Int(self.status.code), detail: self.detail,
            instance: requestID, proxyStatus: self.proxyErrorType, host: self.host,
            reasons: self.reasons, chain: self.chain, fix: self.fix
        )
    }

    /// The response head and body for this error: status, `Proxy-Status` (upstream errors only),
    /// `application/problem+json`; `Connection: close` unless `keepAlive` (every path that ends
    /// the client connection after it says so here).
    package func response(requestID: String?, keepAlive: Bool = true) -> (HTTPResponseHead, ByteBuffer) {
        let body = (try? BrokerJSON.encoder().encode(self.problem(requestID: requestID))) ?? Data()
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: ProblemDetails.mediaType)
        headers.add(name: "Content-Length", value: String(body.count))
        headers.add(name: "Cache-Control", value: "no-store")
        headers.add(name: BrokerHeaders.error, value: self.code.rawValue)
        if let proxyErrorType {
            headers.add(
                name: "Proxy-Status",
                value: ProxyStatusField.render(error: proxyErrorType, details: self.detail, nextHop: self.nextHop)
            )
        }
        for challenge in self.proxyChallenges {
            headers.add(name: "Proxy-Authenticate", value: challenge)
        }
        if let requestID {
            headers.add(name: BrokerHeaders.requestID, value: requestID)
        }
        if let retryAfterSeconds {
            headers.add(name: "Retry-After", value: String(retryAfterSeconds))
        }
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        return (
            HTTPResponseHead(version: .http1_1, status: self.status, headers: headers),
            ByteBuffer(bytes: body)
        )
    }
}

/// A server whose chain was not trusted: what it presented and the verdict.
package struct UntrustedServer: Sendable {
    package var origin: CanonicalOrigin
    package var decision: TrustDecision
    /// Leaf first, as the server sent it.
    package var chainDER: [[UInt8]]
}

// MARK: - Client-side errors

extension BrokerError {
    package static func badRequest(_ error: RequestTargetError) -> BrokerError {
        BrokerError(
            code: BrokerErrorCode(error.kind), status: .badRequest, title: "Bad request target",
            detail: error.message
        )
    }

    package static func badRequest(code: BrokerErrorCode, detail: String) -> BrokerError {
        BrokerError(code: code, status: .badRequest, title: "Bad request", detail: detail)
    }

    package static func malformedRequest(_ error: any Error) -> BrokerError {
        BrokerError(
            code: .malformedRequest, status: .badRequest, proxyErrorType: .httpRequestError,
            title: "Malformed HTTP request",
            detail:
                "The request could not be parsed as HTTP/1.1 (\(error)). Send `METHOD https://host/path HTTP/1.1` requests, or /v1/ control requests."
        )
    }

    package static func requestHeadTooLarge(limit: Int) -> BrokerError {
        BrokerError(
            code: .requestHeadTooLarge, status: .requestHeaderFieldsTooLarge,
            title: "Request header section too large",
            detail:
                "The request line and headers exceed \(limit) bytes. Send fewer or smaller headers, or raise [limits] max_request_head_bytes in config.toml."
        )
    }

    package static func requestHeadTimeout(milliseconds: Int) -> BrokerError {
        BrokerError(
            code: .requestHeadTimeout, status: .requestTimeout, title: "Request not received in time",
            detail:
                "The request line and headers did not all arrive within \(milliseconds) ms of their first byte, so the connection was closed. Send the whole head at once, or raise [limits] request_head_timeout_ms in config.toml."
        )
    }

    package static func clientConnectionsFull() -> BrokerError {
        BrokerError(
            code: .clientConnectionsFull, status: .serviceUnavailable, title: "Too many client connections",
            detail:
                "Every connection slot for requests is taken (see [limits] max_client_connections); this one was kept for /v1/ control requests only. Close connections your apps hold idle, or raise the limit.",
            retryAfterSeconds: 1
        )
    }

    /// Only the cache may answer, and it holds nothing usable for the request (RFC 9111
    /// §5.2.1.7: 504).
    package static func notCached(url: String, offline: Bool) -> BrokerError {
        BrokerError(
            code: .notCached, status: .gatewayTimeout, title: "Not in the cache",
            detail: offline
                ? "The broker is offline (authbrokerctl offline on) and has no stored response for \(url) that may be served. Turn offline mode off with `authbrokerctl offline off` to fetch it."
                : "The request asked to be answered from the cache only (only-if-cached), and no stored response for \(url) may be served. Send it without only-if-cached to fetch it.",
            fix: offline ? ["authbrokerctl offline off"] : nil
        )
    }

    /// Offline mode, and a request only the network could answer.
    package static func offline(method: String, url: String) -> BrokerError {
        BrokerError(
            code: .offline, status: .serviceUnavailable, title: "The broker is offline",
            detail: "Offline mode (authbrokerctl offline on) answers from the cache only, and a \(method) to \(url) cannot be answered from it. Turn offline mode off with `authbrokerctl offline off`.",
            fix: ["authbrokerctl offline off"]
        )
    }

    package static func shuttingDown() -> BrokerError {
        BrokerError(
            code: .shuttingDown, status: .serviceUnavailable, title: "authbrokerd is shutting down",
            detail: "The daemon is stopping and takes no new requests. Retry once it has restarted."
        )
    }
}

// MARK: - Upstream errors

extension BrokerError {
    /// The server's certificate chain failed the daemon's trust evaluation.
    package static func untrustedServer(origin: CanonicalOrigin, decision: TrustDecision, chainDER: [[UInt8]] = []) -> BrokerError {
        let reasons = decision.failures.map(\.summary)
        var fix: [String] = []
        // An anchor fixes only a missing issuer. A certificate for another name, expired, for
        // other uses or weakly signed stays so under any anchor (offering `anchors trust-server`
        // again right after it was done helps nobody); the exception for this one certificate
        // does trust it, and a pin mismatch is the user's own rule, so nothing is offered for it.
        let anchorFixes = !decision.failures.isEmpty && decision.failures.allSatisfy(\.isAboutTheIssuer)
        if anchorFixes, let topmost = decision.chain.last {
            fix.append("authbrokerctl anchors trust-server \(origin) --fingerprint \(topmost.sha256)")
        }
        if anchorFixes {
            let scope = HostScope.suggestedPattern(for: origin.host)
            fix.append("authbrokerctl anchors add CA.pem --hosts '\(scope)'")
        }
        let pinned = decision.failures.contains { if case .pinMismatch = $0 { true } else { false } }
        if !pinned, let leaf = decision.chain.first {
            let host = origin.host.contains(":") ? "[\(origin.host)]" : origin.host
            fix.append("authbrokerctl exceptions add \(host):\(origin.port) \(leaf.sha256)")
        }
        // The summary names what an anchor cannot cure, when there is such a failure: it is the
        // one the advice that follows is about (an anchor out of scope beside a name mismatch
        // would otherwise say "add this host to the anchor" and then "an anchor would not help").
        let decisive = anchorFixes ? decision.failures.first : decision.failures.first { !$0.isAboutTheIssuer }
        var summary = decisive?.summary ?? reasons.first ?? "the chain did not verify"
        while summary.hasSuffix(".") { summary.removeLast() }
        let advice =
            if anchorFixes {
                "If you trust this server, add its CA (or its own certificate) as an anchor for this host; see `fix`."
            } else if pinned {
                "Your pin for this host decides here, under any anchor or exception: if the server's key changed legitimately, remove the old pin (`authbrokerctl pins list`, then `authbrokerctl pins remove`)."
            } else {
                "An anchor would not change that; if you trust this very certificate anyway, add an exception for it (see `fix`)."
            }
        return BrokerError(
            code: .untrustedServer, status: .badGateway, proxyErrorType: .tlsCertificateError,
            title: "The server's certificate is not trusted",
            detail: "\(origin.hostHeader) presented a certificate chain that is not trusted: \(summary). " + advice,
            host: origin.hostHeader, reasons: reasons, chain: decision.chain, fix: fix,
            serverTrustFailure: UntrustedServer(origin: origin, decision: decision, chainDER: chainDER)
        )
    }

    /// A TLS failure, unless the server's alert says it is about our client certificate. Such
    /// alerts arrive in the handshake (TLS 1.2) or on the first read after it (TLS 1.3, where the
    /// server checks the client's certificate after the client has finished), so the exchange maps
    /// its TLS errors through here too.
    package static func tlsHandshakeFailed(origin: CanonicalOrigin, underlying: any Error, identity: String? = nil) -> BrokerError {
        switch ClientCertificateAlert(underlying) {
        case .required?: return .clientCertificateRequired(origin: origin, presented: identity)
        case .rejected?: return .clientCertificateRejected(origin: origin, presented: identity)
        case nil: return .tlsFailed(origin: origin, underlying: underlying)
        }
    }

    private static func tlsFailed(origin: CanonicalOrigin, underlying: any Error) -> BrokerError {
        BrokerError(
            code: .tlsHandshakeFailed, status: .badGateway, proxyErrorType: .tlsProtocolError,
            title: "TLS handshake failed",
            detail:
                "The TLS handshake with \(origin.hostHeader) failed (\(underlying)). Check that the server speaks TLS 1.2 or later on this port and that the URL's scheme is right; if it requires a client certificate, import one with `authbrokerctl identities import`.",
            host: origin.hostHeader
        )
    }

    /// The secret store refused or failed; its message says what is wrong and what to do.
    package static func secretStore(_ error: SecretStoreError) -> BrokerError {
        let status: HTTPResponseStatus =
            switch error.kind {
            case .invalidInput: .badRequest
            case .locked, .serviceUnavailable, .busy: .serviceUnavailable
            case .corrupt, .keyMissing, .keyInvalid, .permission, .io, .serviceFailed: .internalServerError
            }
        return BrokerError(code: BrokerErrorCode(error.kind), status: status, title: "The secret store failed", detail: error.message)
    }

    package static func clientCertificateRequired(origin: CanonicalOrigin, presented: String?) -> BrokerError {
        let scope = HostScope.suggestedPattern(for: origin.host)
        let what = presented.map { "The broker presented the identity '\($0)', which it did not accept as one" } ?? "The broker had no client identity for this host"
        return BrokerError(
            code: .clientCertificateRequired, status: .badGateway, proxyErrorType: .tlsCertificateError,
            title: "The server requires a client certificate",
            detail:
                "\(origin.hostHeader) asked for a client certificate (mTLS). \(what). Import yours for this host: `authbrokerctl identities import FILE.p12 --hosts '\(scope)'`, or name one per request with the header `Authbroker-Identity: NAME`.",
            host: origin.hostHeader,
            fix: ["authbrokerctl identities import FILE.p12 --hosts '\(scope)'"]
        )
    }

    package static func clientCertificateRejected(origin: CanonicalOrigin, presented: String?) -> BrokerError {
        guard let presented else { return .clientCertificateRequired(origin: origin, presented: nil) }
        return BrokerError(
            code: .clientCertificateRejected, status: .badGateway, proxyErrorType: .tlsCertificateError,
            title: "The server rejected the client certificate",
            detail:
                "\(origin.hostHeader) refused the client identity '\(presented)' (its certificate is expired, revoked, or not from a CA that server accepts). Check it with `authbrokerctl identities list`, or import the right one for this host.",
            host: origin.hostHeader
        )
    }

    /// The client identity chosen for a request could not be loaded (its key is in the secret store).
    package static func clientIdentityUnavailable(name: String, origin: CanonicalOrigin, reason: String) -> BrokerError {
        BrokerError(
            code: .clientIdentityUnavailable, status: .badGateway, proxyErrorType: .proxyInternalError,
            title: "The client identity could not be used",
            detail:
                "The client identity '\(name)' for \(origin.hostHeader) could not be loaded: \(reason). `authbrokerctl status` shows the secret store's state; import the identity again if it is damaged.",
            host: origin.hostHeader
        )
    }

    package static func tlsHandshakeTimeout(origin: CanonicalOrigin, milliseconds: Int) -> BrokerError {
        BrokerError(
            code: .tlsHandshakeTimeout, status: .gatewayTimeout, proxyErrorType: .connectionTimeout,
            title: "TLS handshake timed out",
            detail:
                "\(origin.hostHeader) did not complete the TLS handshake within \(milliseconds) ms. Check that the server speaks TLS on this port, or raise [upstream] tls_handshake_timeout_ms.",
            host: origin.hostHeader
        )
    }

    package static func dnsFailed(origin: CanonicalOrigin, underlying: any Error) -> BrokerError {
        BrokerError(
            code: .dnsError, status: .badGateway, proxyErrorType: .dnsError,
            title: "Host name did not resolve",
            detail:
                "\(origin.host) could not be resolved (\(underlying)). Check the spelling and your DNS; for test hosts, add an [upstream] resolve entry in config.toml.",
            host: origin.hostHeader
        )
    }

    package static func connectionRefused(origin: CanonicalOrigin) -> BrokerError {
        BrokerError(
            code: .connectionRefused, status: .badGateway, proxyErrorType: .connectionRefused,
            title: "Connection refused",
            detail: "\(origin.hostHeader) refused the connection. Check that the server is running and the port is right.",
            host: origin.hostHeader
        )
    }

    package static func connectTimeout(origin: CanonicalOrigin, milliseconds: Int) -> BrokerError {
        BrokerError(
            code: .connectionTimeout, status: .gatewayTimeout, proxyErrorType: .connectionTimeout,
            title: "Connection timed out",
            detail:
                "No TCP connection to \(origin.hostHeader) within \(milliseconds) ms. Check the host and the network, or raise [upstream] connect_timeout_ms.",
            host: origin.hostHeader
        )
    }

    package static func connectFailed(origin: CanonicalOrigin, underlying: any Error) -> BrokerError {
        BrokerError(
            code: .destinationUnavailable, status: .badGateway, proxyErrorType: .destinationUnavailable,
            title: "Could not connect",
            detail: "Connecting to \(origin.hostHeader) failed (\(underlying)). Check the host, the port and the network.",
            host: origin.hostHeader
        )
    }

    /// The Unix socket a `[[route]]` names for `origin` refused or is missing.
    package static func unixRouteUnreachable(_ error: any Error, route: UnixRoute, origin: CanonicalOrigin) -> BrokerError {
        let errno = (error as? IOError)?.errnoCode
        let (code, type, why): (BrokerErrorCode, ProxyErrorType, String) =
            switch errno {
            case ECONNREFUSED: (.connectionRefused, .connectionRefused, "nothing listens on it")
            case ENOENT: (.destinationUnavailable, .destinationUnavailable, "it does not exist")
            case EACCES: (.destinationUnavailable, .destinationUnavailable, "you may not connect to it (its permissions)")
            default: (.destinationUnavailable, .destinationUnavailable, "\(error)")
            }
        return BrokerError(
            code: code, status: .badGateway, proxyErrorType: type, title: "Could not connect",
            detail: "\(origin.hostHeader) is routed to the Unix socket \(route.socketPath) ([[route]] in config.toml), and \(why). Start the server behind it, or correct the route.",
            host: origin.hostHeader
        )
    }

    package static func responseHeadTimeout(origin: CanonicalOrigin, milliseconds: Int) -> BrokerError {
        BrokerError(
            code: .httpResponseTimeout, status: .gatewayTimeout, proxyErrorType: .httpResponseTimeout,
            title: "The server did not answer in time",
            detail:
                "\(origin.hostHeader) sent no response head within \(milliseconds) ms of the request. Retry later, or raise [upstream] response_head_timeout_ms.",
            host: origin.hostHeader
        )
    }

    package static func idleTimeout(origin: CanonicalOrigin, milliseconds: Int) -> BrokerError {
        BrokerError(
            code: .idleTimeout, status: .gatewayTimeout, proxyErrorType: .httpResponseTimeout,
            title: "The connection went idle",
            detail:
                "No bytes moved to or from \(origin.hostHeader) for \(milliseconds) ms. Retry, or raise [upstream] idle_timeout_ms.",
            host: origin.hostHeader
        )
    }

    package static func upstreamProtocolError(origin: CanonicalOrigin, underlying: any Error) -> BrokerError {
        BrokerError(
            code: .httpProtocolError, status: .badGateway, proxyErrorType: .httpProtocolError,
            title: "The server's response was not valid HTTP/1.1",
            detail: "\(origin.hostHeader) sent a response that could not be parsed (\(underlying)).",
            host: origin.hostHeader
        )
    }

    package static func responseHeadTooLarge(origin: CanonicalOrigin, limit: Int) -> BrokerError {
        BrokerError(
            code: .responseHeadTooLarge, status: .badGateway,
            proxyErrorType: .httpResponseHeaderSectionSize,
            title: "The server's response head is too large",
            detail:
                "\(origin.hostHeader) sent a response head over \(limit) bytes. Raise [limits] max_response_head_bytes if this server is legitimate.",
            host: origin.hostHeader
        )
    }

    package static func responseIncomplete(origin: CanonicalOrigin) -> BrokerError {
        BrokerError(
            code: .httpResponseIncomplete, status: .badGateway, proxyErrorType: .httpResponseIncomplete,
            title: "The server's response was cut off",
            detail: "\(origin.hostHeader) closed the connection in the middle of the response head. Retry; if it keeps happening, the server is failing.",
            host: origin.hostHeader
        )
    }

        package static func connectionClosedEarly(origin: CanonicalOrigin) -> BrokerError {
        BrokerError(
            code: .connectionTerminated, status: .badGateway, proxyErrorType: .connectionTerminated,
            title: "The server closed the connection",
            detail: "\(origin.hostHeader) closed the connection before sending a complete response head.",
            host: origin.hostHeader
        )
    }

    package static func tooManyPending(origin: CanonicalOrigin, limit: Int) -> BrokerError {
        BrokerError(
            code: .connectionLimitReached, status: .serviceUnavailable,
            proxyErrorType: .connectionLimitReached,
            title: "Too many requests waiting for this server",
            detail:
                "\(limit) requests are already waiting for a connection to \(origin.hostHeader). Retry later, or raise [upstream] max_pending_requests_per_origin / max_connections_per_origin.",
            host: origin.hostHeader
        )
    }

    package static func internalError(_ what: String) -> BrokerError {
        BrokerError(
            code: .internalError, status: .internalServerError, proxyErrorType: .proxyInternalError,
            title: "Internal error in authbrokerd",
            detail: "\(what). This is a bug in authbrokerd; please report it with the daemon's log lines for this request id."
        )
    }
}

/// Turns the errors NIO raises while connecting into broker errors.
extension BrokerError {
    package static func fromConnectError(_ error: any Error, origin: CanonicalOrigin, settings: BrokerSettings) -> BrokerError {
        if let broker = error as? BrokerError { return broker }
        if let channelError = error as? ChannelError, case .connectTimeout = channelError {
            return .connectTimeout(origin: origin, milliseconds: settings.upstream.connectTimeoutMilliseconds)
        }
        if let connectionError = error as? NIOConnectionError {
            if connectionError.connectionErrors.isEmpty,
                let dnsError = connectionError.dnsAError ?? connectionError.dnsAAAAError
            {
                return .dnsFailed(origin: origin, underlying: dnsError)
            }
            let errnos = connectionError.connectionErrors.compactMap { ($0.error as? IOError)?.errnoCode }
            if !errnos.isEmpty, errnos.allSatisfy({ $0 == ECONNREFUSED }) {
                return .connectionRefused(origin: origin)
            }
            if let first = connectionError.connectionErrors.first {
                return fromConnectError(first.error, origin: origin, settings: settings)
            }
            return .dnsFailed(origin: origin, underlying: connectionError)
        }
        if let addressError = error as? SocketAddressError {
            return .dnsFailed(origin: origin, underlying: addressError)
        }
        if let ioError = error as? IOError {
            switch ioError.errnoCode {
            case ECONNREFUSED: return .connectionRefused(origin: origin)
            case ETIMEDOUT: return .connectTimeout(origin: origin, milliseconds: settings.upstream.connectTimeoutMilliseconds)
            default: return .connectFailed(origin: origin, underlying: ioError)
            }
        }
        if error is NIOSSLError || error is BoringSSLError {
            return .tlsHandshakeFailed(origin: origin, underlying: error)
        }
        return .connectFailed(origin: origin, underlying: error)
    }
}

/// How the broker suggests scoping a new anchor for a host.
package enum HostScope {
    /// `*.parent.domain` for a DNS name with at least three labels (an internal CA usually
    /// serves a whole domain), the host itself for IP addresses and short names.
    package static func suggestedPattern(for host: String) -> String {
        let labels = host.split(separator: ".")
        let isIP = host.contains(":") || labels.allSatisfy { $0.allSatisfy(\.isNumber) }
        if isIP || labels.count < 3 { return host }
        return "*." + labels.dropFirst().joined(separator: ".")
    }
}


/// What a TLS alert from the server says about our client certificate, read from the error
/// BoringSSL reported (its reason names the alert).
enum ClientCertificateAlert {
    /// TLS 1.3 `certificate_required`. (A TLS 1.2 server says `handshake_failure`, which has other
    /// causes too: that stays a generic TLS failure whose message mentions client certificates.)
    case required
    /// `bad_certificate`, `unknown_ca`, `certificate_expired`, `certificate_revoked`, `certificate_unknown`, `access_denied`.
    case rejected

    init?(_ error: any Error) {
        let text = String(describing: error).uppercased()
        if text.contains("CERTIFICATE_REQUIRED") {
            self = .required
        } else if ["ALERT_BAD_CERTIFICATE", "ALERT_UNKNOWN_CA", "ALERT_CERTIFICATE_EXPIRED", "ALERT_CERTIFICATE_REVOKED",
            "ALERT_CERTIFICATE_UNKNOWN", "ALERT_ACCESS_DENIED"].contains(where: text.contains)
        {
            self = .rejected
        } else {
            return nil
        }
    }
}

// MARK: - Upstream proxy errors

extension BrokerError {
    /// The upstream proxy could not be reached: the connect error (refused, DNS, timeout…) said
    /// about the proxy, with what to check (`[upstream] proxy` and `no_proxy`).
    package static func proxyUnreachable(_ error: BrokerError, proxy: CanonicalOrigin, origin: CanonicalOrigin) -> BrokerError {
        var error = error
        error.detail =
            "The upstream proxy \(proxy.hostHeader) ([upstream] proxy in config.toml), through which \(origin.hostHeader) is reached, could not be reached: \(error.detail) Check that the proxy runs and the address is right, or list \(origin.host) in [upstream] no_proxy to reach it directly."
        error.host = origin.hostHeader
        error.nextHop = proxy.authorityForm
        return error
    }

    /// The proxy answered CONNECT with a status other than 2xx (and not a 407 the broker could
    /// answer): 403 is a refusal by the proxy's policy, anything else that it could not reach the origin.
    package static func proxyRefusedTunnel(proxy: CanonicalOrigin, origin: CanonicalOrigin, status: HTTPResponseStatus) -> BrokerError {
        let denied = status == .forbidden
        let advice =
            denied
            ? "Its rules do not allow this destination: ask its administrator, or list \(origin.host) in [upstream] no_proxy if it can be reached directly."
            : "It could not reach \(origin.hostHeader): check the host and port, and the proxy's own log."
        return BrokerError(
            code: .proxyTunnelRefused, status: .badGateway,
            proxyErrorType: denied ? .httpRequestDenied : .destinationUnavailable,
            title: "The upstream proxy refused the tunnel",
            detail:
                "The upstream proxy \(proxy.hostHeader) answered CONNECT \(origin.authorityForm) with \(status.code) \(status.reasonPhrase). \(advice)",
            host: origin.hostHeader, nextHop: proxy.authorityForm
        )
    }

    /// The proxy answered CONNECT with something that is not an HTTP response, or closed first.
    package static func proxyTunnelFailed(proxy: CanonicalOrigin, origin: CanonicalOrigin, reason: String) -> BrokerError {
        BrokerError(
            code: .proxyTunnelFailed, status: .badGateway, proxyErrorType: .connectionTerminated,
            title: "The upstream proxy did not open the tunnel",
            detail:
                "The upstream proxy \(proxy.hostHeader) did not answer CONNECT \(origin.authorityForm) properly (\(reason)). Check that [upstream] proxy names an HTTP proxy that allows CONNECT to port \(origin.port).",
            host: origin.hostHeader, nextHop: proxy.authorityForm
        )
    }

    /// A server (or, with `isProxy`, the upstream proxy) asked for Kerberos, which the user's
    /// settings allow it, and no token could be made; what to do depends on why.
    package static func kerberos(_ failure: KerberosFailure, challenger: CanonicalOrigin, isProxy: Bool, origin: CanonicalOrigin) -> BrokerError {
        let who = isProxy ? "The upstream proxy \(challenger.hostHeader)" : challenger.hostHeader
        // The service asked for (the canonical host), written as principals are: HTTP/host.
        let service = (failure.service ?? "HTTP@\(challenger.host)").replacingOccurrences(of: "@", with: "/")
        switch failure.kind {
        case .noTicket, .ticketExpired:
            let state = failure.kind == .noTicket ? "you have no Kerberos ticket" : "your Kerberos ticket has expired"
            return BrokerError(
                code: .kerberosTicketNeeded, status: .badGateway,
                title: "A Kerberos ticket is needed",
                detail:
                    "\(who) asks for Kerberos (Negotiate), and \(state) (\(failure.detail)). Run `kinit` to get one, then send the request again; `authbrokerctl status` shows the ticket the daemon sees. If kinit puts the ticket where the daemon does not look, give the daemon the same KRB5CCNAME (see the README, Kerberos).",
                host: origin.hostHeader, fix: ["kinit", "authbrokerctl status"], nextHop: isProxy ? challenger.authorityForm : nil
            )
        case .mutualAuthenticationFailed:
            return BrokerError(
                code: .kerberosMutualAuthFailed, status: .badGateway, proxyErrorType: .httpProtocolError,
                title: "The server did not prove its Kerberos identity",
                detail:
                    "\(who) accepted the Kerberos ticket, but its answer token does not prove that it holds the key of \(service) (\(failure.detail)). The response was not passed on: something between you and the server may be impersonating it.",
                host: origin.hostHeader, nextHop: isProxy ? challenger.authorityForm : nil
            )
        case .refusedByServer:
            return BrokerError(
                code: .kerberosFailed, status: .badGateway,
                title: "The server refused the Kerberos ticket",
                detail:
                    "\(who) asked for Kerberos (Negotiate) and refused the ticket for \(service) (\(failure.detail)). Its keytab may not hold the key the KDC issued the ticket with, the clocks may differ, or it may not accept your principal; `klist` shows the ticket, and the server's administrator can check its log.",
                host: origin.hostHeader, nextHop: isProxy ? challenger.authorityForm : nil
            )
        case .kdcUnreachable, .serverUnknown, .clockSkew, .other:
            let advice =
                switch failure.kind {
                case .kdcUnreachable: "No KDC of your realm answered in time: check the network, or the KDCs your krb5.conf names."
                case .serverUnknown: "Your KDC knows no service principal \(service): ask its administrator, or remove the host from [kerberos] hosts."
                case .clockSkew: "This machine's clock differs too much from the KDC's or the server's: set the time (timedatectl)."
                default: "Check `klist`, and run the request with KRB5_TRACE=/dev/stderr set for the daemon to see more."
                }
            return BrokerError(
                code: .kerberosFailed, status: .badGateway,
                title: "No Kerberos ticket could be had for the server",
                detail: "\(who) asks for Kerberos (Negotiate), and no service ticket for \(service) could be had (\(failure.detail)). \(advice)",
                host: origin.hostHeader, nextHop: isProxy ? challenger.authorityForm : nil
            )
        }
    }

    /// The proxy wants credentials for a tunnel and the broker has none it may send: the client
    /// gets the 407 with the proxy's Basic and Digest challenges, and how to store a password.
    package static func proxyAuthenticationRequired(proxy: CanonicalOrigin, origin: CanonicalOrigin, challenges: [String]) -> BrokerError {
        BrokerError(
            code: .proxyAuthenticationRequired, status: .proxyAuthenticationRequired,
            title: "The upstream proxy requires authentication",
            detail:
                "The upstream proxy \(proxy.hostHeader) asked for credentials to reach \(origin.hostHeader), and no stored password answers it (or the stored one was refused; `authbrokerctl passwords list` shows REFUSED). Store the proxy's password with `authbrokerctl passwords add \(proxy) --user NAME`, or send Proxy-Authorization yourself.",
            host: origin.hostHeader, fix: ["authbrokerctl passwords add \(proxy) --user NAME"], proxyChallenges: challenges
        )
    }
}

// MARK: - The codes of other modules' errors

/// Each code of a request-target, trust-store, PAM or secret-store error, as the broker sends it.
/// Exhaustive, so that a new code in one of those modules must be given its broker code here;
/// every one keeps its wire form (`BrokerErrorCodeMappingTests`).
extension BrokerErrorCode {
    package init(_ code: RequestTargetError.Code) {
        self =
            switch code {
            case .emptyTarget: .emptyTarget
            case .notAbsolute: .notAbsolute
            case .unsupportedScheme: .unsupportedScheme
            case .missingHost: .missingHost
            case .invalidHost: .invalidHost
            case .invalidPort: .invalidPort
            case .userinfoNotAllowed: .userinfoNotAllowed
            case .fragmentNotAllowed: .fragmentNotAllowed
            case .invalidCharacter: .invalidCharacter
            case .tooLong: .tooLong
            }
    }

    package init(_ code: TrustStoreError.Code) {
        self =
            switch code {
            case .notFound: .notFound
            case .ambiguous: .ambiguous
            case .invalidPrefix: .invalidPrefix
            case .invalidCertificate: .invalidCertificate
            case .notACertificate: .notACertificate
            case .inputTooLarge: .inputTooLarge
            case .invalidPin: .invalidPin
            case .corruptFile: .corruptFile
            case .changedOnDisk: .changedOnDisk
            case .ioError: .ioError
            case .invalidIdentityName: .invalidIdentityName
            case .identityExists: .identityExists
            case .unknownIdentity: .unknownIdentity
            case .identityNotForHost: .identityNotForHost
            case .identityExpired: .identityExpired
            case .invalidIdentity: .invalidIdentity
            case .invalidHost: .invalidHost
            case .invalidFingerprint: .invalidFingerprint
            }
    }

    package init(_ code: PAMError.Code) {
        self =
            switch code {
            case .authenticationFailed: .authenticationFailed
            case .accountUnavailable: .accountUnavailable
            case .userUnknown: .userUnknown
            case .timedOut: .timedOut
            case .cancelled: .cancelled
            case .conversationFailed: .conversationFailed
            case .systemError: .systemError
            }
    }

    /// `secret_store_` and the store's own code.
    package init(_ code: SecretStoreError.Code) {
        self =
            switch code {
            case .locked: .secretStoreLocked
            case .serviceUnavailable: .secretStoreServiceUnavailable
            case .corrupt: .secretStoreCorrupt
            case .keyMissing: .secretStoreKeyMissing
            case .keyInvalid: .secretStoreKeyInvalid
            case .permission: .secretStorePermission
            case .io: .secretStoreIO
            case .busy: .secretStoreBusy
            case .invalidInput: .secretStoreInvalidInput
            case .serviceFailed: .secretStoreServiceFailed
            }
    }
}
