import ArgumentParser
import Foundation

/// `authbrokerctl status`.
struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show whether the daemon runs, and its version, socket, config and counters.",
        discussion: """
            Examples:
              authbrokerctl status
              authbrokerctl status --json | jq .counters.requests_total
              authbrokerctl status --socket /tmp/test/authbroker.sock

            Exits 3 when no daemon listens on the socket.
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await CommandRunner.run {
            let api = ControlAPI(client: try connection.client())
            let (report, raw) = try await api.call("GET", "/v1/status", context: "cannot get status", as: StatusReport.self)
            if output.json { Console.out(raw) } else { Console.out(HumanFormat.status(report)) }
        }
    }
}
