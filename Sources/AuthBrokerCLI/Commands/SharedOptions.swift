import ArgumentParser
import AuthBrokerCore
import Foundation
import NIOCore
import NIOHTTP1

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `--socket` and `--config`, on every command: where to find the daemon.
package struct ConnectionOptions: ParsableArguments {
    @Option(
        name: .long,
        help: ArgumentHelp(
            "The daemon's socket. Default: $AUTHBROKER_SOCKET, else socket_path in the config file, else $XDG_RUNTIME_DIR/authbroker/authbroker.sock.",
            valueName: "path"
        )
    )
    package var socket: String?

    @Option(
        name: .long,
        help: ArgumentHelp(
            "The config file to read socket_path from. Default: $AUTHBROKER_CONFIG, else $XDG_CONFIG_HOME/authbroker/config.toml.",
            valueName: "path"
        )
    )
    package var config: String?

    package init() {}

    /// The socket path by the documented precedence: --socket, AUTHBROKER_SOCKET, the config
    /// file's socket_path, the runtime directory, /tmp/authbroker-<uid>.
    package func socketPath() throws -> String {
        let environment = ProcessInfo.processInfo.environment
        // The config file matters only when neither --socket nor AUTHBROKER_SOCKET decides.
        var configured: String?
        if socket == nil, environment["AUTHBROKER_SOCKET"]?.isEmpty ?? true {
            configured = try configuredSocketPath(environment: environment)
        }
        return BrokerPaths.socketPath(explicit: socket, configured: configured, environment: environment, uid: getuid())
    }

    private func configuredSocketPath(environment: [String: String]) throws -> String? {
        let path = BrokerPaths.configFile(explicit: config, environment: environment)
        do {
            return try BrokerSettings.load(path: path)?.daemon.socketPath
        } catch {
            throw CLIError.plain(.failure, "\(error) (pass --socket to connect without reading the config file)")
        }
    }

    package func client() throws -> BrokerSocketClient {
        BrokerSocketClient(socketPath: try socketPath())
    }
}

/// `--json`, on the commands that print a daemon answer.
package struct OutputOptions: ParsableArguments {
    @Flag(name: .long, help: "Print the daemon's JSON answer unchanged, for scripts.")
    package var json = false

    package init() {}
}

/// Runs a command body and turns every failure into a message on stderr and an exit code.
///
/// This is the one place errors meet the user, so no command can leak a Swift error
/// description or crash on bad input.
enum CommandRunner {
    static func run(_ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch let exit as ExitCode {
            throw exit
        } catch let error as ValidationError {
            throw error
        } catch let error as LocalFile.Failure where error.isBrokenPipe {
            // As if killed by SIGPIPE, which NIO ignores process-wide: quietly, like `cat | head`.
            throw ExitCode(CLIExitCode.failure.rawValue)
        } catch {
            let failure = CLIError(error)
            Console.error(failure.message)
            throw ExitCode(failure.exitCode.rawValue)
        }
    }
}

extension CLIError {
    /// The user-facing form of any error a command can meet.
    init(_ error: any Error) {
        switch error {
        case let error as CLIError:
            self = error
        case let error as InputError:
            self = .plain(.badRequest, error.message)
        case let error as LocalFile.Failure:
            self = .plain(.failure, error.message)
        case let error as BrokerClientError:
            self = CLIError(clientError: error)
        case is CancellationError:
            self = .plain(.failure, "cancelled")
        default:
            self = .plain(.failure, "unexpected error: \(error)")
        }
    }

    init(clientError: BrokerClientError) {
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
        case .connectionClosed(let socket):
            self = .plain(
                .upstream,
                "the response is incomplete: authbrokerd on \(socket) closed the connection before its end (the upstream may have cut it off); see the daemon's log (journalctl --user -u authbrokerd)"
            )
        case .protocolError(let reason):
            self = .plain(.upstream, "the daemon's answer is not valid HTTP/1.1 (\(reason)); is \(AuthBrokerCtl.version) the version of authbrokerd too?")
        case .responseTooLarge(let limit):
            self = .plain(.failure, "the daemon's answer is larger than \(limit / (1024 * 1024)) MiB; use --json and a filter, or report this as a bug")
        case .requestBody(let reason):
            self = .plain(.failure, "cannot send the request body: \(reason)")
        case .foreignListener(let listener):
            self = .plain(.failure, listener.message)
        }
    }
}

/// Typed control-API calls: a JSON request, a decoded answer or a rendered problem.
struct ControlAPI {
    let client: BrokerSocketClient

    /// Sends the request and decodes a 2xx answer; any other status becomes a `CLIError`
    /// rendered from the problem body, with `context` ("cannot add anchor") on its first line.
    func call<Answer: Decodable>(
        _ method: HTTPMethod, _ path: String, json: Data? = nil, context: String, as: Answer.Type
    ) async throws -> (answer: Answer, raw: ByteBuffer) {
        let response = try await client.control(method: method, path: path, json: json)
        return try Self.decode(response, method: method, path: path, context: context, as: Answer.self)
    }

    /// Decodes a 2xx answer, or throws the problem it carries as a `CLIError`.
    static func decode<Answer: Decodable>(
        _ response: ControlResponse, method: HTTPMethod, path: String, context: String, as: Answer.Type
    ) throws -> (answer: Answer, raw: ByteBuffer) {
        guard (200..<300).contains(response.status) else {
            if let problem = response.problem {
                throw CLIError(CLIExitCode.forProblem(problem), HumanFormat.problem(problem, context: context, now: Date()))
            }
            throw CLIError.plain(
                response.status < 500 ? .badRequest : .failure,
                "\(context): the daemon answered HTTP \(response.status) \(response.head.status.reasonPhrase) for \(method.rawValue) \(path); is authbrokerd version \(AuthBrokerCtl.version)?"
            )
        }
        do {
            let answer = try BrokerJSON.decoder().decode(Answer.self, from: Data(response.body.readableBytesView))
            return (answer, response.body)
        } catch {
            throw CLIError.plain(
                .failure,
                "\(context): the daemon's answer to \(method.rawValue) \(path) could not be read (\(error)); is authbrokerd version \(AuthBrokerCtl.version)?"
            )
        }
    }
}

extension Encodable {
    /// This value in the control API's JSON dialect.
    func brokerJSON() throws -> Data { try BrokerJSON.encoder().encode(self) }
}
