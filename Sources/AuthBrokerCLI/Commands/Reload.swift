import ArgumentParser
import Foundation

/// `authbrokerctl reload`.
struct Reload: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Read the config file again and put its rules in place.",
        discussion: """
            The rules are [[route]], [[respond]], [[rewrite]] and [proxy] intercept and tunnel; other settings \
            take effect when the daemon restarts (this says so when they changed). A file with an \
            error changes nothing: the error names its line, and the rules in use stay. The same \
            as `systemctl --user reload authbrokerd` or sending the daemon SIGHUP.

            Examples:
              authbrokerctl reload
              authbrokerctl reload --json
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await CommandRunner.run {
            let api = ControlAPI(client: try connection.client())
            let (record, raw) = try await api.call("POST", "/v1/reload", context: "cannot reload the config file", as: ReloadRecord.self)
            if output.json {
                Console.out(raw)
                return
            }
            var text = "Reloaded: \(record.routes) [[route]], \(record.responses) [[respond]], \(record.rewrites) [[rewrite]]."
            if record.restartNeeded {
                text += "\nOther settings changed too; they take effect when the daemon restarts (`systemctl --user restart authbrokerd`)."
            }
            Console.out(text)
        }
    }
}
