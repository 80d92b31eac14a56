import ArgumentParser
import AuthBrokerClient
import AuthBrokerCore
import Foundation

/// `authbrokerctl challenges`: what waits for an answer.
struct Challenges: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the challenges waiting for an answer (passwords, server trust), with their ages.",
        discussion: """
            A challenge waits when the request said it may wait for an agent (header \
            Authbroker-Interactive) and the daemon has no stored password for the server's \
            401, or the server's certificate is not trusted (SCHEME 'trust?', REALM the first \
            reason). Answer them with 'authbrokerctl agent'.

            Examples:
              authbrokerctl challenges
              authbrokerctl challenges --json
            """
    )

    @OptionGroup var connection: ConnectionOptions
    @OptionGroup var output: OutputOptions

    func run() async throws {
        try await CommandRunner.run {
            let api = ControlAPI(client: try connection.client())
            let (list, raw) = try await api.call("GET", "/v1/challenges", context: "cannot list challenges", as: ChallengeList.self)
            if output.json { Console.out(raw) } else { Console.out(HumanFormat.challengesTable(list.challenges)) }
        }
    }
}

/// `authbrokerctl agent`: answers challenges in this terminal.
struct Agent: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Answer password and server-trust challenges interactively in this terminal.",
        discussion: """
            Attaches to the daemon as an agent. For each challenge it shows the requesting \
            process (pid and executable) and the server.

            For a Basic/Digest 401 it shows the realm and scheme, and asks for a user name and \
            password (without echo), and whether to keep the password: not at all, for this \
            session (until the daemon stops), or permanently. An empty user name declines.

            For a server whose certificate is not trusted it shows why, and each certificate's \
            subject, issuer, validity and SHA-256 fingerprints, and asks: trust [o]nce (until \
            the daemon stops), [a]lways, or [r]eject (the default). Always then asks whether to \
            keep an [e]xception for exactly this certificate from this server (the default), or \
            to add the chain's topmost certificate as an [a]nchor for this host.

            Ctrl-C detaches; challenges it held go back to their requests.

            Examples:
              authbrokerctl agent
            """
    )

    @OptionGroup var connection: ConnectionOptions

    func run() async throws {
        try await CommandRunner.run {
            let api = ControlAPI(client: try connection.client())
            try await api.mappingErrors(context: "cannot attach as an agent") {
                // The event stream: one JSON object per line, for as long as the connection lasts.
                let events = try await api.client.sendControl(method: "GET", path: "/v1/agent")
                guard events.status == 200 else {
                    events.body.cancel()
                    throw CLIError.plain(.failure, "cannot attach as an agent: the daemon answered HTTP \(events.status)")
                }
                var agentID: String?
                try await events.body.forEachLine { line in
                    try await Self.handle(line: line, api: api, agentID: &agentID)
                }
                Console.error("the daemon ended the agent stream")
            }
        }
    }

    static func handle(line: [UInt8], api: ControlAPI, agentID: inout String?) async throws {
        guard let event = try? BrokerJSON.decoder().decode(AgentEvent.self, from: Data(line)) else { return }
        switch event.event {
        case "attached":
            agentID = event.agent
            Console.out("Attached as agent \(event.agent ?? "?"). Waiting for challenges; Ctrl-C to stop.")
        case "withdrawn":
            Console.out("Challenge \(event.id ?? "?") no longer needs an answer (answered elsewhere, timed out, or its request went away).")
        case "notice":
            guard let notice = event.notice else { return }
            Console.out("Notice (\(HumanFormat.sanitized(notice.code))): \(HumanFormat.sanitized(notice.message))")
        case "challenge":
            guard let challenge = event.challenge, let agent = agentID else { return }
            Console.out(HumanFormat.challengeOffer(challenge))
            let answer = challenge.isServerTrust ? Self.askTrust(challenge) : Self.ask(challenge)
            do {
                _ = try await api.call(
                    "POST", "/v1/agent/\(agent)/answer", json: try answer.brokerJSON(), context: "cannot answer the challenge",
                    as: AgentAnswerAccepted.self
                )
                Console.out(answer.trust == "reject" ? "Rejected." : answer.decline == true ? "Declined." : "Answered.")
            } catch let error as CLIError {
                Console.error(error.message)
            }
        default:
            return
        }
    }

    /// Once, always (an exception or an anchor) or reject; anything unrecognised rejects.
    static func askTrust(_ challenge: ChallengeRecord) -> AgentAnswer {
        let trust = (Terminal.ask("Trust this server? [o]nce, [a]lways, [r]eject: ") ?? "r").lowercased()
        if trust.hasPrefix("o") { return AgentAnswer(challenge: challenge.id, trust: "once") }
        guard trust.hasPrefix("a") else { return AgentAnswer(challenge: challenge.id, trust: "reject") }
        let scope = (Terminal.ask("Keep an [e]xception for exactly this certificate, or add the chain's top as an [a]nchor for this host? [e]: ") ?? "e").lowercased()
        return AgentAnswer(challenge: challenge.id, trust: "always", scope: scope.hasPrefix("a") ? "anchor" : "exception")
    }

    static func ask(_ challenge: ChallengeRecord) -> AgentAnswer {
        guard let user = Terminal.ask("User (empty to decline): "), !user.isEmpty else {
            return AgentAnswer(challenge: challenge.id, decline: true)
        }
        guard var secret = Terminal.readSecret("Password: ") else { return AgentAnswer(challenge: challenge.id, decline: true) }
        defer { for index in secret.indices { secret[index] = 0 } }
        let keep = (Terminal.ask("Keep it? [n]o, [s]ession, [p]ermanently: ") ?? "n").lowercased()
        let persistence = keep.hasPrefix("s") ? "session" : keep.hasPrefix("p") ? "permanent" : "none"
        return AgentAnswer(
            challenge: challenge.id, user: user, password: String(decoding: secret, as: UTF8.self), persistence: persistence
        )
    }
}
