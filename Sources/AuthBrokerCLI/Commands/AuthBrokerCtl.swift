import ArgumentParser
import AuthBrokerCore
import CAuthBrokerSystem

/// `authbrokerctl`: the command tree. `Sources/authbrokerctl/main.swift` only runs it.
package struct AuthBrokerCtl: AsyncParsableCommand {
    package static let version = AuthBrokerVersion.current

    package static let configuration = CommandConfiguration(
        commandName: "authbrokerctl",
        abstract: "Control authbrokerd, the per-user HTTP(S) fetching and trust daemon.",
        discussion: """
            Every command talks to the daemon over its Unix socket (see --socket). Output is \
            for people; commands that print daemon data take --json for scripts.

            Examples:
              authbrokerctl status
              authbrokerctl fetch https://git.internal.test/api/health
              authbrokerctl anchors trust-server https://nas.internal.test:8443/
              authbrokerctl anchors add corp-root.pem --hosts '*.corp.test'
              authbrokerctl passwords add https://git.corp.test --user alice
              authbrokerctl run -- git clone https://git.corp.test/team/repo.git

            Exit codes: 0 ok, 1 other error, 3 daemon not running, 4 server certificate not \
            trusted, 5 cannot reach the server (DNS, refused, timeout), 6 upstream or protocol \
            error, 7 request rejected as invalid, 8 no such anchor, pin or password, 22 HTTP error with \
            fetch --fail, 64 bad command line, 127 run could not start the program.
            """,
        version: AuthBrokerVersion.current,
        subcommands: [Status.self, Fetch.self, Env.self, Run.self, Anchors.self, Pins.self, Exceptions.self, Passwords.self, Identities.self, LocalCACommand.self, Reload.self, Flows.self, CacheCommand.self, Offline.self, Challenges.self, Agent.self]
    )

    package init() {}
}

extension AuthBrokerCtl {
    /// Parses the process's arguments and runs the chosen command, then exits.
    ///
    /// The executable calls this rather than `main()` because top-level code resolves `main()`
    /// to the synchronous overload, which cannot run an async command tree.
    package static func runFromCommandLine() async {
        // It holds passwords (typed, revealed, answered for an agent) and exported keys: no core
        // file of it, whatever kills it (Ctrl-backslash at a prompt, kill -SEGV by another program).
        _ = cab_disable_core_files()
        await main(nil)
    }
}
