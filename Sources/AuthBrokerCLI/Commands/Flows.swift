import ArgumentParser
import AuthBrokerClient
import AuthBrokerCore
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `authbrokerctl flows ...`: the requests the daemon served recently, live or as HAR.
struct Flows: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Watch the requests the broker serves, or export them as HAR.",
        discussion: """
            The daemon keeps the last [flows] keep requests (500 by default) in memory: \
            method, URL, status, size, time, which program sent it, and which stored \
            credential, client identity or rule the broker applied. It starts recording \
            the first time you run a flows command (or at its start, with [flows] record \
            = "always"). Authorization, \
            Proxy-Authorization, Cookie and Set-Cookie values are masked in everything \
            it shows, unless you prove you are you (your login password, through PAM) \
            and ask for them.

            Examples:
              authbrokerctl flows
              authbrokerctl flows --last 50 --no-follow
              authbrokerctl flows export --har flows.har
            """,
        subcommands: [Watch.self, Export.self],
        defaultSubcommand: Watch.self
    )

    struct Watch: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Show the recent requests, then each one as it ends (the default).",
            discussion: """
                One line per request: when it started, the program, method and URL, status, \
                response size, time taken, then what the broker did (credential, identity, \
                rule, interception) and its error code if it answered with one. Status 0 \
                means no response reached the program. Ctrl-C stops.

                Examples:
                  authbrokerctl flows
                  authbrokerctl flows --last 0
                  authbrokerctl flows --no-follow --json | jq 'select(.status >= 400)'
                """
        )

        @OptionGroup var connection: ConnectionOptions

        @Option(help: "How many of the recent requests to show first.")
        var last = 20

        @Flag(help: "Show the recent requests and exit instead of following new ones.")
        var noFollow = false

        @Flag(help: "Print each request as the daemon's JSON object, one per line.")
        var json = false

        func validate() throws {
            guard self.last >= 0 else { throw ValidationError("--last takes a count of requests (0 or more).") }
        }

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                if noFollow {
                    let (list, _) = try await api.call(
                        "GET", "/v1/flows?last=\(last)", context: "cannot read the flows", as: FlowList.self
                    )
                    for flow in list.flows { try self.show(flow) }
                    if list.recordingStarted == true {
                        Console.error(
                            "The daemon records requests from now on ([flows] record = \"on_demand\"); earlier ones were not kept. Set record = \"always\" to keep them from its start."
                        )
                    }
                    return
                }
                try await api.mappingErrors(context: "cannot follow the flows") {
                    let stream = try await api.client.sendControl(method: "GET", path: "/v1/flows?follow=true&last=\(last)")
                    try await stream.body.forEachLine { line in
                        guard let flow = try? BrokerJSON.decoder().decode(FlowSummary.self, from: Data(line)) else { return }
                        try self.show(flow)
                    }
                }
                Console.error("the daemon ended the flow stream")
            }
        }

        private func show(_ flow: FlowSummary) throws {
            if json {
                Console.out(String(decoding: try flow.brokerJSON(), as: UTF8.self))
            } else {
                Console.out(HumanFormat.flow(flow))
            }
        }
    }

    struct Export: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Write the recent requests as an HTTP Archive (HAR 1.2).",
            discussion: """
                Browsers' developer tools and HAR viewers open the file. Secret header values \
                (Authorization, Proxy-Authorization, Cookie, Set-Cookie, and [flows] \
                mask_headers) are masked; --reveal-secrets keeps them, after the daemon \
                checks your login password through PAM. Bodies are in it only when the \
                daemon keeps them ([flows] bodies = true); they are never masked.

                The file is created mode 0600 and must not exist yet; `--har -` writes to \
                standard output.

                Examples:
                  authbrokerctl flows export --har flows.har
                  authbrokerctl flows export --har - --last 10 | jq '.log.entries[].request.url'
                  authbrokerctl flows export --har debug.har --reveal-secrets
                """
        )

        @OptionGroup var connection: ConnectionOptions

        @Option(help: ArgumentHelp("Where to write the HAR file; - for standard output.", valueName: "file"))
        var har: String

        @Option(help: "Only the last N requests (all that are kept without it).")
        var last: Int?

        @Flag(help: "Keep the secret header values as they were (asks for your login password).")
        var revealSecrets = false

        @Flag(help: "Answer PAM's password prompt with the first line of stdin instead of asking on the terminal.")
        var loginPasswordStdin = false

        func validate() throws {
            if let last, last < 0 { throw ValidationError("--last takes a count of requests (0 or more).") }
            if self.har.isEmpty { throw ValidationError("--har needs a file name, or - for standard output.") }
        }

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                var path = "/v1/flows/har"
                var query: [String] = []
                if let last { query.append("last=\(last)") }
                if revealSecrets { query.append("reveal=true") }
                if !query.isEmpty { path += "?" + query.joined(separator: "&") }
                // Opened first: a name that is taken fails before the daemon is asked (and
                // before any PAM prompt).
                let descriptor: CInt
                if har == "-" {
                    descriptor = STDOUT_FILENO
                } else {
                    descriptor = try LocalFile.createNew(har, mode: 0o600)
                }
                var written = false
                defer {
                    if descriptor != STDOUT_FILENO {
                        close(descriptor)
                        if !written { unlink(har) }
                    }
                }
                let response = try await api.send(
                    "GET", path, context: "cannot export the flows",
                    reauthenticate: revealSecrets ? { try await Reauthentication.run(api: api, passwordFromStdin: loginPasswordStdin) } : nil
                )
                var bytes = 0
                try await api.mappingErrors(context: "cannot export the flows") {
                    for try await chunk in response.body {
                        try LocalFile.writeAll(chunk, to: descriptor)
                        bytes += chunk.count
                    }
                }
                written = true
                if descriptor != STDOUT_FILENO {
                    Console.error("Wrote \(HumanFormat.byteSize(bytes)) of HAR to \(har)\(revealSecrets ? " (secret header values not masked)" : "").")
                }
            }
        }
    }
}

