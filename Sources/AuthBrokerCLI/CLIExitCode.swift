import AuthBrokerCore

/// The process exit status of `authbrokerctl`, one per class of failure.
///
/// Scripts branch on these, so each value is stable once published (docs/cli.md lists them).
/// 22 mirrors curl's `--fail`; 64 is `EX_USAGE` (sysexits.h), which swift-argument-parser
/// already uses for bad arguments.
package enum CLIExitCode: Int32, Sendable, CaseIterable {
    case success = 0
    /// Anything not covered below: local I/O errors, a daemon-internal error, a declined prompt.
    case failure = 1
    /// No daemon listens on the socket (missing, refused, not a socket).
    case daemonNotRunning = 3
    /// The upstream server's certificate is not trusted, or is not the one `--fingerprint` named.
    case untrustedServer = 4
    /// The upstream could not be reached: DNS, refused, reset, timed out.
    case connection = 5
    /// The upstream was reached but broke the protocol (TLS handshake, malformed or cut-off HTTP).
    case upstream = 6
    /// The request was rejected as invalid, by authbrokerctl or by the daemon.
    case badRequest = 7
    /// The anchor or pin named does not exist.
    case notFound = 8
    /// `fetch --fail` and the origin answered with a status of 400 or more.
    case httpError = 22
    /// The command line itself is wrong (swift-argument-parser's own code).
    case usage = 64

    /// The exit status for a problem the broker reported, by its RFC 9209 error type first and
    /// its HTTP status otherwise.
    package static func forProblem(_ problem: ProblemDetails) -> CLIExitCode {
        if problem.code == BrokerErrorCode.untrustedServer.rawValue { return .untrustedServer }
        if let proxyStatus = problem.proxyStatus { return forProxyError(proxyStatus) }
        switch problem.status {
        case 404: return .notFound
        case 400..<500, 501: return .badRequest
        default: return .failure
        }
    }

    /// The exit status for a broker error known only by its `Proxy-Status` error type.
    package static func forProxyError(_ error: ProxyErrorType) -> CLIExitCode {
        switch error {
        case .tlsCertificateError:
            return .untrustedServer
        case .dnsError, .dnsTimeout, .destinationNotFound, .destinationUnavailable, .connectionRefused,
            .connectionTerminated, .connectionTimeout, .connectionLimitReached, .httpResponseTimeout:
            return .connection
        case .tlsProtocolError, .httpResponseIncomplete, .httpResponseHeaderSectionSize, .httpProtocolError:
            return .upstream
        case .httpRequestError, .httpRequestDenied:
            return .badRequest
        case .proxyInternalError, .proxyConfigurationError:
            return .failure
        }
    }
}

/// A failure `authbrokerctl` reports to the user: the full text for stderr and the exit status.
///
/// Commands throw this; the runner prints `message` once and exits with `exitCode`, so no
/// Swift error description or stack trace ever reaches the user.
package struct CLIError: Error, Sendable, Equatable, CustomStringConvertible {
    package var exitCode: CLIExitCode
    /// Complete, already formatted text, starting with `authbrokerctl: `.
    package var message: String

    package init(_ exitCode: CLIExitCode, _ message: String) {
        self.exitCode = exitCode
        self.message = message
    }

    /// A one-line error in the CLI's voice: `authbrokerctl: <text>`.
    package static func plain(_ exitCode: CLIExitCode, _ text: String) -> CLIError {
        CLIError(exitCode, "authbrokerctl: \(text)")
    }

    package var description: String { message }
}
