import ArgumentParser
import AuthBrokerClient
import AuthBrokerCore
import Foundation

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
            guard let settings = try BrokerSettings.load(path: path) else {
                // A file named on the command line must exist, as for authbrokerd: a typo would
                // otherwise reach another daemon's socket without a word.
                if config != nil { throw CLIError.plain(.failure, "the config file \(path) does not exist (check --config)") }
                return nil
            }
            return settings.daemon.socketPath
        } catch let error as CLIError {
            throw error
        } catch {
            throw CLIError.plain(.failure, "\(error) (to reach the daemon without reading the config file, name its socket after the command: authbrokerctl COMMAND --socket PATH)")
        }
    }

    /// The client library's client of the daemon at `socketPath()`.
    package func client() throws -> BrokerClient {
        var client = BrokerClient(socketPath: try socketPath())
        client.userAgent = "authbrokerctl/\(AuthBrokerCtl.version)"
        return client
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

/// Typed control-API calls through the client library: a JSON request, the daemon's answer
/// decoded into the CLI's models (and kept raw for `--json`), every failure a `CLIError`.
struct ControlAPI {
    let client: BrokerClient

    /// Sends the request and decodes its 2xx answer. A refusal becomes a `CLIError` rendered
    /// from the daemon's problem, with `context` ("cannot add anchor") on its first line.
    ///
    /// With `reauthenticate`, a `403 reauthentication_required` runs it (the PAM dialogue) and
    /// sends the request once more.
    func call<Answer: Decodable>(
        _ method: String, _ path: String, json: Data? = nil, context: String, as: Answer.Type,
        reauthenticate: (() async throws -> Void)? = nil
    ) async throws -> (answer: Answer, raw: Data) {
        let response = try await self.send(method, path, json: json, context: context, reauthenticate: reauthenticate)
        let data: Data
        do {
            data = try await response.body.collect(maxBytes: 16 * 1024 * 1024)
        } catch {
            throw CLIError(error, context: context, socketPath: client.socketPath)
        }
        do {
            return (try BrokerJSON.decoder().decode(Answer.self, from: data), data)
        } catch {
            throw CLIError.plain(
                .failure,
                "\(context): the daemon's answer to \(method) \(path) could not be read (\(error)); is authbrokerd version \(AuthBrokerCtl.version)?"
            )
        }
    }

    /// Sends the request and returns its 2xx answer as it arrives, the body still to read; a
    /// refusal is a `CLIError` as for `call`, and `reauthenticate` works as there.
    func send(
        _ method: String, _ path: String, json: Data? = nil, context: String, reauthenticate: (() async throws -> Void)? = nil
    ) async throws -> BrokerResponse {
        var reauthenticated = false
        while true {
            do {
                return try await client.sendControl(method: method, path: path, json: json)
            } catch let error as BrokerError where error.status == 403 && error.code == BrokerErrorCode.reauthenticationRequired.rawValue && !reauthenticated {
                guard let reauthenticate else { throw CLIError(error, context: context, socketPath: client.socketPath) }
                reauthenticated = true
                try await reauthenticate()
            } catch {
                throw CLIError(error, context: context, socketPath: client.socketPath)
            }
        }
    }

    /// Runs `body`, which uses `client`; a failure the library reports becomes a `CLIError` with
    /// `context`, anything else (a local file's failure) goes on as it is.
    func mappingErrors<T>(context: String, _ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let error as BrokerError {
            throw CLIError(error, context: context, socketPath: client.socketPath)
        } catch let error as BrokerClientError {
            throw CLIError(error, context: context, socketPath: client.socketPath)
        }
    }
}

extension Encodable {
    /// This value in the control API's JSON dialect.
    func brokerJSON() throws -> Data { try BrokerJSON.encoder().encode(self) }
}

extension BrokerResponseBody {
    /// Each line of the body as it arrives, without its newline: the daemon's event streams
    /// (`GET /v1/agent`, `GET /v1/flows?follow=true`) send one JSON object per line.
    func forEachLine(_ handle: ([UInt8]) async throws -> Void) async throws {
        var pending: [UInt8] = []
        for try await chunk in self {
            pending.append(contentsOf: chunk)
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                let line = Array(pending[..<newline])
                pending.removeSubrange(...newline)
                try await handle(line)
            }
        }
    }
}