/// `GET /v1/flows`.
struct FlowList: Decodable {
    var flows: [FlowSummary]
    /// This request started the recording (absent from daemons that always record).
    var recordingStarted: Bool?

    enum CodingKeys: String, CodingKey {
        case flows
        case recordingStarted = "recording_started"
    }
}

extension HumanFormat {
    /// One flow on one line: `12:03:04.512 curl[4242] GET https://x.test/a 200 1.2 kB 35 ms  credential alice`.
    package static func flow(_ flow: FlowSummary) -> String {
        var app = "-"
        if let known = flow.app {
            let name = known.executable.map { String($0.split(separator: "/").last ?? Substring($0)) } ?? "pid"
            app = "\(sanitized(name))[\(known.pid)]"
        }
        var line = [
            Self.clockTime(flow.started), app, sanitized(flow.method), sanitized(flow.url), String(flow.status),
            Self.byteSize(flow.bytes), Self.milliseconds(flow.durationMilliseconds),
        ].joined(separator: " ")
        var notes: [String] = []
        for credential in flow.applied.credentials {
            var note = "\(credential.proxy == true ? "proxy credential" : "credential") \(sanitized(credential.user))"
            note += " (\(sanitized(credential.scheme))"
            if let realm = credential.realm { note += ", realm \"\(sanitized(realm))\"" }
            notes.append(note + ")")
        }
        if let identity = flow.applied.identity { notes.append("identity \(sanitized(identity))") }
        if let rule = flow.applied.rule { notes.append(sanitized(rule)) }
        if let rewritten = flow.applied.rewrittenTo { notes.append("to \(sanitized(rewritten))") }
        if flow.applied.intercepted == true { notes.append("intercepted") }
        if let error = flow.error { notes.append("error \(sanitized(error))") }
        if !notes.isEmpty { line += "  " + notes.joined(separator: ", ") }
        return line
    }

    /// `12:03:04.512`, local time.
    static func clockTime(_ date: Date) -> String {
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "HH:mm:ss.SSS"
        return formatter.string(from: date)
    }

    /// `512 B`, `1.2 kB`, `3.4 MB` (powers of 1000, as `ls -h --si` shows them).
    package static func byteSize(_ bytes: Int) -> String {
        if bytes < 1000 { return "\(bytes) B" }
        let units = ["kB", "MB", "GB", "TB"]
        var value = Double(bytes) / 1000
        var unit = 0
        while value >= 999.95, unit < units.count - 1 {
            value /= 1000
            unit += 1
        }
        return String(format: "%.1f", value) + " " + units[unit]
    }

    static func milliseconds(_ value: Double) -> String {
        value < 10 ? String(format: "%.1f ms", value) : String(format: "%.0f ms", value)
    }
}
