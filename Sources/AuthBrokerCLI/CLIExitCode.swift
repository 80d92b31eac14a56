import AuthBrokerClient
import Foundation

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
    /// `run` could not start the program (as shells say it).
    case cannotRun = 127

    /// The exit status for a failure the daemon reported, by its class (`BrokerError.kind`:
    /// the problem's code, then its RFC 9209 error type, then its HTTP status).
    package init(_ kind: BrokerError.Kind) {
        switch kind {
        case .untrustedServer: self = .untrustedServer
        case .unreachable: self = .connection
        case .upstreamProtocol: self = .upstream
        case .rejectedRequest: self = .badRequest
        case .notFound: self = .notFound
        case .brokerFailure: self = .failure
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

// MARK: - From any error

extension CLIError {
    /// The user-facing form of any error a command can meet: the one place where the client
    /// library's errors become `authbrokerctl`'s messages and exit statuses.
    ///
    /// - Parameters:
    ///   - context: what was being done, the first words of a daemon refusal's message
    ///     (`cannot add anchor`).
    ///   - socketPath: the daemon's socket, named when it cut a response short.
    package init(_ error: any Error, context: String? = nil, socketPath: String? = nil) {
        switch error {
        case let error as CLIError:
            self = error
        case let error as BrokerError:
            self.init(CLIExitCode(error.kind), HumanFormat.problem(error, context: context ?? "authbrokerd refused the request", now: Date()))
        case let error as BrokerClientError:
            self.init(clientError: error, context: context, socketPath: socketPath)
        case let error as InputError:
            self = .plain(.badRequest, error.message)
        case let error as LocalFile.Failure:
            self = .plain(.failure, error.message)
        case is CancellationError:
            self = .plain(.failure, "cancelled")
        default:
            self = .plain(.failure, "unexpected error: \(error)")
        }
    }

    private init(clientError: BrokerClientError, context: String?, socketPath: String?) {
        switch clientError {
        case .daemonNotRunning(let socket):
            self.init(.daemonNotRunning, HumanFormat.daemonNotRunning(socket: socket))
        case .permissionDenied(let socket):
            self = .plain(
                .failure,
                "permission denied connecting to \(socket); authbrokerd serves only the user it runs as, so use your own daemon's socket"
            )
        case .unusableSocket(let socket, let reason):
            self = .plain(.failure, "cannot connect to \(socket): \(reason)")
        case .foreignListener:
            // The library's text: who listens there, that nothing was sent, what to do.
            self = .plain(.failure, clientError.description)
        case .connectionClosed:
            let daemon = socketPath.map { "authbrokerd on \($0)" } ?? "authbrokerd"
            self = .plain(
                .upstream,
                "the response is incomplete: \(daemon) closed the connection before its end (the upstream may have cut it off); see the daemon's log (journalctl --user -u authbrokerd)"
            )
        case .protocolError(let reason):
            self = .plain(.upstream, "the daemon's answer is not valid HTTP/1.1 (\(reason)); is \(AuthBrokerCtl.version) the version of authbrokerd too?")
        case .responseTooLarge(let limit):
            self = .plain(.failure, "the daemon's answer is larger than \(limit / (1024 * 1024)) MiB; use --json and a filter, or report this as a bug")
        case .invalidRequest(let reason):
            self = .plain(.badRequest, "\(context.map { "\($0): " } ?? "")invalid request: \(HumanFormat.sanitized(reason))")
        case .unexpectedResponse(let status, let reason):
            // 3xx and 4xx: the request, 5xx (and a 2xx this CLI cannot read): the daemon.
            self = .plain(
                (300..<500).contains(status) ? .badRequest : .failure,
                "\(context.map { "\($0): " } ?? "")the daemon answered HTTP \(status) \(HumanFormat.sanitized(reason)); is authbrokerd version \(AuthBrokerCtl.version)?"
            )
        case .challengeCancelled:
            self = .plain(.failure, "cancelled")
        }
    }
}
