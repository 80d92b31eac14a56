import ArgumentParser
import AuthBrokerCore
import Foundation

/// `authbrokerctl exceptions ...`: exact-certificate exceptions.
struct Exceptions: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List, add and remove exact-certificate exceptions.",
        discussion: """
            An exception trusts exactly one certificate (by its SHA-256 fingerprint) when a \
            given host presents it as its own, although its chain does not verify (unknown \
            issuer, self-signed, expired, another name). Another certificate on that host, or \
            this one on another host, is not trusted by it; pins still apply. HOST is a host \
            pattern (nas.example.com, *.example.com, 192.0.2.7), optionally with a port \
            (nas.example.com:5001, [2001:db8::1]:8443); without a port, any port.

            'authbrokerctl agent' adds them too when you answer a server-trust challenge \
            with once (kept until the daemon stops; listed as 'once') or always.

            Examples:
              authbrokerctl exceptions list
              authbrokerctl exceptions add nas.home.arpa:5001 3A:1F:...:9C
              authbrokerctl exceptions add test.example.com 3A:1F:...:9C --expires 30d
              authbrokerctl exceptions remove nas.home.arpa:5001 3A:1F:...:9C
            """,
        subcommands: [List.self, Add.self, Remove.self]
    )

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List your exceptions, saved and for this run of the daemon.",
            discussion: """
                Examples:
                  authbrokerctl exceptions list
                  authbrokerctl exceptions list --json
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (list, raw) = try await api.call("GET", "/v1/exceptions", context: "cannot list exceptions", as: ExceptionList.self)
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.exceptionsTable(list.exceptions)) }
            }
        }
    }

    /// HOST[:PORT] and SHA256, the fingerprint checked before anything is sent (the daemon checks the host).
    struct ExceptionArguments: ParsableArguments {
        @Argument(help: ArgumentHelp("Host pattern, optionally with :port (nas.example.com:5001, *.example.com).", valueName: "host"))
        var host: String

        @Argument(help: ArgumentHelp("SHA-256 fingerprint of the server's certificate (hex, colons allowed).", valueName: "sha256"))
        var sha256: String

        func validate() throws {
            guard Fingerprint.normalizedHex(sha256) != nil else {
                throw ValidationError(
                    "'\(HumanFormat.sanitized(String(sha256.prefix(120))))' is not a SHA-256 fingerprint (64 hex digits, colons allowed)"
                )
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Trust exactly this certificate from this host (saved).",
            discussion: """
                Compare the fingerprint with one you got from the server's owner first: \
                'authbrokerctl anchors trust-server URL' shows what the server presents.

                With --expires the exception ends by itself after that long (90m, 12h, 30d, \
                2w), and is removed then; 'exceptions list' shows when. Adding the same \
                exception again with another --expires (or none) changes its expiry.

                Examples:
                  authbrokerctl exceptions add nas.home.arpa:5001 3A:1F:...:9C
                  authbrokerctl exceptions add staging.example.com 3A:1F:...:9C --expires 7d
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions
        @OptionGroup var exception: ExceptionArguments

        @Option(help: ArgumentHelp("End the exception after this long: 90m, 12h, 30d, 2w (default: never).", valueName: "lifetime"))
        var expires: String?

        func validate() throws {
            if let expires {
                do {
                    _ = try LifetimeText.seconds(expires)
                } catch {
                    throw ValidationError(HumanFormat.sanitized(error.message))
                }
            }
        }

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let request = try AddExceptionRequest(host: exception.host, sha256: exception.sha256, expires: expires).brokerJSON()
                let (added, raw) = try await api.call(
                    "POST", "/v1/exceptions", json: request, context: "cannot add the exception", as: AddedException.self
                )
                if output.json {
                    Console.out(raw)
                } else {
                    let until = added.exception.expiresAt.map { " until \(HumanFormat.timestamp($0))" } ?? ""
                    Console.out(
                        "Trusting the certificate \(HumanFormat.sanitized(added.exception.sha256)) from \(HumanFormat.sanitized(added.exception.target))\(until)"
                    )
                }
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove an exception (saved or once).",
            discussion: """
                HOST is written as 'exceptions list' shows it.

                Example:
                  authbrokerctl exceptions remove nas.home.arpa:5001 3A:1F:...:9C

                Exits 8 when there is no such exception.
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions
        @OptionGroup var exception: ExceptionArguments

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let path = "/v1/exceptions?host=\(QueryEncoding.encode(exception.host))&sha256=\(QueryEncoding.encode(exception.sha256))"
                let (removed, raw) = try await api.call("DELETE", path, context: "cannot remove the exception", as: RemovedException.self)
                if output.json {
                    Console.out(raw)
                } else {
                    Console.out(
                        "Removed the exception for \(HumanFormat.sanitized(removed.removed.sha256)) from \(HumanFormat.sanitized(removed.removed.target))"
                    )
                }
            }
        }
    }
}
