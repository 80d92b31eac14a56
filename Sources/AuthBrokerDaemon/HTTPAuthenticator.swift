import AuthBrokerCore
import AuthBrokerHTTPAuth
import Logging
import NIOConcurrencyHelpers
import NIOHTTP1

/// One request's history with HTTP authentication, carried across its attempts.
package struct RequestAuthState: Sendable {
    /// 401s this request has had so far.
    var previousFailures = 0
    var staleRetries = 0
    var lastAttempt: AuthAttemptPolicy.LastAttempt = .noCredentials
    /// The space and user of the credential the broker sent on the latest attempt.
    var space: ProtectionSpace?
    var user: String?
    /// The `Authorization` value the broker adds to the next attempt.
    var authorization: String?
    /// A Basic credential the client sent itself, and how long it asked the broker to keep it
    /// once the server accepts it (`Authbroker-Persist`).
    var clientCredential: PasswordCredential?
    var persist: CredentialPersistence?
    /// The Digest answer the broker sent on the latest attempt, and with which credential, to
    /// check the server's `rspauth` (RFC 7616 §3.5).
    var digestSent: (authorization: DigestAuthorization, credential: PasswordCredential)?

    /// The state for a request with these headers: whether the client authorised it itself,
    /// and whether it asked for its Basic credential to be kept (Digest answers cannot be: the
    /// broker never sees that password).
    package init(headers: HTTPHeaders) {
        let authorization = headers.first(name: "authorization")
        if authorization != nil { self.lastAttempt = .clientCredential }
        let persist = BrokerDirectives(headers: headers).persist
        guard let authorization, let persist, let persistence = CredentialPersistence(rawValue: persist), persistence != .none
        else { return }
        self.clientCredential = BasicAuthorization.credential(fromHeaderValue: authorization)
        self.persist = persistence
    }
}

