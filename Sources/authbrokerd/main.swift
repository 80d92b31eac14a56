import ArgumentParser
import AuthBrokerCore
import AuthBrokerDaemon
import Foundation
import Logging

/// `authbrokerd`: the per-user authentication-challenge broker daemon.
@main
struct AuthBrokerDaemonCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "authbrokerd",
        abstract: "Fetch HTTP(S) for local apps over a Unix socket, answering TLS trust with your own anchors.",
        discussion: """
            Runs in the foreground and logs to stderr, as systemd expects. Normally started by
            systemd (`systemctl --user enable --now authbrokerd.socket`).

            Socket: --socket, else $AUTHBROKER_SOCKET, else [daemon] socket_path in the config,
            else $XDG_RUNTIME_DIR/authbroker/authbroker.sock, else /tmp/authbroker-$UID/authbroker.sock.
            Config: --config, else $AUTHBROKER_CONFIG, else $XDG_CONFIG_HOME/authbroker/config.toml
            (~/.config/authbroker/config.toml); every setting is documented in etc/authbroker/config.toml.
            """,
        version: AuthBrokerVersion.current
    )

    @Option(name: .long, help: ArgumentHelp("Listen on this Unix socket path.", valueName: "path"))
    var socket: String?

    @Option(name: .long, help: ArgumentHelp("Read settings from this file (it must exist).", valueName: "path"))
    var config: String?

    @Option(
        name: .long,
        help: ArgumentHelp("Log level: trace, debug, info, notice, warning, error, critical.", valueName: "level")
    )
    var logLevel: String?

    func validate() throws {
        if let logLevel, Logger.Level(rawValue: logLevel) == nil {
            throw ValidationError("unknown log level '\(logLevel)'; use trace, debug, info, notice, warning, error or critical.")
        }
    }

    func run() async throws {
        do {
            try await BrokerDaemon.run(
                DaemonOptions(socketPath: self.socket, configPath: self.config, logLevel: self.logLevel.flatMap(Logger.Level.init(rawValue:)))
            )
        } catch {
            FileHandle.standardError.write(Data((error.description + "\n").utf8))
            throw ExitCode(error.exitCode)
        }
    }
}
