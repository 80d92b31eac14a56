import ArgumentParser
import AuthBrokerCore
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
    /// (`127.0.0.1:21000`) and, when they can be had, the local CA and wget's startup file.
    package static func variables(proxy address: String, ca: CAFiles?, wgetrc: String? = nil) -> [(name: String, value: String)] {
        let url = "http://\(address)"
        var variables = [
            ("http_proxy", url), ("https_proxy", url), ("HTTP_PROXY", url), ("HTTPS_PROXY", url),
            ("no_proxy", Self.direct), ("NO_PROXY", Self.direct),
        ]
        if let ca {
            variables += Self.bundleVariables.map { ($0, ca.bundle) } + Self.addedCAVariables.map { ($0, ca.certificate) }
        }
        if let wgetrc {
            variables.append(("WGETRC", wgetrc))
        }
        return variables
    }

    /// The variables for this daemon: the proxy's address, the CA files and wget's startup file
    /// (written here). A CA that cannot be had is a warning on standard error (https:// is then
    /// tunnelled only where it is not intercepted), not a failure; so is a wgetrc that cannot be.
    static func variables(_ api: ControlAPI) async throws -> [(name: String, value: String)] {
        let proxy = try await Self.proxyAddress(api)
        let ca: CAFiles
        do {
            let (record, _) = try await api.call("GET", "/v1/ca", context: "cannot read the local CA", as: LocalCARecord.self)
            ca = CAFiles(bundle: record.bundleFile, certificate: record.certificateFile)
        } catch let error as CLIError {
            Console.error(
                "\(error.message)\nauthbrokerctl: warning: no CA bundle variables set; programs will not trust https:// hosts the broker intercepts."
            )
            return Self.variables(proxy: proxy, ca: nil)
        }
        return Self.variables(proxy: proxy, ca: ca, wgetrc: Self.writeWgetStartupFile(bundle: ca.bundle))
    }

    /// Writes wget's startup file beside `bundle` (see `WgetStartupFile`: named after its
    /// content) and returns its path, or nil, with a warning that says why and what to do, when
    /// it cannot be written. Then removes the files of ours nobody was handed for a while.
    static func writeWgetStartupFile(bundle: String) -> String? {
        let directory = AtomicFile.directory(of: bundle)
        let environment = ProcessInfo.processInfo.environment
        let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? getpwuid(getuid()).flatMap { $0.pointee.pw_dir.map { String(cString: $0) } }
        func skip(_ reason: String) -> String? {
            Console.error("authbrokerctl: warning: WGETRC not set, so wget will not trust https:// hosts the broker intercepts: \(reason)")
            return nil
        }
        var settings: String?
        if let source = WgetStartupFile.userFile(environment: environment, home: home, brokerDirectory: directory),
            environment["WGETRC"] == source || FileManager.default.fileExists(atPath: source)
        {
            let named = environment["WGETRC"] == source
            do {
                let data = try LocalFile.readRegularFile(source, limit: 1 << 20, what: "a wget startup file")
                settings = String(decoding: data, as: UTF8.self)
            } catch let failure as LocalFile.Failure {
                let remedy =
                    named
                    ? "Set WGETRC to a readable wget startup file (a regular file), or unset it to use ~/.wgetrc."
                    : "Make it a readable wget startup file (a regular file), or move it away."
                return skip("\(failure.message). \(remedy)")
            } catch {
                return skip("cannot read \(source): \(error).")
            }
        }
        guard let content = WgetStartupFile.content(userSettings: settings, caBundle: bundle) else {
            return skip("the CA bundle's path (\(bundle)) holds a line break; set state_dir to a plainer path.")
        }
        let name = WgetStartupFile.fileName(content: content)
        let path = directory + "/" + name
        let bytes = Array(content.utf8)
        // Unchanged (the usual case): no rewrite, no fsync; touched, so the sweep below counts
        // from the last time a caller was handed it.
        if let existing = try? PrivateFiles.readOwnedFile(path, what: "wget's startup file", maxBytes: bytes.count, forbiddenModeBits: 0o077),
            existing == bytes
        {
            _ = utimensat(AT_FDCWD, path, nil, 0)
        } else {
            do {
                try AtomicFile.write(bytes, to: path)
            } catch {
                return skip("cannot write \(path) (\(error.description)). Check that the directory is yours and writable.")
            }
        }
        Self.removeStaleWgetStartupFiles(in: directory, keeping: name)
        return path
    }

    /// Best effort, and cheap (one directory listing): removes the startup files of ours (by
    /// name, regular, the user's) that no `env` or `run` has handed out for
    /// `WgetStartupFile.unusedLifetimeSeconds`. Each different ~/.wgetrc leaves one, so without
    /// this they would pile up. A shell still naming one that old gets wget's "WGETRC points
    /// to ..." error, and running `env` again mends it.
    static func removeStaleWgetStartupFiles(in directory: String, keeping current: String) {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return }
        let now = Int64(time(nil))
        for name in names where WgetStartupFile.isBrokerFileName(name[...]) && name != current {
            let path = directory + "/" + name
            var info = stat()
            guard lstat(path, &info) == 0, (info.st_mode & S_IFMT) == S_IFREG, info.st_uid == getuid() else { continue }
            if WgetStartupFile.isStale(name: name, current: current, ageSeconds: now - Int64(info.st_mtim.tv_sec)) {
                unlink(path)
            }
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
            plus the broker's local CA; NODE_EXTRA_CA_CERTS: the local CA), and WGETRC: a \
            startup file for wget, written beside the bundle, holding your ~/.wgetrc (less its \
            passwords, Authorization headers and proxy passwords) and ca_certificate. \
            Programs that honour them (curl, wget, git, pip, Python requests, Go tools) then reach \
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
            let variables = try await ProxyEnvironment.variables(ControlAPI(client: try connection.client()))
            let lines = variables.map { shell.export($0.name, $0.value) }
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
            for (name, value) in try await ProxyEnvironment.variables(ControlAPI(client: try connection.client())) {
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
