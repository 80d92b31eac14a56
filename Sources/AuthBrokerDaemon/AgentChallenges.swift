import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerTrust
import Logging
import NIOHTTP1
import SwiftASN1

/// Every challenge that may reach an agent, of both kinds (`ChallengeSpace`), through one
/// `ChallengeBroker`: the store is asked first (the vault for a protection space; for a server
/// the evaluator again, since an answer to an earlier challenge may trust its chain by now), then
/// the attached agents. Agents' replies are applied here (a kept password, an exception, an
/// anchor) before the waiting requests are resumed.
package final class AgentChallenges: Sendable {
    package typealias Broker = ChallengeBroker<ChallengeSpace, ChallengeAnswer>
    package typealias AgentEvent = Broker.AgentEvent

    package let broker: Broker
    private let vault: PasswordVault
    private let store: TrustStore
    private let logger: Logger

    package init(vault: PasswordVault, store: TrustStore, evaluator: TrustEvaluator, agentEventBuffer: Int = 1024, logger: Logger) {
        self.vault = vault
        self.store = store
        self.logger = logger
        self.broker = ChallengeBroker(agentEventBuffer: agentEventBuffer) { space in
            switch space {
            case .http(let protectionSpace):
                return await vault.credential(for: protectionSpace).map(ChallengeAnswer.credential)
            case .serverTrust(let server):
                let decision = await evaluator.evaluate(chainDER: server.chainDER, host: server.host, port: server.port)
                return decision.isTrusted ? .serverTrusted : nil
            }
        }
    }

    // MARK: - Server trust

    /// Asks the agents whether to trust a server whose chain did not verify, waiting up to
    /// `wait` (or until the client goes away). True when the server is trusted now and the
    /// request should connect again; false: it fails with the untrusted-server error.
    package func serverTrusted(
        _ untrusted: UntrustedServer, wait: Duration, requester: Requester?, clientGone: @escaping @Sendable () async -> Void
    ) async -> Bool {
        guard let leaf = untrusted.decision.chain.first, !untrusted.chainDER.isEmpty else { return false }
        let space = ServerTrustSpace(
            host: untrusted.origin.host, port: untrusted.origin.port, leafSHA256: leaf.sha256,
            failureCodes: untrusted.decision.failures.map(\.code), reasons: untrusted.decision.reasons,
            chain: untrusted.decision.chain, chainDER: untrusted.chainDER
        )
        let broker = self.broker
        let resolution = await untilClientGone(clientGone) {
            await broker.resolve(.serverTrust(space), interactive: true, timeout: wait, requester: requester)
        }
        if case .answered(.serverTrusted) = resolution { return true }
        return false
    }

    // MARK: - Agents

    /// What an agent says to a challenge it was offered.
    package enum AgentReply: Sendable {
        case credential(PasswordCredential, persistence: CredentialPersistence)
        case serverTrust(ServerTrustReply)
        /// No answer; for a server-trust challenge, a refusal.
        case decline
    }

    package func attachAgent() async -> (id: UInt64, events: AsyncStream<AgentEvent>) {
        await self.broker.attachAgent()
    }

    package func detachAgent(_ id: UInt64) async {
        await self.broker.detachAgent(id)
    }

    /// Applies an agent's reply and passes it to the broker: a credential with `session` or
    /// `permanent` persistence is kept in the vault for the challenge's space; a trust answer adds
    /// the exception or anchor before the waiting requests connect again.
    ///
    /// Nothing is applied unless `agent` is attached and holds `challenge` (it was offered to it and
    /// is still unanswered): an answer naming another agent, or a challenge that is gone, is
    /// refused before anything is kept or trusted.
    package func agentReplied(agent: UInt64, challenge: UInt64, _ reply: AgentReply) async throws(BrokerError) {
        guard let space = await self.broker.space(of: challenge, heldBy: agent) else {
            throw Self.notHeld(challenge, agent: agent)
        }
        switch reply {
        case .decline:
            await self.broker.agentAnswered(agent, challenge: challenge, .decline)
        case .credential(let credential, let persistence):
            guard case .http(let protectionSpace) = space else {
                throw Self.wrongKind(challenge, expected: "{\"challenge\", \"trust\": \"once\"|\"always\"|\"reject\"}")
            }
            if persistence != .none {
                try await self.vault.add(
                    origin: protectionSpace.origin, realm: protectionSpace.realm, credential: credential, persistence: persistence
                )
            }
            await self.broker.agentAnswered(
                agent, challenge: challenge, .answer(.credential(StoredAnswer(credential: credential, realm: protectionSpace.realm, state: .usable)))
            )
        case .serverTrust(let trust):
            guard case .serverTrust(let server) = space else {
                throw Self.wrongKind(challenge, expected: "{\"challenge\", \"user\", \"password\", \"persistence\"}")
            }
            try self.apply(trust, to: server)
            await self.broker.agentAnswered(agent, challenge: challenge, .answer(.serverTrusted))
        }
    }

    /// The challenges that wait, oldest first.
    package func pendingChallenges() async -> [(challenge: Broker.Queue.PendingChallenge, age: Duration, requester: Requester?)] {
        await self.broker.pending
    }

    private func apply(_ trust: ServerTrustReply, to server: ServerTrustSpace) throws(BrokerError) {
        let host: HostPattern
        do {
            host = try HostPattern(parsing: server.host)
        } catch {
            throw BrokerError.internalError("The server's host \(server.host) makes no host pattern: \(error.message)")
        }
        do throws(TrustStoreError) {
            switch trust {
            case .once, .alwaysException:
                try self.store.addException(
                    host: host, port: server.port, sha256: server.leafSHA256, persistent: trust == .alwaysException
                )
            case .alwaysAnchor:
                guard let topmost = server.chainDER.last else { return }
                try self.store.addAnchors(pem: PEMDocument(type: "CERTIFICATE", derBytes: topmost).pemString, hosts: [host], widening: true)
            }
        } catch {
            throw BrokerError(code: BrokerErrorCode(error.kind), status: .internalServerError, title: "Cannot save the trust decision", detail: error.message)
        }
        self.logger.notice(
            "an agent trusted a server",
            metadata: [
                "host": "\(server.host)", "port": "\(server.port)", "leaf_sha256": "\(server.leafSHA256)",
                "trust": "\(trust == .once ? "once" : trust == .alwaysException ? "always_exception" : "always_anchor")",
            ]
        )
    }

    private static func notHeld(_ challenge: UInt64, agent: UInt64) -> BrokerError {
        BrokerError(
            code: .challengeNotFound, status: .notFound, title: "No such challenge",
            detail: "Challenge \(challenge) is not pending for agent \(agent): it was answered, withdrawn or timed out, "
                + "or that agent is not attached. Nothing was kept or trusted; answer the challenges your agent's stream offers."
        )
    }

    private static func wrongKind(_ challenge: UInt64, expected: String) -> BrokerError {
        BrokerError.badRequest(
            code: .wrongAnswerKind, detail: "Challenge \(challenge) is of another kind; answer it with \(expected), or {\"challenge\", \"decline\": true}."
        )
    }
}
