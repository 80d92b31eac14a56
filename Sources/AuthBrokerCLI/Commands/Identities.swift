import ArgumentParser
import AuthBrokerCore
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `authbrokerctl identities ...`: client certificates the daemon presents (mTLS).
struct Identities: AsyncParsableCommand {
    /// RFC 3986 unreserved characters: what a path segment carries as is (identity names are made of them).
    static let unreserved = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-._~"))

    static let configuration = CommandConfiguration(
        abstract: "Import, list, remove and export the client certificates the daemon presents to servers (mTLS).",
        discussion: """
            An identity is a certificate chain and its private key. The key goes into the \
            daemon's secret store and is used only inside the daemon. The daemon presents an \
            identity to the hosts its --hosts patterns name, or to any host when a request \
            names it with the header 'Authbroker-Identity: NAME'. Expired identities are never \
            presented.

            Examples:
              authbrokerctl identities import me.p12 --hosts '*.corp.test'
              authbrokerctl identities import --cert me.crt --key me.key --name laptop --hosts vpn.corp.test
              authbrokerctl identities list
              authbrokerctl identities remove laptop
              authbrokerctl identities export laptop -o laptop.p12
            """,
        subcommands: [List.self, Import.self, Remove.self, Export.self]
    )

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List client identities (name, subject, issuer, expiry, SHA-256 fingerprint, hosts).",
            discussion: "Examples:\n  authbrokerctl identities list\n  authbrokerctl identities list --json"
        )
        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (list, raw) = try await api.call("GET", "/v1/identities", context: "cannot list identities", as: IdentityList.self)
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.identitiesTable(list.identities)) }
            }
        }
    }

    struct Import: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Import a client identity from a PKCS#12 file, or from a PEM certificate chain and key.",
            discussion: """
                The PKCS#12 passphrase (or an encrypted PEM key's) is asked for on the terminal \
                without echo, or read from the first line of stdin with --passphrase-stdin.

                Examples:
                  authbrokerctl identities import me.p12 --hosts '*.corp.test'
                  printf '%s\\\\n' "$P12_PASS" | authbrokerctl identities import me.p12 --name ci --passphrase-stdin
                  authbrokerctl identities import --cert chain.pem --key key.pem --name laptop
                """
        )
        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        @Argument(help: ArgumentHelp("A PKCS#12 file (.p12, .pfx). Omit with --cert and --key.", valueName: "file.p12"))
        var file: String?

        @Option(help: "PEM certificate chain, leaf first (with --key).")
        var cert: String?

        @Option(help: "PEM private key (with --cert).")
        var key: String?

        @Option(help: "The identity's name (default: the file name without extension).")
        var name: String?

        @Option(
            name: .customLong("hosts"),
            help: ArgumentHelp("Host pattern to present it to. Repeatable or comma-separated. Default: only when a request names it.", valueName: "pattern")
        )
        var hosts: [String] = []

        @Flag(help: "Read the passphrase from the first line of stdin.")
        var passphraseStdin = false

        @Flag(help: "Replace an identity of the same name.")
        var replace = false

        func validate() throws {
            if file == nil, cert == nil || key == nil {
                throw ValidationError("give a PKCS#12 file, or both --cert and --key")
            }
            if file != nil, cert != nil || key != nil {
                throw ValidationError("give either a PKCS#12 file or --cert and --key, not both")
            }
            do { _ = try HostPatterns.parse(hosts) } catch let error as InputError { throw ValidationError(error.message) }
        }

        func run() async throws {
            try await CommandRunner.run {
                let patterns = try HostPatterns.parse(hosts)
                var request: ImportIdentityRequest
                if let file {
                    let data = try LocalFile.readAll(file, limit: 1 << 20)
                    var passphrase = try Self.passphrase(stdin: passphraseStdin, prompt: "Passphrase for \(file): ", required: true)
                    defer { for index in passphrase.indices { passphrase[index] = 0 } }
                    let stem = URL(fileURLWithPath: file).deletingPathExtension().lastPathComponent
                    request = ImportIdentityRequest(
                        name: name ?? stem, hosts: patterns, replace: replace, pkcs12Base64: data.base64EncodedString(),
                        passphrase: String(decoding: passphrase, as: UTF8.self)
                    )
                } else if let cert, let key {
                    let chain = try LocalFile.readAll(cert, limit: 1 << 20)
                    let keyData = try LocalFile.readAll(key, limit: 1 << 20)
                    let encrypted = String(decoding: keyData, as: UTF8.self).contains("ENCRYPTED")
                    var passphrase = encrypted ? try Self.passphrase(stdin: passphraseStdin, prompt: "Passphrase for \(key): ", required: true) : []
                    defer { for index in passphrase.indices { passphrase[index] = 0 } }
                    let stem = URL(fileURLWithPath: cert).deletingPathExtension().lastPathComponent
                    request = ImportIdentityRequest(
                        name: name ?? stem, hosts: patterns, replace: replace, certPEM: String(decoding: chain, as: UTF8.self),
                        keyPEM: String(decoding: keyData, as: UTF8.self),
                        passphrase: encrypted ? String(decoding: passphrase, as: UTF8.self) : nil
                    )
                } else {
                    throw CLIError.plain(.usage, "give a PKCS#12 file, or both --cert and --key")
                }
                let api = ControlAPI(client: try connection.client())
                let (imported, raw) = try await api.call(
                    "POST", "/v1/identities", json: try request.brokerJSON(), context: "cannot import identity", as: ImportedIdentity.self
                )
                request.passphrase = nil
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.importedIdentity(imported.identity)) }
            }
        }

        static func passphrase(stdin: Bool, prompt: String, required: Bool) throws -> [UInt8] {
            if stdin { return readLine(STDIN_FILENO) }
            guard let typed = Terminal.readSecret(prompt) else {
                throw CLIError.plain(.badRequest, "cannot import identity: there is no terminal to ask for the passphrase on; use --passphrase-stdin")
            }
            return typed
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a client identity and its key.",
            discussion: "Examples:\n  authbrokerctl identities remove laptop\n\nExits 8 when there is no such identity."
        )
        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions
        @Argument(help: "The identity's name.") var name: String

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let encoded = name.addingPercentEncoding(withAllowedCharacters: Identities.unreserved) ?? name
                let (removed, raw) = try await api.call(
                    "DELETE", "/v1/identities/\(encoded)", context: "cannot remove identity", as: RemovedIdentity.self
                )
                if output.json { Console.out(raw) } else { Console.out("Removed identity \(HumanFormat.sanitized(removed.removed.name)) and its key.") }
            }
        }
    }

    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write a client identity out as it was imported, after you prove you are you (PAM).",
            discussion: """
                Writes the PKCS#12 file (or the PEM key) that was imported, protected by the \
                passphrase it was imported with. Asks for your login password first.

                Examples:
                  authbrokerctl identities export laptop -o laptop.p12
                """
        )
        @OptionGroup var connection: ConnectionOptions
        @Argument(help: "The identity's name.") var name: String
        @Option(name: .shortAndLong, help: "Where to write it (created 0600; must not exist).") var output: String
        @Flag(help: "Answer PAM's password prompt from the first line of stdin.") var loginPasswordStdin = false

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let encoded = name.addingPercentEncoding(withAllowedCharacters: Identities.unreserved) ?? name
                let (exported, _) = try await api.call(
                    "POST", "/v1/identities/\(encoded)/export", json: Data("{}".utf8), context: "cannot export identity",
                    as: ExportedIdentity.self,
                    reauthenticate: { try await Reauthentication.run(api: api, passwordFromStdin: loginPasswordStdin) }
                )
                guard let data = Data(base64Encoded: exported.dataBase64) else {
                    throw CLIError.plain(.failure, "cannot export identity: the daemon's answer is not base64")
                }
                let descriptor = try LocalFile.createNew(output, mode: 0o600)
                defer { close(descriptor) }
                try LocalFile.writeAll(data, to: descriptor)
                let what = exported.format == "pkcs12" ? "the PKCS#12 file" : "the PEM certificate chain and key"
                let protection = exported.passphrase == nil
                    ? "The key in it is not encrypted (it was imported that way): keep the file private."
                    : "It is protected by the passphrase it was imported with."
                Console.out("Wrote \(what) of \(name) to \(output). \(protection)")
            }
        }
    }
}
