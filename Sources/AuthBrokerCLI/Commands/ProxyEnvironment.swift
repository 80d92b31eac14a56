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

    /// Where programs find the local CA: intercepted https:// hosts present its leaves.
    package struct CAFiles: Sendable, Equatable {
        /// The system anchors and the local CA.
        package var bundle: String
        /// The local CA alone.
        package var certificate: String

        package init(bundle: String, certificate: String) {
            self.bundle = bundle
            self.certificate = certificate
        }
    }

    /// The variables that replace a program's CA bundle (so each holds the system anchors too):
    /// OpenSSL's default (Python, Ruby, Go on Linux), Python requests, curl, git, pip, cargo,
    /// the AWS CLI.
    package static let bundleVariables = [
        "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT", "CARGO_HTTP_CAINFO",
        "AWS_CA_BUNDLE",
    ]
    /// The variables that add to a program's own roots: Node.js (npm, yarn).
    package static let addedCAVariables = ["NODE_EXTRA_CA_CERTS"]

    /// The variables, in the order `env` prints them, for the proxy at `address`
    /// (`127.0.0.1:21000`) and, when it can be had, the local CA.
    package static func variables(proxy address: String, ca: CAFiles?) -> [(name: String, value: String)] {
        let url = "http://\(address)"
        var variables = [
            ("http_proxy", url), ("https_proxy", url), ("HTTP_PROXY", url), ("HTTPS_PROXY", url),
            ("no_proxy", Self.direct), ("NO_PROXY", Self.direct),
        ]
        if let ca {
            variables += Self.bundleVariables.map { ($0, ca.bundle) } + Self.addedCAVariables.map { ($0, ca.certificate) }
        }
        return variables
    }

    /// The proxy's address and the CA files; a CA that cannot be had is a warning on standard
    /// error (https:// is then tunnelled only where it is not intercepted), not a failure.
    static func settings(_ api: ControlAPI) async throws -> (proxy: String, ca: CAFiles?) {
        let proxy = try await Self.proxyAddress(api)
        do {
            let (record, _) = try await api.call("GET", "/v1/ca", context: "cannot read the local CA", as: LocalCARecord.self)
            return (proxy, CAFiles(bundle: record.bundleFile, certificate: record.certificateFile))
        } catch let error as CLIError {
            Console.error(
                "\(error.message)\nauthbrokerctl: warning: no CA bundle variables set; programs will not trust https:// hosts the broker intercepts."
            )
            return (proxy, nil)
        }
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
            naming the daemon's proxy port, no_proxy for this machine's own addresses, and the \
            CA bundle variables (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, \
            GIT_SSL_CAINFO, PIP_CERT, CARGO_HTTP_CAINFO, AWS_CA_BUNDLE: the system anchors \
            plus the broker's local CA; NODE_EXTRA_CA_CERTS: the local CA). Programs that \
            honour them (curl, wget, git, pip, Python requests, Go and Node tools) then reach \
            http:// servers through the broker, which answers their 401s from stored \
            passwords, and https:// servers through it too: intercepted (see `authbrokerctl ca`) \
            where you hold something for the host, a tunnel elsewhere.

            Examples:
              eval "$(authbrokerctl env)"
              authbrokerctl env --shell fish | source
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @Option(help: "The shell to write for: sh (bash, zsh, dash) or fish.") var shell: ProxyEnvironment.Shell = .sh

    func run() async throws {
        try await CommandRunner.run {
            let (address, ca) = try await ProxyEnvironment.settings(ControlAPI(client: try connection.client()))
            let lines = ProxyEnvironment.variables(proxy: address, ca: ca).map { shell.export($0.name, $0.value) }
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
            let (address, ca) = try await ProxyEnvironment.settings(ControlAPI(client: try connection.client()))
            for (name, value) in ProxyEnvironment.variables(proxy: address, ca: ca) {
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
