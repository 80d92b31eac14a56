import ArgumentParser
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// The environment that sends unmodified programs through the daemon's proxy port: the proxy
/// variables in both cases (curl reads `http_proxy` only in lower case; Go, Python and Java
/// tools read either), and loopback hosts left direct.
package enum ProxyEnvironment {
    /// Hosts programs reach directly: services on this machine need no broker.
    package static let direct = "localhost,127.0.0.1,::1"

    /// The variables, in the order `env` prints them, for the proxy at `address`
    /// (`127.0.0.1:21000`).
    package static func variables(proxy address: String) -> [(name: String, value: String)] {
        let url = "http://\(address)"
        return [
            ("http_proxy", url), ("https_proxy", url), ("HTTP_PROXY", url), ("HTTPS_PROXY", url),
            ("no_proxy", Self.direct), ("NO_PROXY", Self.direct),
        ]
    }

    /// The shells `env` writes for.
    package enum Shell: String, ExpressibleByArgument, CaseIterable, Sendable {
        case sh, fish

        /// One assignment; values are single-quoted (fish and POSIX shells agree on `'...'`
        /// with no escapes inside, and the values hold no quote).
        package func export(_ name: String, _ value: String) -> String {
            switch self {
            case .sh: "export \(name)='\(value)'"
            case .fish: "set -gx \(name) '\(value)'"
            }
        }
    }

    /// The proxy port's first address from `/v1/status`, or an error that says what to do.
    static func proxyAddress(_ api: ControlAPI) async throws -> String {
        let (report, _) = try await api.call("GET", "/v1/status", context: "cannot read the daemon's proxy port", as: StatusReport.self)
        guard let proxyPort = report.proxyPort else {
            throw CLIError(
                .failure,
                "authbrokerctl: this authbrokerd (\(report.version)) has no proxy port; update it and restart it (`systemctl --user restart authbrokerd.service`)."
            )
        }
        guard let first = proxyPort.first else {
            throw CLIError(
                .failure,
                "authbrokerctl: the daemon's proxy port is off ([proxy] listen = [] in its config file); remove that line, or name a loopback address, and restart the daemon."
            )
        }
        return first
    }
}

/// `authbrokerctl env`.
struct Env: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the environment that sends programs through the daemon's proxy port.",
        discussion: """
            Prints shell assignments of http_proxy, https_proxy (and their upper-case forms) \
            naming the daemon's proxy port, and no_proxy for this machine's own addresses. \
            Programs that honour them (curl, wget, git, pip, Python requests, Go and Node \
            tools) then reach http:// servers through the broker, which answers their 401s \
            from stored passwords, and https:// servers through a tunnel.

            Examples:
              eval "$(authbrokerctl env)"
              authbrokerctl env --shell fish | source
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @Option(help: "The shell to write for: sh (bash, zsh, dash) or fish.") var shell: ProxyEnvironment.Shell = .sh

    func run() async throws {
        try await CommandRunner.run {
            let address = try await ProxyEnvironment.proxyAddress(ControlAPI(client: try connection.client()))
            let lines = ProxyEnvironment.variables(proxy: address).map { shell.export($0.name, $0.value) }
            Console.out(lines.joined(separator: "\n"))
        }
    }
}

/// `authbrokerctl run -- CMD ARGS...`.
struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a program with its HTTP(S) traffic sent through the daemon's proxy port.",
        discussion: """
            Sets the variables `authbrokerctl env` prints and replaces itself with the program, \
            which keeps authbrokerctl's pid, standard streams and exit status.

            Examples:
              authbrokerctl run -- curl http://intranet.corp.test/report
              authbrokerctl run -- git clone https://git.corp.test/team/repo.git
              authbrokerctl run -- pip download --no-deps example-package

            Exits 127 when the program cannot be found or run.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @Argument(parsing: .captureForPassthrough, help: "The program and its arguments, after --.")
    var command: [String] = []

    func run() async throws {
        try await CommandRunner.run {
            var command = self.command
            if command.first == "--" { command.removeFirst() }
            guard let program = command.first, !program.isEmpty else {
                throw ValidationError("name the program to run after --, e.g. `authbrokerctl run -- curl http://intranet.test/`")
            }
            let address = try await ProxyEnvironment.proxyAddress(ControlAPI(client: try connection.client()))
            for (name, value) in ProxyEnvironment.variables(proxy: address) {
                setenv(name, value, 1)
            }
            let arguments = command.map { strdup($0) } + [nil]
            execvp(program, arguments)
            // Only reached when the program could not be started.
            let reason = String(cString: strerror(errno))
            throw CLIError(.cannotRun, "authbrokerctl: cannot run \(program): \(reason). Check the name and that it is on PATH.")
        }
    }
}
