import ArgumentParser
import AuthBrokerCore
import Foundation

/// `authbrokerctl cache ...`: the HTTP cache all of the user's apps share.
struct CacheCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cache",
        abstract: "Show, list or empty the HTTP cache.",
        discussion: """
            With [cache] enabled = true in config.toml, responses that HTTP allows to be stored \
            (RFC 9111) are kept on disk and served again while fresh, revalidated with the origin \
            when stale, and served stale when the origin cannot be reached. A response to a \
            request that carried a password is stored only when the origin marks it public. \
            Responses carry Cache-Status (RFC 9211): `authbrokerd; hit` when the cache answered.

            One request can ask for less with a header: `Authbroker-Cache: refresh` (ask the \
            origin, store the answer), `no-store` (neither read nor store), `only-if-cached` \
            (never the network).

            Examples:
              authbrokerctl cache status
              authbrokerctl cache list
              authbrokerctl cache purge https://repo.example/index.json
              authbrokerctl cache clear
            """,
        subcommands: [Status.self, List.self, Purge.self, Clear.self],
        defaultSubcommand: Status.self
    )

    struct Status: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show whether the cache is on, where it is, and what it has done.",
            discussion: """
                Examples:
                  authbrokerctl cache status
                  authbrokerctl cache status --json | jq .hits
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (record, raw) = try await api.call("GET", "/v1/cache", context: "cannot read the cache's status", as: CacheStatusRecord.self)
                if output.json {
                    Console.out(raw)
                } else if let counters = record.counters, record.enabled {
                    Console.out(
                        "HTTP cache in \(HumanFormat.sanitized(record.directory ?? "?")): \(HumanFormat.cacheSummary(counters))"
                    )
                } else {
                    Console.out("The HTTP cache is off. Set enabled = true under [cache] in config.toml and restart the daemon.")
                }
            }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List the stored responses, most recently used first.",
            discussion: """
                Each line: fresh or stale, the status, the body's size, the age, the URL (and the \
                request fields it varies on).

                Examples:
                  authbrokerctl cache list
                  authbrokerctl cache list --json | jq -r '.entries[].url'
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        struct Answer: Decodable { var entries: [CacheEntryRecord] }

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (record, raw) = try await api.call("GET", "/v1/cache/entries", context: "cannot list the cache", as: Answer.self)
                if output.json {
                    Console.out(raw)
                    return
                }
                if record.entries.isEmpty {
                    Console.out("The cache is empty.")
                    return
                }
                for entry in record.entries {
                    let vary = (entry.vary ?? []).isEmpty ? "" : " (varies on \((entry.vary ?? []).joined(separator: ", ")))"
                    Console.out(
                        "\(entry.fresh ? "fresh" : "stale") \(entry.status) \(HumanFormat.byteSize(Int(clamping: entry.bodyBytes))) "
                            + "age \(HumanFormat.duration(Double(entry.ageSeconds))) \(HumanFormat.sanitized(entry.url))\(HumanFormat.sanitized(vary))"
                    )
                }
            }
        }
    }

    struct Purge: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove what is stored for one URL (every variant of it).",
            discussion: """
                Example:
                  authbrokerctl cache purge https://repo.example/index.json
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions
        @Argument(help: "The http:// or https:// URL, as the app asked for it.") var url: String

        struct Answer: Decodable { var removed: Int }

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let query = url.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
                let (record, raw) = try await api.call(
                    "DELETE", "/v1/cache/entries?url=\(query)", context: "cannot remove \(url) from the cache", as: Answer.self
                )
                if output.json {
                    Console.out(raw)
                } else {
                    Console.out(record.removed == 0 ? "Nothing was stored for \(url)." : "Removed \(record.removed) stored response(s) for \(url).")
                }
            }
        }
    }

    struct Clear: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove every stored response.",
            discussion: """
                Example:
                  authbrokerctl cache clear
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        struct Answer: Decodable { var removed: Int }

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (record, raw) = try await api.call("DELETE", "/v1/cache", context: "cannot clear the cache", as: Answer.self)
                if output.json { Console.out(raw) } else { Console.out("Removed \(record.removed) stored response(s).") }
            }
        }
    }
}

/// `authbrokerctl offline on|off`.
struct Offline: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Answer every request from the HTTP cache only (on), or use the network again (off).",
        discussion: """
            Offline, a request the cache holds a response for is answered from it, stale or not \
            (unless the origin said it must be revalidated); any other request gets a 504 \
            (`not_cached`), and a POST or other unsafe request a 503 (`offline`). Nothing goes to \
            the network. Offline mode lasts until `offline off` or the daemon restarts.

            Examples:
              authbrokerctl offline on
              authbrokerctl offline off
            """
    )

    enum State: String, ExpressibleByArgument, CaseIterable {
        case on, off
    }

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions
    @Argument(help: "on or off.") var state: State

    func run() async throws {
        try await CommandRunner.run {
            let api = ControlAPI(client: try connection.client())
            let body = try JSONSerialization.data(withJSONObject: ["offline": state == .on])
            let (record, raw) = try await api.call(
                "PUT", "/v1/cache/offline", json: body, context: "cannot turn offline mode \(state.rawValue)", as: CacheStatusRecord.self
            )
            if output.json {
                Console.out(raw)
            } else if record.counters?.offline == true {
                Console.out("Offline: requests are answered from the cache only (\(record.counters?.entries ?? 0) stored responses).")
            } else {
                Console.out("Online: requests go to the network again.")
            }
        }
    }
}
