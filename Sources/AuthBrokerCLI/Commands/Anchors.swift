import ArgumentParser
import AuthBrokerCore
import Foundation

/// `authbrokerctl anchors ...`: the user's own trust anchors.
struct Anchors: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List, add and remove your own trust anchors (CA or server certificates).",
        discussion: """
            An anchor is a certificate the daemon trusts in addition to the system's, \
            optionally only for some hosts (--hosts). Anchors are named by the SHA-256 of \
            the certificate; any unique prefix of 8 or more hex digits will do.

            Examples:
              authbrokerctl anchors list
              authbrokerctl anchors add corp-root.pem --hosts '*.corp.test'
              authbrokerctl anchors trust-server https://nas.internal.test:8443/
              authbrokerctl anchors remove 3f2a9c0d
            """,
        subcommands: [List.self, Add.self, Remove.self, TrustServer.self]
    )

    /// The anchors as they are now.
    static func current(_ api: ControlAPI) async throws -> [AnchorRecord] {
        try await api.call("GET", "/v1/anchors", context: "cannot list anchors", as: AnchorList.self).answer.anchors
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List your trust anchors.",
            discussion: """
                Examples:
                  authbrokerctl anchors list
                  authbrokerctl anchors list --json | jq -r '.anchors[].id'
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (list, raw) = try await api.call("GET", "/v1/anchors", context: "cannot list anchors", as: AnchorList.self)
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.anchorsTable(list.anchors, now: Date())) }
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Trust the certificate(s) in a PEM file.",
            discussion: """
                The file may hold several certificates; each becomes an anchor. Without \
                --hosts an anchor vouches for any host: prefer a scope.

                Examples:
                  authbrokerctl anchors add corp-root.pem --hosts '*.corp.test'
                  authbrokerctl anchors add lab.pem --hosts lab.test,'*.lab.test'
                  openssl s_client -connect nas.test:443 </dev/null | authbrokerctl anchors add - --hosts nas.test
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        @Argument(help: ArgumentHelp("PEM file with one or more certificates ('-' for stdin).", valueName: "file.pem"))
        var file: String

        @Option(
            name: .customLong("hosts"),
            help: ArgumentHelp(
                "Host pattern the anchor may vouch for (example.test, *.example.test, 192.0.2.1). Repeatable or comma-separated. Default: any host.",
                valueName: "pattern"
            )
        )
        var hosts: [String] = []

        /// PEM files are small; more than this is not a certificate file.
        static let maxPEMBytes = 1024 * 1024

        func validate() throws {
            do { _ = try HostPatterns.parse(hosts) } catch let error as InputError { throw ValidationError(error.message) }
        }

        func run() async throws {
            try await CommandRunner.run {
                let patterns = try HostPatterns.parse(hosts)
                let data = try LocalFile.readAll(file, limit: Self.maxPEMBytes)
                guard let pem = String(data: data, encoding: .utf8), pem.contains("-----BEGIN CERTIFICATE-----") else {
                    throw CLIError.plain(
                        .badRequest,
                        "\(file == "-" ? "stdin" : file) holds no PEM certificate (-----BEGIN CERTIFICATE-----); convert a DER file with `openssl x509 -inform der -in FILE -out FILE.pem`"
                    )
                }
                let api = ControlAPI(client: try connection.client())
                let request = try AddAnchorRequest(pem: pem, hosts: patterns).brokerJSON()
                // Adding an anchor that exists replaces its hosts: said, not done silently.
                let before = output.json ? [] : try await Anchors.current(api)
                let (list, raw) = try await api.call(
                    "POST", "/v1/anchors", json: request, context: "cannot add anchor", as: AnchorList.self
                )
                if output.json {
                    Console.out(raw)
                } else {
                    Console.out(
                        list.anchors.map { anchor in
                            HumanFormat.addedAnchor(anchor, now: Date(), previousHosts: before.first { $0.id == anchor.id }?.hosts)
                        }.joined(separator: "\n")
                    )
                }
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Stop trusting an anchor.",
            discussion: """
                Examples:
                  authbrokerctl anchors remove 3f2a9c0d7e41b8a5
                  authbrokerctl anchors remove 3F:2A:9C:0D

                Exits 8 when no anchor has that id, 7 when the prefix matches several.
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        @Argument(help: ArgumentHelp("The anchor's id, or a unique prefix of at least 8 hex digits.", valueName: "id"))
        var id: String

        func validate() throws {
            do { _ = try AnchorID.normalize(id) } catch let error as InputError { throw ValidationError(error.message) }
        }

        func run() async throws {
            try await CommandRunner.run {
                let hex = try AnchorID.normalize(id)
                let api = ControlAPI(client: try connection.client())
                let (removed, raw) = try await api.call(
                    "DELETE", "/v1/anchors/\(hex)", context: "cannot remove anchor \(hex)", as: RemovedAnchor.self
                )
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.removedAnchor(removed.removed)) }
            }
        }
    }

    struct TrustServer: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "trust-server",
            abstract: "Show the certificates a server presents and trust one of them.",
            discussion: """
                Connects to the server (TLS handshake only), shows each certificate it presents \
                and the daemon's verdict, then adds the chosen certificate as an anchor for the \
                URL's host (or --hosts). Without --fingerprint it chooses the topmost certificate \
                presented (for a self-signed server, its own) and asks on the terminal first; \
                with --fingerprint it trusts the presented certificate with that SHA-256 without \
                asking. Compare the fingerprint with one obtained another way (the server's \
                console, its admin) before you trust it.

                Examples:
                  authbrokerctl anchors trust-server https://nas.internal.test:8443/
                  authbrokerctl anchors trust-server https://nas.internal.test:8443/ \\
                      --fingerprint 5D:1C:...:9A --hosts nas.internal.test

                Exits 0 when the server is already trusted, 4 when --fingerprint matches no \
                presented certificate or the server is still untrusted afterwards.
                """
        )

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: "The https:// URL of the server.")
        var url: String

        @Option(
            help: ArgumentHelp(
                "Trust the presented certificate with this SHA-256 fingerprint (hex, colons optional), without asking.",
                valueName: "sha256"
            )
        )
        var fingerprint: String?

        @Option(
            name: .customLong("hosts"),
            help: ArgumentHelp(
                "Host pattern the new anchor may vouch for. Repeatable or comma-separated. Default: the URL's host only.",
                valueName: "pattern"
            )
        )
        var hosts: [String] = []

        @Flag(name: [.customShort("y"), .long], help: "Trust the topmost certificate without asking.")
        var yes = false

        func validate() throws {
            do {
                _ = try FetchTarget(parsing: url, allowedSchemes: [.https])
                _ = try HostPatterns.parse(hosts)
            } catch let error as InputError {
                throw ValidationError(error.message)
            }
            if let fingerprint, Fingerprint.normalizedHex(fingerprint) == nil {
                throw ValidationError(
                    "--fingerprint '\(HumanFormat.sanitized(fingerprint))' is not a SHA-256 fingerprint (64 hex digits, colons optional)"
                )
            }
        }

        func run() async throws {
            try await CommandRunner.run {
                let target = try FetchTarget(parsing: url, allowedSchemes: [.https])
                let explicitHosts = try HostPatterns.parse(hosts)
                let scope = explicitHosts.isEmpty ? [target.origin.host] : explicitHosts
                let server = target.origin.description
                let api = ControlAPI(client: try connection.client())

                let report = try await inspect(api, target)
                Console.out(HumanFormat.inspection(report, now: Date()))
                if report.trusted {
                    Console.out("\(server) is already trusted; nothing to do.")
                    return
                }
                let anchors = try await Anchors.current(api)
                let chosen: (pem: String, existing: AnchorRecord?)
                if let fingerprint, !report.chain.contains(where: { Fingerprint.matches($0.sha256, fingerprint) }),
                    let anchor = anchors.first(where: { Fingerprint.matches($0.certificate.sha256, fingerprint) }),
                    let pem = anchor.pem
                {
                    // The out-of-scope advice names an anchor the server need not present (its
                    // CA): that anchor is what gets this host.
                    Console.out("")
                    Console.out("Anchor to widen: \(HumanFormat.sanitized(anchor.certificate.subject)), scope \(HumanFormat.scope(anchor.hosts))")
                    chosen = (pem, anchor)
                } else {
                    let index = try chooseCertificate(report, server: server)
                    let certificate = report.chain[index]
                    Console.out("")
                    Console.out("Certificate to trust: [\(index)] \(HumanFormat.sanitized(certificate.subject))")
                    Console.out("  SHA-256:  \(HumanFormat.sanitized(certificate.sha256))")
                    Console.out(
                        explicitHosts.isEmpty
                            ? "  scope:    \(target.origin.host) only (pass --hosts to choose other hosts)"
                            : "  scope:    \(HumanFormat.scope(scope))"
                    )
                    if fingerprint == nil, !yes {
                        switch Terminal.confirm("Trust this certificate for \(HumanFormat.scope(scope))?") {
                        case nil:
                            throw CLIError.plain(
                                .failure,
                                "no terminal to ask on; check the SHA-256 above against one you got another way, then pass --fingerprint SHA256"
                            )
                        case false?:
                            throw CLIError.plain(.failure, "not trusted; nothing changed")
                        case true?:
                            break
                        }
                    }
                    guard let pems = report.chainPEM, pems.count == report.chain.count else {
                        throw CLIError.plain(
                            .failure,
                            "the daemon did not return the certificates' PEM (chain_pem); update authbrokerd to \(AuthBrokerCtl.version)"
                        )
                    }
                    chosen = (pems[index], anchors.first { $0.certificate.sha256 == certificate.sha256 })
                }
                // A certificate that is an anchor already (for other hosts: `anchor_out_of_scope`)
                // gets this host added to its hosts, never its hosts replaced by this one.
                let request = try AddAnchorRequest(pem: chosen.pem, hosts: scope, widen: true).brokerJSON()
                let (added, _) = try await api.call(
                    "POST", "/v1/anchors", json: request, context: "cannot add anchor", as: AnchorList.self
                )
                for anchor in added.anchors {
                    Console.out(HumanFormat.addedAnchor(anchor, now: Date(), previousHosts: chosen.existing?.hosts))
                }

                // An anchor fixes the issuer; it cannot fix a wrong name or an expired certificate.
                let after = try await inspect(api, target)
                if after.trusted {
                    Console.out("\(server) is now trusted.")
                } else {
                    let reasons = after.failures.map { "  - \(HumanFormat.sanitized($0.summary))" }
                    throw CLIError(
                        .untrustedServer,
                        (["authbrokerctl: the anchor was added, but \(server) is still not trusted:"] + reasons)
                            .joined(separator: "\n")
                    )
                }
            }
        }

        private func inspect(_ api: ControlAPI, _ target: FetchTarget) async throws -> InspectReport {
            let request = try InspectRequest(url: target.absoluteForm).brokerJSON()
            return try await api.call(
                "POST", "/v1/inspect", json: request, context: "cannot inspect \(target.origin.description)",
                as: InspectReport.self
            ).answer
        }

        /// The `--fingerprint` match, or the topmost certificate presented.
        private func chooseCertificate(_ report: InspectReport, server: String) throws -> Int {
            guard !report.chain.isEmpty else {
                throw CLIError.plain(.untrustedServer, "\(server) presented no certificate")
            }
            guard let fingerprint else { return report.chain.count - 1 }
            if let index = report.chain.firstIndex(where: { Fingerprint.matches($0.sha256, fingerprint) }) {
                return index
            }
            let presented = report.chain.enumerated().map { index, certificate in
                "  [\(index)] \(HumanFormat.sanitized(certificate.sha256))  \(HumanFormat.sanitized(certificate.subject))"
            }
            throw CLIError(
                .untrustedServer,
                (["authbrokerctl: \(server) presents no certificate with SHA-256 \(HumanFormat.sanitized(fingerprint)); it presents:"]
                    + presented + ["Nothing was changed."]).joined(separator: "\n")
            )
        }
    }
}
