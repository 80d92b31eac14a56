import ArgumentParser
import AuthBrokerClient
import AuthBrokerCore
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// `authbrokerctl passwords ...`: the passwords the daemon answers Basic and Digest challenges with.
struct Passwords: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Add, list and remove the passwords the daemon answers HTTP Basic/Digest challenges with.",
        discussion: """
            A password belongs to an origin (scheme, host, port) and optionally a realm; the \
            daemon answers that origin's Basic and Digest challenges with it, so apps never see \
            the 401. Passwords are read from the terminal without echo, or from stdin with \
            --password-stdin: never from the command line.

            A password is kept in the secret store (GNOME Keyring, or the broker's encrypted \
            file) and survives a restart; --session keeps it in the daemon's memory only, until \
            it stops. 'passwords list' shows which.

            A password the server refuses is marked failed and not sent again until you \
            replace it (so a wrong password cannot lock your account).

            Examples:
              authbrokerctl passwords add https://git.corp.test --user alice
              printf '%s\\n' "$PW" | authbrokerctl passwords add https://api.corp.test --user ci --realm api --password-stdin
              authbrokerctl passwords list
              authbrokerctl passwords remove https://git.corp.test --user alice
              authbrokerctl passwords show https://git.corp.test --user alice
            """,
        subcommands: [List.self, Add.self, Remove.self, Show.self]
    )

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List stored passwords (never the secrets).",
            discussion: """
                Examples:
                  authbrokerctl passwords list
                  authbrokerctl passwords list --json
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (list, raw) = try await api.call("GET", "/v1/passwords", context: "cannot list passwords", as: PasswordList.self)
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.passwordsTable(list.passwords)) }
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Store a password for an origin (and optionally a realm).",
            discussion: """
                Replaces a password for the same origin, realm and user, and clears its failed mark. \
                Kept in the secret store unless --session is given. The password may be empty, \
                and so may the user name (an API token sent as the user name with an empty \
                password, or as the password with an empty user name, is common with Basic).

                Examples:
                  authbrokerctl passwords add https://git.corp.test --user alice
                  authbrokerctl passwords add http://printer.lan:631 --user admin --realm CUPS --password-stdin < pw.txt
                  authbrokerctl passwords add https://scratch.corp.test --user tester --session
                  authbrokerctl passwords add https://api.corp.test --user '' --password-stdin < token.txt
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        @Argument(help: ArgumentHelp("The origin the password is for (path and query are ignored).", valueName: "url"))
        var url: String

        @Option(help: "The user name.")
        var user: String

        @Option(help: "Only for this realm (default: any realm at the origin).")
        var realm: String?

        @Flag(help: "Read the password from the first line of stdin instead of the terminal.")
        var passwordStdin = false

        @Flag(help: "Keep the password in the daemon's memory only, until it stops (default: in the secret store).")
        var session = false

        @Option(help: "permanent: kept in the secret store (the default); session: as --session.")
        var persistence: String?

        /// What is sent: `--session` and `--persistence` say the same thing, or it is an error.
        var chosenPersistence: String {
            self.persistence ?? (self.session ? "session" : "permanent")
        }

        func validate() throws {
            if let persistence {
                guard persistence == "session" || persistence == "permanent" else {
                    throw ValidationError("--persistence must be 'permanent' or 'session', not '\(HumanFormat.sanitized(String(persistence.prefix(40))))'")
                }
                guard !session || persistence == "session" else {
                    throw ValidationError("--session and --persistence \(persistence) contradict each other; give one of them")
                }
            }
            guard !user.contains(":") else {
                throw ValidationError("--user must not contain ':' (Basic authentication cannot carry it, RFC 7617 §2)")
            }
        }

        func run() async throws {
            try await CommandRunner.run {
                var secret = try Self.readPassword(stdin: passwordStdin)
                defer { for index in secret.indices { secret[index] = 0 } }
                guard let password = String(validating: secret, as: UTF8.self) else {
                    throw CLIError.plain(.badRequest, "cannot add password: it is not valid UTF-8 text")
                }
                let api = ControlAPI(client: try connection.client())
                let request = try AddPasswordRequest(
                    url: url, user: user, realm: realm, password: password, persistence: chosenPersistence
                ).brokerJSON()
                let (added, raw) = try await api.call(
                    "POST", "/v1/passwords", json: request, context: "cannot add password", as: AddedPassword.self
                )
                if output.json { Console.out(raw) } else { Console.out("added " + HumanFormat.passwordLine(added.password)) }
            }
        }

        static func readPassword(stdin: Bool) throws -> [UInt8] {
            if stdin { return readLine(STDIN_FILENO) }
            guard let secret = Terminal.readSecret("Password: ") else {
                throw CLIError.plain(
                    .badRequest,
                    "cannot add password: there is no terminal to ask on; pipe it in with --password-stdin"
                )
            }
            return secret
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a stored password.",
            discussion: """
                Examples:
                  authbrokerctl passwords remove https://git.corp.test --user alice
                  authbrokerctl passwords remove https://api.corp.test --user ci --realm api

                Exits 8 when there is no such password.
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        @Argument(help: ArgumentHelp("The origin the password is for.", valueName: "url"))
        var url: String

        @Option(help: "The user name.")
        var user: String

        @Option(help: "The realm it was stored with, if any.")
        var realm: String?

        func run() async throws {
            try await CommandRunner.run {
                var query = "url=\(Self.encode(url))&user=\(Self.encode(user))"
                if let realm { query += "&realm=\(Self.encode(realm))" }
                let api = ControlAPI(client: try connection.client())
                let (removed, raw) = try await api.call(
                    "DELETE", "/v1/passwords?\(query)", context: "cannot remove password", as: RemovedPassword.self
                )
                if output.json { Console.out(raw) } else { Console.out("removed " + HumanFormat.passwordLine(removed.removed)) }
            }
        }

        static func encode(_ text: String) -> String {
            text.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? ""
        }
    }
}

extension Passwords {
    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a stored password, after you prove you are you (your login password, through PAM).",
            discussion: """
                The daemon asks for your login password through PAM (its service \
                'authbroker'); this command relays its prompts without echo. A success lets \
                this one process reveal secrets for a few minutes (reauth_grant_seconds).

                Examples:
                  authbrokerctl passwords show https://git.corp.test --user alice
                  printf '%s\\n' "$LOGIN_PW" | authbrokerctl passwords show https://git.corp.test --user alice --login-password-stdin

                Exits 8 when there is no such password, 7 when re-authentication is refused.
                """
        )

        @OptionGroup var connection: ConnectionOptions

        @Argument(help: ArgumentHelp("The origin the password is for.", valueName: "url"))
        var url: String

        @Option(help: "The user name.")
        var user: String

        @Option(help: "The realm it was stored with, if any.")
        var realm: String?

        @Flag(help: "Answer PAM's password prompt with the first line of stdin instead of asking on the terminal.")
        var loginPasswordStdin = false

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let request = try RevealPasswordRequest(url: url, user: user, realm: realm).brokerJSON()
                let (revealed, _) = try await api.call(
                    "POST", "/v1/passwords/reveal", json: request, context: "cannot show password", as: RevealedPassword.self,
                    reauthenticate: { try await Reauthentication.run(api: api, passwordFromStdin: loginPasswordStdin) }
                )
                Console.out(revealed.password)
            }
        }
    }
}

/// The PAM dialogue with the daemon: its prompts on the terminal (or one answer from stdin).
enum Reauthentication {
    static func run(api: ControlAPI, passwordFromStdin: Bool) async throws {
        let noTerminal = CLIError.plain(
            .badRequest, "cannot re-authenticate: there is no terminal to ask on; pipe your login password in with --login-password-stdin"
        )
        // Checked before a dialogue begins: one begun holds the user's only attempt until it ends.
        guard passwordFromStdin || Terminal.isAvailable else { throw noTerminal }
        var (step, _) = try await api.call("POST", "/v1/reauth", context: "cannot re-authenticate", as: ReauthStep.self)
        var answeredFromStdin = false
        while true {
            for message in step.messages { Console.error(message) }
            switch step.state {
            case "granted":
                return
            case "prompt":
                guard let transaction = step.transaction, let prompt = step.prompt else {
                    throw CLIError.plain(.failure, "cannot re-authenticate: the daemon sent a prompt without its transaction")
                }
                var answer: [UInt8]
                if passwordFromStdin {
                    guard !answeredFromStdin else {
                        await Self.cancel(transaction, api: api)
                        throw CLIError.plain(.badRequest, "cannot re-authenticate: PAM asks more than one question; run this on a terminal")
                    }
                    answeredFromStdin = true
                    answer = readLine(STDIN_FILENO)
                } else {
                    let text = prompt.text.hasSuffix(" ") ? prompt.text : prompt.text + " "
                    // PAM says which answers may be shown as typed (a user name) and which not.
                    let read = prompt.style == "visible" ? Terminal.ask(text).map { Array($0.utf8) } : Terminal.readSecret(text)
                    guard let typed = read else {
                        await Self.cancel(transaction, api: api)
                        throw noTerminal
                    }
                    answer = typed
                }
                defer { for index in answer.indices { answer[index] = 0 } }
                let body = try ReauthAnswer(answer: String(decoding: answer, as: UTF8.self)).brokerJSON()
                (step, _) = try await api.call(
                    "POST", "/v1/reauth/\(transaction)", json: body, context: "re-authentication refused", as: ReauthStep.self
                )
            default:
                throw CLIError.plain(.failure, "cannot re-authenticate: the daemon answered '\(step.state)', which this authbrokerctl does not know")
            }
        }
    }

    /// Ends a dialogue this process will not finish, so the next attempt need not wait for its
    /// prompt to time out; best effort (the daemon ends it at the timeout anyway).
    private static func cancel(_ transaction: String, api: ControlAPI) async {
        guard let body = try? ReauthCancel(cancel: true).brokerJSON() else { return }
        _ = try? await api.call("POST", "/v1/reauth/\(transaction)", json: body, context: "cancel", as: ReauthStep.self)
    }
}