/// Answers origins' Basic and Digest challenges from the vault, in the daemon (DESIGN.md:
/// CredentialResolver). Every challenge goes through the `@MainActor` `ChallengeBroker`, which
/// coalesces look-ups for one protection space; a credential is sent at most as
/// `AuthAttemptPolicy` allows, so a wrong stored password never loops or locks an account.
///
/// Once a space answered, later requests to it carry credentials up front: Basic for URIs under
/// the challenged one's directory (RFC 7617 §2.2), Digest with the remembered nonce and the next
/// `nc` anywhere on the origin (RFC 7616 §3.3), so repeated requests skip the 401 round trip.
package final class HTTPAuthenticator: Sendable {
    private struct KnownSpace: Sendable {
        var space: ProtectionSpace
        /// Basic: the directory of the URI that was challenged; Digest: "/".
        var pathPrefix: String
    }

    /// Spaces remembered per origin for preemptive answers; the oldest is forgotten beyond this.
    static let maxKnownSpacesPerOrigin = 16
    /// How long a request waits for a challenge to be resolved (a store look-up, for now).
    static let resolveTimeout: Duration = .seconds(30)

    private let vault: PasswordVault
    private let broker: ChallengeBroker<ProtectionSpace, StoredAnswer>
    private let digestSessions = NIOLockedValueBox<[ProtectionSpace: DigestSession]>([:])
    private let knownSpaces = NIOLockedValueBox<[CanonicalOrigin: [KnownSpace]]>([:])
    /// The Basic space whose 401 last went to the client, per origin: a credential the client
    /// then sends with `Authbroker-Persist` is kept for that realm.
    private let offeredToClient = NIOLockedValueBox<[CanonicalOrigin: ProtectionSpace]>([:])
    /// Origins remembered in `offeredToClient` at most (the oldest entries are dropped).
    static let maxOfferedOrigins = 256
    private let audit: AuditLog?
    private let logger: Logger

    package init(vault: PasswordVault, audit: AuditLog? = nil, logger: Logger) {
        self.vault = vault
        self.audit = audit
        self.logger = logger
        self.broker = ChallengeBroker { space in await vault.credential(for: space) }
    }

    // MARK: - Before sending

    /// Sets `state.authorization` when a known space covers `uri` and its credential is usable.
    package func authorizePreemptively(
        origin: CanonicalOrigin, method: HTTPMethod, uri: String, requester: () -> Requester? = { nil },
        state: inout RequestAuthState
    ) {
        guard state.lastAttempt == .noCredentials, let known = self.knownSpace(origin: origin, uri: uri),
            let answer = self.vault.cachedCredential(for: known.space), AuthAttemptPolicy.mayPreempt(stored: answer.state)
        else { return }
        let space = known.space
        do {
            if space.authScheme == "basic" {
                state.authorization = try BasicAuthorization.headerValue(for: answer.credential)
                state.lastAttempt = .storedCredential
            } else {
                let authorization = try self.digestSessions.withLockedValue { sessions throws(HTTPAuthError) -> DigestAuthorization? in
                    guard var session = sessions[space] else { return nil }
                    defer { sessions[space] = session }
                    return try session.authorization(credential: answer.credential, method: method.rawValue, uri: uri)
                }
                guard let authorization else { return }
                state.authorization = authorization.headerValue
                state.digestSent = (authorization, answer.credential)
                state.lastAttempt = .preemptiveDigest
            }
            state.space = space
            state.user = answer.credential.user
            self.audit?.record(.credentialUsed(space: space, user: answer.credential.user, requester: requester()))
        } catch {
            self.logger.debug("no preemptive authorization", metadata: ["space": "\(space)", "error": "\((error as? HTTPAuthError)?.code ?? "\(error)")"])
        }
    }

    // MARK: - After a 401

    /// Decides what to do with a 401: true when the request should be sent again with
    /// `state.authorization` (the stored credential's answer); false to give the client the 401.
    ///
    /// - Parameters:
    ///   - replayableBody: the request body, when it can be sent again (nil: it cannot).
    ///   - agentWait: how long the request may wait for an agent when the store has nothing (nil: not).
    package func answerChallenge(
        _ head: HTTPResponseHead, origin: CanonicalOrigin, method: HTTPMethod, uri: String,
        replayableBody: [UInt8]?, agentWait: Duration? = nil, requester: Requester? = nil, state: inout RequestAuthState
    ) async -> Bool {
        defer { state.previousFailures += 1 }
        guard head.status == .unauthorized, state.lastAttempt != .clientCredential,
            let choice = ChallengeSelection.preferred(AuthChallenge.parse(fieldValues: head.headers["WWW-Authenticate"]))
        else { return false }
        let space = ProtectionSpace(origin: origin, challenge: choice.challenge)

        var stale = false
        if case .digest(let digest, _) = choice, state.space == space {
            stale = self.digestSessions.withLockedValue { sessions in
                guard var session = sessions[space] else { return false }
                defer { sessions[space] = session }
                return session.challenge(digest) == .staleNonce
            }
        }

        let resolution = await self.broker.resolve(
            space, interactive: agentWait != nil, timeout: agentWait ?? Self.resolveTimeout, requester: requester
        )
        let answer: StoredAnswer? = if case .answered(let answer) = resolution { answer } else { nil }
        let decision = AuthAttemptPolicy.decide(
            previousFailures: state.previousFailures, lastAttempt: state.lastAttempt, stored: answer?.state ?? .none,
            challengeIsStale: stale, staleRetries: state.staleRetries
        )
        switch decision {
        case .passToClient:
            if space.authScheme == "basic" {
                self.offeredToClient.withLockedValue { offered in
                    if offered.count >= Self.maxOfferedOrigins { offered.removeAll() }
                    offered[origin] = space
                }
            }
            return false
        case .markStoredFailedAndPassToClient:
            let user = state.user ?? answer?.credential.user ?? ""
            self.vault.markFailed(space: space, user: user)
            self.forget(space)
            self.logger.notice(
                "the server refused the stored password; it is not sent again until it is changed",
                metadata: ["space": "\(space)", "user": "\(user)"]
            )
            return false
        case .answerFromStore:
            guard let answer, let body = replayableBody else { return false }
            do {
                switch choice {
                case .basic(let challenge):
                    state.authorization = try BasicAuthorization.headerValue(for: answer.credential, challenge: challenge)
                case .digest(let digest, _):
                    let authorization = try self.digestSessions.withLockedValue { sessions throws(HTTPAuthError) in
                        var session = stale ? (sessions[space] ?? DigestSession(protectionSpace: space, challenge: digest))
                            : DigestSession(protectionSpace: space, challenge: digest)
                        defer { sessions[space] = session }
                        return try session.authorization(
                            credential: answer.credential, method: method.rawValue, uri: uri, body: .bytes(body)
                        )
                    }
                    state.authorization = authorization.headerValue
                    state.digestSent = (authorization, answer.credential)
                }
            } catch {
                self.logger.notice("cannot answer the challenge", metadata: ["space": "\(space)", "error": "\((error as? HTTPAuthError)?.code ?? "\(error)")"])
                return false
            }
            if stale { state.staleRetries += 1 }
            state.lastAttempt = .storedCredential
            state.space = space
            state.user = answer.credential.user
            self.audit?.record(.credentialUsed(space: space, user: answer.credential.user, requester: requester))
            return true
        }
    }

    // MARK: - After the final response

    /// A response other than a 401 ended a request the broker authorised: the space is known
    /// from now on, and Digest takes the server's `nextnonce`.
    package func responseAccepted(_ head: HTTPResponseHead, origin: CanonicalOrigin, uri: String, state: RequestAuthState) {
        if state.lastAttempt == .clientCredential, let credential = state.clientCredential, let persist = state.persist,
            (200..<400).contains(head.status.code)
        {
            self.keepClientCredential(credential, origin: origin, persistence: persist)
        }
        guard let space = state.space, state.lastAttempt != .clientCredential, head.status != .unauthorized else { return }
        let info = head.headers[space.authenticationInfoFieldName]
        if space.authScheme == "digest", !info.isEmpty {
            let parsed = AuthenticationInfo(parsing: info)
            if let sent = state.digestSent {
                let verdict = self.digestSessions.withLockedValue { sessions in
                    sessions[space]?.challenge.verifyResponseAuth(parsed, credential: sent.credential, authorization: sent.authorization)
                }
                if verdict == .mismatch {
                    // The server did not prove it knows the password: stop trusting this space.
                    self.forget(space)
                    self.logger.warning(
                        "the server's rspauth does not match the request; its space is no longer answered preemptively",
                        metadata: ["space": "\(space)"]
                    )
                    return
                }
            }
            self.digestSessions.withLockedValue { sessions in sessions[space]?.accept(authenticationInfo: parsed) }
        }
        let prefix = space.authScheme == "basic" ? Self.directory(of: uri) : "/"
        self.knownSpaces.withLockedValue { known in
            var list = known[origin] ?? []
            list.removeAll { $0.space == space && $0.pathPrefix == prefix }
            list.append(KnownSpace(space: space, pathPrefix: prefix))
            if list.count > Self.maxKnownSpacesPerOrigin { list.removeFirst(list.count - Self.maxKnownSpacesPerOrigin) }
            known[origin] = list
        }
    }

    // MARK: - Agents

    package typealias AgentEvent = ChallengeBroker<ProtectionSpace, StoredAnswer>.AgentEvent

    /// What an agent says to a challenge it was offered.
    package enum AgentReply: Sendable {
        case credential(PasswordCredential, persistence: CredentialPersistence)
        case decline
    }

    package func attachAgent() async -> (id: UInt64, events: AsyncStream<AgentEvent>) {
        await self.broker.attachAgent()
    }

    package func detachAgent(_ id: UInt64) async {
        await self.broker.detachAgent(id)
    }

    /// Passes an agent's reply to the broker; a credential with `session` persistence is kept
    /// in the vault for the challenge's space (`permanent` needs the secret store).
    package func agentReplied(agent: UInt64, challenge: UInt64, _ reply: AgentReply) async throws(BrokerError) {
        switch reply {
        case .decline:
            await self.broker.agentAnswered(agent, challenge: challenge, .decline)
        case .credential(let credential, let persistence):
            if persistence != .none {
                guard let space = await self.broker.pending.first(where: { $0.challenge.id == challenge })?.challenge.space else {
                    throw BrokerError(
                        code: "challenge_not_found", status: .notFound, title: "No such challenge",
                        detail: "Challenge \(challenge) is no longer pending (it was answered, withdrawn or timed out)."
                    )
                }
                try await self.vault.add(origin: space.origin, realm: space.realm, credential: credential, persistence: persistence)
            }
            await self.broker.agentAnswered(agent, challenge: challenge, .answer(StoredAnswer(credential: credential, state: .usable)))
        }
    }

    /// The challenges that wait, oldest first.
    package func pendingChallenges() async -> [(challenge: ChallengeQueue<ProtectionSpace, StoredAnswer, ContinuousClock.Instant>.PendingChallenge, age: Duration, requester: Requester?)] {
        await self.broker.pending
    }

    /// `Authbroker-Persist`: the server accepted a Basic credential the client sent; keep it for
    /// the realm the client was challenged with (any realm at the origin when unknown).
    private func keepClientCredential(_ credential: PasswordCredential, origin: CanonicalOrigin, persistence: CredentialPersistence) {
        let realm = self.offeredToClient.withLockedValue { $0[origin]?.realm }
        let (vault, logger) = (self.vault, self.logger)
        // Off the response path: a keyring write must not delay the response.
        Task {
            do {
                try await vault.add(origin: origin, realm: realm, credential: credential, persistence: persistence)
                logger.info(
                    "kept the credential the client supplied",
                    metadata: ["origin": "\(origin)", "user": "\(credential.user)", "persistence": "\(persistence.rawValue)"]
                )
            } catch {
                logger.notice("could not keep the credential the client supplied", metadata: ["origin": "\(origin)", "error": "\((error as? BrokerError)?.code ?? "\(error)")"])
            }
        }
    }

    // MARK: - Helpers

    /// The known space whose prefix covers `uri` most narrowly.
    private func knownSpace(origin: CanonicalOrigin, uri: String) -> KnownSpace? {
        let path = uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? uri
        return self.knownSpaces.withLockedValue { known in
            known[origin]?.filter { path.hasPrefix($0.pathPrefix) }.max { $0.pathPrefix.count < $1.pathPrefix.count }
        }
    }

    private func forget(_ space: ProtectionSpace) {
        self.digestSessions.withLockedValue { $0[space] = nil }
        self.knownSpaces.withLockedValue { known in known[space.origin]?.removeAll { $0.space == space } }
    }

    /// "/a/b/c?x" → "/a/b/": RFC 7617 §2.2's reuse scope.
    static func directory(of uri: String) -> String {
        let path = uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? uri
        guard let slash = path.lastIndex(of: "/") else { return "/" }
        return String(path[...slash])
    }
}
