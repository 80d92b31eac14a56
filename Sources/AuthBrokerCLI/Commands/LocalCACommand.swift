import ArgumentParser
import AuthBrokerCore
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `authbrokerctl ca ...`: the local CA the proxy port intercepts with.
struct LocalCACommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ca",
        abstract: "Show, export or rotate the local CA that intercepted https:// connections are signed by.",
        discussion: """
            Through the proxy port, https:// to a host you hold something for (an anchor, pin, \
            exception, client identity or password), or that [proxy] intercept names, is \
            intercepted: the program's TLS ends at the broker with a certificate this CA \
            signed for the host, and its requests go on with your trust, identities and \
            passwords. Programs started with `authbrokerctl run` (or after `eval "$(authbrokerctl env)"`) \
            trust it through a CA bundle; give it to others (a browser) with `ca export`.

            The CA is made on first need; its private key stays in the secret store and is \
            never exported.

            Examples:
              authbrokerctl ca show
              authbrokerctl ca export -o authbroker-ca.pem
              authbrokerctl ca rotate
            """,
        subcommands: [Show.self, Export.self, Rotate.self]
    )

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the local CA's certificate and where its files are.",
            discussion: """
                Examples:
                  authbrokerctl ca show
                  authbrokerctl ca show --json | jq -r .bundle_file
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (record, raw) = try await api.call("GET", "/v1/ca", context: "cannot read the local CA", as: LocalCARecord.self)
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.localCA(record, now: Date())) }
            }
        }
    }

    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write the local CA's certificate (PEM), for a program to trust.",
            discussion: """
                Only the certificate: the key never leaves the secret store.

                Examples:
                  authbrokerctl ca export > authbroker-ca.pem
                  authbrokerctl ca export -o ~/authbroker-ca.pem
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @Option(name: .shortAndLong, help: "Where to write it (must not exist); standard output without it.") var output: String?

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (record, _) = try await api.call("GET", "/v1/ca", context: "cannot read the local CA", as: LocalCARecord.self)
                guard let output else {
                    Console.out(record.pem.hasSuffix("\n") ? String(record.pem.dropLast()) : record.pem)
                    return
                }
                let descriptor = try LocalFile.createNew(output, mode: 0o644)
                defer { close(descriptor) }
                try LocalFile.writeAll(Array(record.pem.utf8), to: descriptor)
                Console.out("Wrote the local CA certificate (SHA-256 \(record.certificate.sha256)) to \(output).")
            }
        }
    }

    struct Rotate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Replace the local CA with a new one.",
            discussion: """
                Programs started with `authbrokerctl run` or `env` read the new CA from the same \
                bundle file at their next start; a program you gave the old certificate to (a \
                browser) needs the new one (`authbrokerctl ca export`). Intercepted connections \
                already open keep their certificate until they close.

                Example:
                  authbrokerctl ca rotate
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (record, raw) = try await api.call("POST", "/v1/ca/rotate", context: "cannot rotate the local CA", as: LocalCARecord.self)
                if output.json {
                    Console.out(raw)
                } else {
                    Console.out("Made a new local CA.\n" + HumanFormat.localCA(record, now: Date()))
                }
            }
        }
    }
}

extension HumanFormat {
    /// What `ca show` prints.
    package static func localCA(_ record: LocalCARecord, now: Date) -> String {
        var lines = ["Local CA:"]
        lines += self.certificate(record.certificate, index: 0, now: now)
        lines.append("Certificate file: \(sanitized(record.certificateFile))")
        lines.append("CA bundle (system anchors and this CA): \(sanitized(record.bundleFile))")
        var minted = "Leaves minted since the daemon started: \(record.leavesMinted)"
        if let total = record.mintingMicroseconds, record.leavesMinted > 0 {
            minted += " (\(total / record.leavesMinted) µs each on average)"
        }
        lines.append(minted)
        return lines.joined(separator: "\n")
    }
}
