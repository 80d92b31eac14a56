import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerKerberos
import Logging
import NIOConcurrencyHelpers
import NIOHTTP1
import Synchronization

/// Which stored password is tried where: a space and the key of the password stored for it.
struct PasswordTrialKey: Sendable, Hashable {
    var space: ProtectionSpace
    var user: String
    /// The realm the password is stored for (nil: any realm; "" is read as nil, as the vault does).
    var storedRealm: String?

    init(space: ProtectionSpace, user: String, storedRealm: String?) {
        self.space = space
        self.user = user
        self.storedRealm = PasswordVault.realm(storedRealm)
    }
}

/// A stored password's standing at one space. Until a server has accepted it there, one
/// request at a time sends it (the trial); the others that meet the same challenge wait for the
/// trial's verdict, so a wrong password is refused once, not once per request in flight (a
/// burst of parallel requests after a password change would lock a directory account).
struct PasswordTrial: Sendable {
    var credential: PasswordCredential
    /// The request trying it (`RequestAuthState.trial`); nil once it is proven.
    var owner: UInt64?

    var isProven: Bool { self.owner == nil }
}

/// The trials, and the requests waiting for their verdicts: true accepted, false refused, nil
/// none came (the trial ended another way, or the wait ran out), and the waiter tries the
/// password itself. The waiters are kept apart from the bounded table, so that an entry pushed
/// out of it (an origin that varies its realm) never takes a waiting request with it.
struct PasswordTrialBook: Sendable {
    var trials: BoundedTable<PasswordTrialKey, PasswordTrial>
    var waiters: [PasswordTrialKey: [UInt64: CheckedContinuation<Bool?, Never>]] = [:]

    mutating func takeWaiters(of key: PasswordTrialKey) -> [CheckedContinuation<Bool?, Never>] {
        self.waiters.removeValue(forKey: key).map { Array($0.values) } ?? []
    }
}

/// A proxy password a 407 in the proxy's own space refused on plain-http requests, after the
/// proxy had accepted it. Such a 407 may be an origin's mimicking the proxy (which must not get
/// the password marked refused) or the proxy's own (the password changed at the directory, where
/// a few failed logins lock the account). The password is held back for each origin that
/// answered so, and for every origin once two did, until a response through the proxy shows it
/// took the password (a CONNECT is surely the proxy's) or the password is stored again: a
/// changed password costs at most two failed logins over plain http, and one hostile origin
/// blocks only itself (two hold the password back for plain http until one of those).
struct ProxyPasswordDoubt: Sendable {
    var credential: PasswordCredential
    /// `PasswordVault.changes` when it began: storing the password again (the same one too, after
    /// a forged 407) ends it.
    var vaultChanges: UInt64
    var origins: Set<CanonicalOrigin> = []

    /// Two origins refused it: the proxy's own refusal, most likely.
    var everywhere: Bool { self.origins.count >= 2 }
}

/// One request's history with HTTP authentication, carried across its attempts.
package struct RequestAuthState: Sendable {
    /// 401s this request has had so far.
    var previousFailures = 0
    var staleRetries = 0
    /// Answers made because the server accepted the same credential from another request after
    /// this one's refused attempt was sent (`AuthAttemptPolicy.maxRetriesAfterAcceptance`).
    var retriesAfterAcceptance = 0
    /// How many acceptances the space had when the broker's latest credential was sent.
    var acceptancesWhenSent: UInt64 = 0
    var lastAttempt: AuthAttemptPolicy.LastAttempt = .noCredentials
    /// The space and user of the credential the broker sent on the latest attempt, and the
    /// realm that password is stored for (nil: any realm).
    var space: ProtectionSpace?
    var user: String?
    var storedRealm: String?
    /// The `Authorization` (or, for the proxy, `Proxy-Authorization`) value the broker adds to
    /// the next attempt.
    var authorization: String?
    /// A Basic credential the client sent itself, and how long it asked the broker to keep it
    /// once the server accepts it (`Authbroker-Persist`).
    var clientCredential: PasswordCredential?
    var persist: CredentialPersistence?
    /// The Digest answer the broker sent on the latest attempt, and with which credential, to
    /// check the server's `rspauth` (RFC 7616 §3.5).
    var digestSent: (authorization: DigestAuthorization, credential: PasswordCredential)?
    /// The Basic challenge answered said `charset="UTF-8"`, so the credential went NFC-normalised
    /// (RFC 7617 §2.1): preemptive answers in that space go the same way, byte for byte.
    var basicCharsetUTF8 = false
    /// The Digest session started from this request's own fresh challenge, shared for preemptive
    /// answers only once the server accepted it.
    var freshDigestSession: DigestSession?
    /// The SPNEGO context whose token the latest attempt carried (Negotiate, RFC 4559).
    var negotiate: NegotiateContext?
    /// The stored password this request is trying for the first time at its space, and the
    /// trial's id (`PasswordTrial`): its verdict goes to the requests that wait for it.
    var trial: (key: PasswordTrialKey, id: UInt64)?
    /// That token was sent before any challenge (to a server that took one before).
    var negotiatePreemptive = false
    /// A fresh Negotiate answer of this request was refused: it makes no other.
    var negotiateRefused = false
    /// Why no Negotiate token could be made for this request's challenger, or why it was
    /// refused, if so.
    var negotiateFailure: KerberosFailure?
    /// 401s (407s) that answered a Negotiate token of this request: they say nothing about a
    /// stored password, so `AuthAttemptPolicy` does not count them.
    var negotiateRounds = 0

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

    /// The state of a request's authentication to the upstream proxy: the client authorised it
    /// itself when it sent `Proxy-Authorization` (which the broker then forwards to the configured
    /// proxy, and never replaces with a stored one).
    package init(proxyAuthorization: String?) {
        if proxyAuthorization != nil { self.lastAttempt = .clientCredential }
    }
}

/// Answers Basic and Digest challenges from the vault, in the daemon (DESIGN.md:
/// CredentialResolver): origins' 401s (`WWW-Authenticate` → `Authorization`) and the upstream
/// proxy's 407s (`Proxy-Authenticate` → `Proxy-Authorization`, RFC 9110 §11.7), by one logic; each
/// call says which with `isProxy`, and a proxy's spaces are kept apart from origins' (`ProtectionSpace.isProxy`). Every challenge goes through the `@MainActor` `ChallengeBroker`, which
/// coalesces look-ups for one protection space; a credential is sent at most as
/// `AuthAttemptPolicy` allows, so a wrong stored password never loops or locks an account.
///
/// Once a space answered, later requests to it carry credentials up front: Basic for URIs under
/// the challenged one's directory (RFC 7617 §2.2), Digest with the remembered nonce and the next
/// `nc` under the challenge's `domain`, or anywhere on the origin without one (RFC 7616 §3.3), so
/// repeated requests skip the 401 round trip.
package final class HTTPAuthenticator: Sendable {
    private struct KnownSpace: Sendable {
        var space: ProtectionSpace
        /// Basic: the directory of the URI that was challenged; Digest: each path of
        /// `DigestChallenge.preemptionPaths`; a proxy's: "" (every request through the proxy).
        var pathPrefix: String
        /// Basic: the challenge said `charset="UTF-8"` (`RequestAuthState.basicCharsetUTF8`).
        var basicCharsetUTF8 = false
    }

    /// Whom the known spaces of one entry authenticate to: an origin, or the proxy at that address.
    private struct Authority: Hashable, Sendable {
        var origin: CanonicalOrigin
        var isProxy: Bool
    }

    /// Spaces remembered per origin for preemptive answers; the oldest is forgotten beyond this.
    static let maxKnownSpacesPerOrigin = 16
    /// How long a request waits for a challenge to be resolved (a store look-up, for now).
    static let resolveTimeout: Duration = .seconds(30)

    private let vault: PasswordVault
    /// Where challenges the store may answer, or an agent, are resolved (shared with server trust).
    private let challenges: AgentChallenges
    // Each table holds at most `maxAuthSpaces` entries (`[limits] max_auth_spaces`), the least
    // recently used forgotten first: an origin that varies its realm on every response must not
    // grow them without bound. Forgetting costs only a fresh challenge round trip.
    private let digestSessions: NIOLockedValueBox<BoundedTable<ProtectionSpace, DigestSession>>
    /// Per space, how many responses accepted a credential the broker sent: a refusal sent before
    /// a later acceptance is not evidence of a wrong password (`AuthAttemptPolicy`).
    private let acceptances: NIOLockedValueBox<BoundedTable<ProtectionSpace, UInt64>>
    private let knownSpaces: NIOLockedValueBox<BoundedTable<Authority, [KnownSpace]>>
    /// The Basic space whose 401 last went to the client, per origin: a credential the client
    /// then sends with `Authbroker-Persist` is kept for that realm.
    private let offeredToClient: NIOLockedValueBox<BoundedTable<CanonicalOrigin, ProtectionSpace>>
    /// Proxy passwords in doubt: a 407 in the proxy's space refused one the proxy had accepted
    /// before, on a plain-http request, where it may be an origin's (`ProxyPasswordDoubt`).
    private let proxyDoubts: NIOLockedValueBox<BoundedTable<ProtectionSpace, ProxyPasswordDoubt>>
    /// Stored passwords per space: proven (a server accepted them there) or on trial.
    private let trials: NIOLockedValueBox<PasswordTrialBook>
    private let trialIDs = Atomic<UInt64>(0)
    private let trialWait: Duration
    /// Answers Negotiate where `[kerberos]` allows; nil: never (tests without Kerberos).
    package let kerberos: KerberosNegotiator?
    /// Challengers that accepted a Kerberos token, with the directories of the URIs they took it
    /// for (the proxy's: "", every request): later requests under one carry a token up front.
    /// Scoped like Basic (RFC 7617 §2.2): a fresh context costs both sides work, and a server's
    /// open paths would only ignore it.
    private let negotiateKnown: NIOLockedValueBox<BoundedTable<Authority, [String]>>
    /// Counts what `knownSpaces` and `negotiateKnown` have learnt: a caller told no space is
    /// known at an origin may keep that answer while this count stays (`spacesLearnt`).
    private let learnt = Atomic<UInt64>(0)
    private let audit: AuditLog?
    private let logger: Logger

    /// Entries per table by default (`[limits] max_auth_spaces`).
    package static let defaultMaxAuthSpaces = BrokerSettings.Limits().maxAuthSpaces

    package init(
        vault: PasswordVault, challenges: AgentChallenges, audit: AuditLog? = nil, kerberos: KerberosNegotiator? = nil,
        maxAuthSpaces: Int = HTTPAuthenticator.defaultMaxAuthSpaces, trialWait: Duration = HTTPAuthenticator.defaultTrialWait,
        logger: Logger
    ) {
        self.kerberos = kerberos
        self.trialWait = trialWait
        self.negotiateKnown = NIOLockedValueBox(BoundedTable(capacity: maxAuthSpaces))
        self.digestSessions = NIOLockedValueBox(BoundedTable(capacity: maxAuthSpaces))
        self.acceptances = NIOLockedValueBox(BoundedTable(capacity: maxAuthSpaces))
        self.knownSpaces = NIOLockedValueBox(BoundedTable(capacity: maxAuthSpaces))
        self.proxyDoubts = NIOLockedValueBox(BoundedTable(capacity: maxAuthSpaces))
        self.trials = NIOLockedValueBox(PasswordTrialBook(trials: BoundedTable(capacity: maxAuthSpaces)))
        self.offeredToClient = NIOLockedValueBox(BoundedTable(capacity: maxAuthSpaces))
        self.vault = vault
        self.challenges = challenges
        self.audit = audit
        self.logger = logger
    }

    // MARK: - Before sending

    /// Sets `state.authorization` when a known space covers `uri` and its credential is usable.
    ///
    /// - Parameters:
    ///   - origin: the origin, or with `isProxy` the proxy's address.
    ///   - uri: the request-target as sent to whoever challenges (absolute-form through a proxy,
    ///     `host:port` for CONNECT), which Digest hashes.
    package func authorizePreemptively(
        origin: CanonicalOrigin, method: HTTPMethod, uri: String, isProxy: Bool = false, requester: () -> Requester? = { nil },
        state: inout RequestAuthState
    ) {
        guard state.lastAttempt == .noCredentials, let known = self.knownSpace(Authority(origin: origin, isProxy: isProxy), uri: uri),
            let answer = self.vault.cachedCredential(for: known.space), AuthAttemptPolicy.mayPreempt(stored: answer.state)
        else { return }
        let space = known.space
        if space.authScheme == "basic", self.vault.isDigestOnly(origin: space.origin, user: answer.credential.user, storedRealm: answer.realm) { return }
        if isProxy, method != .CONNECT, self.isDoubted(space, answer.credential, uri: uri) { return }
        // Up front only what a server accepted here: a password stored since (a replacement)
        // goes on trial after a challenge, one request at a time.
        guard self.isProven(PasswordTrialKey(space: space, user: answer.credential.user, storedRealm: answer.realm), answer.credential) else { return }
        do {
            if space.authScheme == "basic" {
                state.authorization = try BasicAuthorization.headerValue(for: answer.credential, charsetUTF8: known.basicCharsetUTF8)
                state.basicCharsetUTF8 = known.basicCharsetUTF8
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
            state.storedRealm = answer.realm
            state.acceptancesWhenSent = self.acceptanceCount(space)
            self.audit?.record(.credentialUsed(space: space, user: answer.credential.user, requester: requester()))
            FlowCapture.current?.credentialUsed(space, user: answer.credential.user)
        } catch {
            self.logger.debug("no preemptive authorization", metadata: ["space": "\(space)", "error": "\((error as? HTTPAuthError)?.code ?? "\(error)")"])
        }
    }

    /// How many spaces and Kerberos directories have been learnt so far. Read it before
    /// `knowsSpaces(at:)`: while it has not moved, a false from there still holds (the direct
    /// relay asks once per origin, not on every request).
    package var spacesLearnt: UInt64 { self.learnt.load(ordering: .acquiring) }

    /// Whether any request to `origin` may get a credential up front (a space there answered
    /// before): such requests need the full path, which adds it.
    package func knowsSpaces(at origin: CanonicalOrigin) -> Bool {
        self.knownSpaces.withLockedValue { known in known[Authority(origin: origin, isProxy: false)]?.isEmpty == false }
            || self.knowsNegotiate(at: origin)
    }

    /// Whether `challenger` accepted a Kerberos token before (and still may get one).
    package func knowsNegotiate(at challenger: CanonicalOrigin, isProxy: Bool = false) -> Bool {
        self.kerberos != nil && self.negotiateKnown.withLockedValue { $0.peek(Authority(origin: challenger, isProxy: isProxy))?.isEmpty == false }
    }

    /// Whether a request for `uri` to `challenger` falls under a directory that took a token.
    private func negotiateCovers(_ challenger: CanonicalOrigin, isProxy: Bool, uri: String) -> Bool {
        let path = Self.path(of: uri)
        return self.negotiateKnown.withLockedValue { known in
            known[Authority(origin: challenger, isProxy: isProxy)]?.contains { path.hasPrefix($0) } == true
        }
    }

    /// Sets `state.authorization` to a fresh Negotiate token when `challenger` accepted one
    /// before: such a server would only answer 401 first. Runs the GSS-API step off the event
    /// loops; a failure here only means no token up front (the 401 then says why).
    package func negotiatePreemptively(
        _ challenger: CanonicalOrigin, isProxy: Bool = false, uri: String, requester: Requester?, state: inout RequestAuthState
    ) async {
        guard state.lastAttempt == .noCredentials, state.authorization == nil, let kerberos = self.kerberos,
            self.negotiateCovers(challenger, isProxy: isProxy, uri: uri),
            case .answer(let delegate) = kerberos.policy.decide(challenger, isProxy: isProxy),
            case .success(let started) = await kerberos.start(for: challenger, delegate: delegate)
        else { return }
        self.sendNegotiate(started, to: challenger, isProxy: isProxy, preemptive: true, requester: requester, state: &state)
    }

    private func sendNegotiate(
        _ started: KerberosNegotiator.Started, to challenger: CanonicalOrigin, isProxy: Bool, preemptive: Bool,
        requester: Requester?, state: inout RequestAuthState
    ) {
        state.authorization = started.authorization
        state.negotiate = started.context
        state.negotiatePreemptive = preemptive
        state.negotiateFailure = nil
        FlowCapture.current?.credentialUsed(
            ProtectionSpace(origin: challenger, realm: "", authScheme: "negotiate", isProxy: isProxy), user: started.principal
        )
        self.audit?.record(
            .ticketUsed(
                challenger: challenger, service: started.context.serviceName, principal: started.principal, isProxy: isProxy,
                delegated: started.delegated, requester: requester
            )
        )
    }

    /// Answers a Negotiate challenge when `[kerberos]` allows the challenger: true to resend
    /// with `state.authorization`; nil to go on with the Basic and Digest challenges (none was
    /// made, and `state.negotiateFailure` may say why).
    private func answerNegotiate(
        _ challenges: [AuthChallenge], challenger: CanonicalOrigin, isProxy: Bool, requester: Requester?, state: inout RequestAuthState
    ) async -> Bool? {
        guard let kerberos = self.kerberos, let offer = NegotiatePolicy.offer(in: challenges) else { return nil }
        let delegate: Bool
        switch kerberos.policy.decide(challenger, isProxy: isProxy) {
        case .answer(let delegating): delegate = delegating
        case .refuse(let refusal):
            self.logger.debug("Negotiate not answered", metadata: ["host": "\(challenger.host)", "reason": "\(refusal.rawValue)"])
            return nil
        }
        if let context = state.negotiate {
            // The challenge answers the token this request sent: a multi-step context goes on
            // with the server's token; anything else is a refusal.
            state.negotiate = nil
            state.authorization = nil
            state.negotiateFailure = KerberosFailure(.refusedByServer, detail: "it answered the ticket with a 401", service: context.serviceName)
            if let token = offer.serverToken {
                switch await kerberos.step(context, serverToken: token, challenger: challenger) {
                case .success(let authorization?):
                    state.authorization = authorization
                    state.negotiate = context
                    state.negotiateFailure = nil
                    return true
                case .success(nil):
                    break
                case .failure(let failure):
                    state.negotiateFailure = failure
                }
            }
            // A refused token sent up front gets one fresh context; a refused fresh one, none.
            if !state.negotiatePreemptive { state.negotiateRefused = true }
            self.negotiateKnown.withLockedValue { $0[Authority(origin: challenger, isProxy: isProxy)] = nil }
            self.logger.notice(
                "the server refused the Kerberos token",
                metadata: ["host": "\(challenger.host)", "preemptive": "\(state.negotiatePreemptive)"]
            )
        }
        guard !state.negotiateRefused else { return nil }
        switch await kerberos.start(for: challenger, delegate: delegate) {
        case .success(let started):
            self.sendNegotiate(started, to: challenger, isProxy: isProxy, preemptive: false, requester: requester, state: &state)
            return true
        case .failure(let failure):
            state.negotiateFailure = failure
            if failure.kind == .noTicket || failure.kind == .ticketExpired { self.tellAgentsTicketNeeded(challenger) }
            return nil
        }
    }

    /// How often agents hear that a ticket is missing, at most: a desktop agent turns each
    /// notice into a notification, and every request to a Kerberos host would raise one.
    static let ticketNoticeInterval: Duration = .seconds(60)
    private let lastTicketNotice = NIOLockedValueBox<ContinuousClock.Instant?>(nil)

    private func tellAgentsTicketNeeded(_ challenger: CanonicalOrigin) {
        let now = ContinuousClock.now
        let due = self.lastTicketNotice.withLockedValue { last in
            if let previous = last, previous.duration(to: now) < Self.ticketNoticeInterval { return false }
            last = now
            return true
        }
        guard due else { return }
        let notice = AgentNotice(
            code: BrokerErrorCode.kerberosTicketNeeded.rawValue, host: challenger.host,
            message: "\(challenger.host) asks for Kerberos and there is no valid ticket: run `kinit`."
        )
        let broker = self.challenges.broker
        Task { @MainActor in broker.notify(notice) }
    }

    /// A response other than a 401 (for the proxy, a 407) answered a Negotiate token: the
    /// challenger takes tokens up front from now on, and a token in the response must prove the
    /// server's identity (mutual authentication, RFC 4559 §5). Returns the failure when it does not.
    package func negotiateAccepted(
        _ head: HTTPResponseHead, challenger: CanonicalOrigin, isProxy: Bool, uri: String, state: RequestAuthState
    ) async -> KerberosFailure? {
        guard let kerberos = self.kerberos, let context = state.negotiate else { return nil }
        let authority = Authority(origin: challenger, isProxy: isProxy)
        let field = isProxy ? "Proxy-Authenticate" : "WWW-Authenticate"
        if let token = NegotiatePolicy.offer(in: AuthChallenge.parse(fieldValues: head.headers[field]))?.serverToken,
            case .failure(let failure) = await kerberos.verify(context, serverToken: token, challenger: challenger)
        {
            self.negotiateKnown.withLockedValue { $0[authority] = nil }
            return failure
        }
        kerberos.accepted()
        let prefix = isProxy ? "" : Self.directory(of: uri)
        self.negotiateKnown.withLockedValue { known in
            var prefixes = known[authority] ?? []
            guard !prefixes.contains(where: { prefix.hasPrefix($0) }) else { return }
            prefixes.removeAll { $0.hasPrefix(prefix) }
            prefixes.append(prefix)
            if prefixes.count > Self.maxKnownSpacesPerOrigin { prefixes.removeFirst(prefixes.count - Self.maxKnownSpacesPerOrigin) }
            known[authority] = prefixes
        }
        self.learnt.add(1, ordering: .releasing)
        return nil
    }

    // MARK: - After a 401

    /// Decides what to do with a 401 (or, with `isProxy`, the proxy's 407): true when the request
    /// should be sent again with `state.authorization` (the stored credential's answer); false to
    /// give the client the 401/407.
    ///
    /// - Parameters:
    ///   - resendableBody: the request body when the request can be sent again (nil: it cannot):
    ///     its bytes when they were kept, or `.unavailable` when they were never sent (held for
    ///     `Expect: 100-continue`), which rules out `auth-int`.
    ///   - agentWait: how long the request may wait for an agent when the store has nothing (nil: not).
    package func answerChallenge(
        _ head: HTTPResponseHead, origin: CanonicalOrigin, method: HTTPMethod, uri: String,
        resendableBody: DigestEntityBody?, isProxy: Bool = false, agentWait: Duration? = nil, requester: Requester? = nil,
        state: inout RequestAuthState
    ) async -> Bool {
        // Counted after this answer is decided, like `previousFailures`: a 401 to a Negotiate
        // token says nothing about a stored password.
        let answersNegotiateToken = state.negotiate != nil
        defer {
            state.previousFailures += 1
            if answersNegotiateToken { state.negotiateRounds += 1 }
        }
        guard head.status == Self.challengeStatus(isProxy: isProxy), state.lastAttempt != .clientCredential else { return false }
        let challenges = AuthChallenge.parse(fieldValues: head.headers[isProxy ? "Proxy-Authenticate" : "WWW-Authenticate"])
        // Negotiate first, as browsers do: a ticket sends no password at all. Only with a body
        // that can go again, as for Basic and Digest.
        if resendableBody != nil,
            let answered = await self.answerNegotiate(challenges, challenger: origin, isProxy: isProxy, requester: requester, state: &state)
        {
            return answered
        }
        // Whatever answers now, it is not that token.
        state.negotiate = nil
        guard let choice = ChallengeSelection.preferred(challenges) else { return false }
        let space = ProtectionSpace(origin: origin, challenge: choice.challenge, isProxy: isProxy)

        var stale = false
        // The stale nonce was this request's own (a fresh answer not accepted yet), not the
        // shared session's.
        var staleOwnSession = false
        if case .digest(let digest, _) = choice, state.space == space {
            if var own = state.freshDigestSession, digest.stale, digest.realm == own.challenge.realm {
                // RFC 7616 §3.3: stale means the password was right and the nonce too old (the
                // person behind an agent took longer than the server's nonce lifetime).
                stale = own.challenge(digest) == .staleNonce
                staleOwnSession = stale
                state.freshDigestSession = own
            } else {
                // Only a stale nonce moves the shared session to the new one; after any other
                // refusal the request answers with a session of its own (shared once accepted),
                // so that concurrent requests keep counting on the nonce that works.
                stale = self.digestSessions.withLockedValue { sessions in
                    guard var session = sessions[space], digest.stale, digest.realm == session.challenge.realm else { return false }
                    defer { sessions[space] = session }
                    return session.challenge(digest) == .staleNonce
                }
            }
        }

        let resolution = await self.challenges.broker.resolve(
            .http(space), interactive: agentWait != nil, timeout: agentWait ?? Self.resolveTimeout, requester: requester
        )
        let answer: StoredAnswer? = if case .answered(.credential(let answer)) = resolution { answer } else { nil }
        let acceptedSinceSent = state.space == space && self.acceptanceCount(space) > state.acceptancesWhenSent
        // A challenge for another space than the one this request's credential was sent for (a
        // preemptive Digest answer met by a Basic challenge, another realm) says nothing about
        // that credential: it is a first challenge for this space.
        let lastAttempt = state.space == nil || state.space == space ? state.lastAttempt : .noCredentials
        let decision = AuthAttemptPolicy.decide(
            previousFailures: state.previousFailures - state.negotiateRounds, lastAttempt: lastAttempt, stored: answer?.state ?? .none,
            challengeIsStale: stale, staleRetries: state.staleRetries, acceptedSinceSent: acceptedSinceSent,
            retriesAfterAcceptance: state.retriesAfterAcceptance
        )
        switch decision {
        case .passToClient:
            if space.authScheme == "basic", !isProxy {
                self.offeredToClient.withLockedValue { $0[origin] = space }
            }
            return false
        case .markStoredFailedAndPassToClient:
            let (user, storedRealm) = state.user.map { ($0, state.storedRealm) } ?? (answer?.credential.user ?? "", answer?.realm)
            if isProxy, method != .CONNECT, self.acceptanceCount(space) > 0 {
                // Through the proxy in absolute form, a 407 may be the origin's in the proxy's
                // realm; a password the proxy has accepted is not condemned on its word. Only a
                // 407 to CONNECT is surely the proxy's. It is held back meanwhile, so that a
                // password changed at the proxy is not refused once per request (an account
                // locked out after a handful).
                let credential = answer?.credential ?? PasswordCredential(user: user, password: "")
                let holds = self.doubt(space, credential, uri: uri)
                self.refused(PasswordTrialKey(space: space, user: user, storedRealm: storedRealm), state: &state)
                self.logger.notice(
                    holds.everywhere
                        ? "a 407 in the proxy's realm refused its password for a second origin; it is sent for plain http again once the proxy accepts it for an https request (CONNECT) or it is replaced"
                        : "a 407 in the proxy's realm refused a password the proxy accepted before; passed to the client, the password kept but not sent for this origin until the proxy accepts it again",
                    metadata: ["space": "\(space)", "user": "\(user)", "origin": "\(holds.origin.map { "\($0)" } ?? "-")"]
                )
                return false
            }
            self.vault.markFailed(origin: space.origin, user: user, storedRealm: storedRealm)
            self.forget(space)
            self.refused(PasswordTrialKey(space: space, user: user, storedRealm: storedRealm), state: &state)
            self.logger.notice(
                "the server refused the stored password; it is not sent again until it is changed",
                metadata: ["space": "\(space)", "user": "\(user)"]
            )
            return false
        case .answerFromStore:
            guard let answer, let body = resendableBody else { return false }
            if isProxy, method != .CONNECT, self.isDoubted(space, answer.credential, uri: uri) {
                self.logger.debug("the proxy's password is in doubt for this origin; the client gets the 407", metadata: ["space": "\(space)"])
                return false
            }
            if case .basic = choice, self.vault.isDigestOnly(origin: space.origin, user: answer.credential.user, storedRealm: answer.realm) {
                // A downgrade: the server (or someone on the path) now offers only Basic for a
                // password it took as a Digest answer before. Basic would send it in the clear.
                self.logger.warning(
                    "not sending as Basic a password that was answered with Digest before; the client gets the 401",
                    metadata: ["space": "\(space)", "user": "\(answer.credential.user)"]
                )
                return false
            }
            let trialKey = PasswordTrialKey(space: space, user: answer.credential.user, storedRealm: answer.realm)
            guard await self.admitToTrial(trialKey, answer.credential, state: &state) else {
                self.logger.debug("another request's try of this password was refused; the client gets the challenge", metadata: ["space": "\(space)"])
                return false
            }
            do {
                switch choice {
                case .basic(let challenge):
                    state.authorization = try BasicAuthorization.headerValue(for: answer.credential, challenge: challenge)
                    state.basicCharsetUTF8 = BasicAuthorization.charsetIsUTF8(challenge)
                case .digest(let digest, _):
                    let own = staleOwnSession ? state.freshDigestSession : nil
                    let authorization = try self.digestSessions.withLockedValue { sessions throws(HTTPAuthError) in
                        var session = own ?? (stale ? (sessions[space] ?? DigestSession(protectionSpace: space, challenge: digest))
                            : DigestSession(protectionSpace: space, challenge: digest))
                        let authorization = try session.authorization(
                            credential: answer.credential, method: method.rawValue, uri: uri, body: body
                        )
                        // A fresh nonce stays this request's own until the server accepts the
                        // answer (`responseAccepted`): shared at once, concurrent preemptive
                        // requests would send higher counts that overtake this nc=1.
                        if stale && own == nil {
                            sessions[space] = session
                            state.freshDigestSession = nil
                        } else {
                            state.freshDigestSession = session
                        }
                        return authorization
                    }
                    state.authorization = authorization.headerValue
                    state.digestSent = (authorization, answer.credential)
                }
            } catch {
                self.logger.notice("cannot answer the challenge", metadata: ["space": "\(space)", "error": "\((error as? HTTPAuthError)?.code ?? "\(error)")"])
                self.releaseTrial(of: &state)
                return false
            }
            if stale {
                state.staleRetries += 1
            } else if acceptedSinceSent {
                state.retriesAfterAcceptance += 1
                self.logger.debug("the server refused a password it accepted meanwhile; answering afresh", metadata: ["space": "\(space)"])
            }
            state.lastAttempt = .storedCredential
            state.space = space
            state.user = answer.credential.user
            state.storedRealm = answer.realm
            state.acceptancesWhenSent = self.acceptanceCount(space)
            self.audit?.record(.credentialUsed(space: space, user: answer.credential.user, requester: requester))
            FlowCapture.current?.credentialUsed(space, user: answer.credential.user)
            return true
        }
    }

    // MARK: - After the final response

    /// A response other than a 401 (for the proxy: other than a 407) ended a request the broker
    /// authorised: the space is known from now on, and Digest takes the server's `nextnonce`.
    ///
    /// - Parameter fromBeyondProxy: the head came through the proxy from an origin (a plain-http
    ///   request): its `Proxy-Authentication-Info` may be the origin's as well as the proxy's, so
    ///   it is taken only when its `rspauth` proves it the proxy's (only a party that knows the
    ///   password can make one); otherwise it is ignored, neither followed nor held against the
    ///   proxy.
    package func responseAccepted(
        _ head: HTTPResponseHead, origin: CanonicalOrigin, uri: String, fromBeyondProxy: Bool = false, state: RequestAuthState
    ) {
        if state.lastAttempt == .clientCredential, let credential = state.clientCredential, let persist = state.persist,
            (200..<400).contains(head.status.code)
        {
            self.keepClientCredential(credential, origin: origin, persistence: persist)
        }
        guard let space = state.space, state.lastAttempt != .clientCredential,
            head.status != Self.challengeStatus(isProxy: space.isProxy)
        else { return }
        var info = head.headers[space.authenticationInfoFieldName]
        if space.authScheme == "digest", !info.isEmpty, let sent = state.digestSent {
            let verdict = self.digestSessions.withLockedValue { sessions in
                (state.freshDigestSession ?? sessions[space])?.challenge.verifyResponseAuth(
                    AuthenticationInfo(parsing: info), credential: sent.credential, authorization: sent.authorization
                )
            }
            if fromBeyondProxy {
                if verdict != .verified { info = [] }
            } else if verdict == .mismatch {
                // The server did not prove it knows the password: stop trusting this space.
                self.forget(space)
                self.logger.warning(
                    "the server's rspauth does not match the request; its space is no longer answered preemptively",
                    metadata: ["space": "\(space)"]
                )
                return
            }
        } else if fromBeyondProxy {
            info = []
        }
        if space.authScheme == "digest" {
            if let user = state.user, state.lastAttempt == .storedCredential || state.lastAttempt == .preemptiveDigest {
                self.vault.noteAnsweredWithDigest(origin: space.origin, user: user, storedRealm: state.storedRealm)
            }
            self.digestSessions.withLockedValue { sessions in
                if let fresh = state.freshDigestSession { sessions[space] = fresh }
                if !info.isEmpty { sessions[space]?.accept(authenticationInfo: AuthenticationInfo(parsing: info)) }
            }
        }
        self.acceptances.withLockedValue { $0.update(space, default: 0) { $0 &+= 1 } }
        if let trial = state.trial, trial.key.space == space { self.provenByTrial(trial) }
        // A response other than its 407 came through the proxy for a request carrying the
        // password: the proxy took it.
        if space.isProxy, state.lastAttempt == .storedCredential || state.lastAttempt == .preemptiveDigest {
            self.proxyDoubts.withLockedValue { $0[space] = nil }
        }
        // A proxy's credentials are for every request through it (RFC 9110 §11.7.2); Basic's for
        // the request's directory (RFC 7617 §2.2); Digest's for the challenge's `domain`.
        let prefixes: [String]
        if space.isProxy {
            prefixes = [""]
        } else if space.authScheme == "basic" {
            prefixes = [Self.directory(of: uri)]
        } else {
            let challenge = self.digestSessions.withLockedValue { $0[space]?.challenge }
            prefixes = challenge?.preemptionPaths(origin: origin, requestPath: Self.path(of: uri)) ?? [Self.path(of: uri)]
        }
        let authority = Authority(origin: origin, isProxy: space.isProxy)
        self.knownSpaces.withLockedValue { known in
            var list = known[authority] ?? []
            list.removeAll { $0.space == space && prefixes.contains($0.pathPrefix) }
            list += prefixes.map { KnownSpace(space: space, pathPrefix: $0, basicCharsetUTF8: state.basicCharsetUTF8) }
            if list.count > Self.maxKnownSpacesPerOrigin { list.removeFirst(list.count - Self.maxKnownSpacesPerOrigin) }
            known[authority] = list
        }
        self.learnt.add(1, ordering: .releasing)
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
                logger.notice("could not keep the credential the client supplied", metadata: ["origin": "\(origin)", "error": "\((error as? BrokerError)?.code.rawValue ?? "\(error)")"])
            }
        }
    }

    /// Whether a 407 that came back on an absolute-form request through `proxy` is the proxy's
    /// own challenge: one in a space the proxy presented and accepted before, or any while none
    /// is known yet. An origin behind the proxy can answer 407 too; in another realm that is an
    /// ordinary response for the client, never a refusal of the proxy's password.
    package func isOwnChallenge(ofProxy proxy: CanonicalOrigin, _ head: HTTPResponseHead) -> Bool {
        let known = self.knownSpaces.withLockedValue { $0.peek(Authority(origin: proxy, isProxy: true)) ?? [] }
        guard !known.isEmpty else { return true }
        guard let choice = ChallengeSelection.preferred(AuthChallenge.parse(fieldValues: head.headers["Proxy-Authenticate"])) else {
            return false
        }
        let space = ProtectionSpace(origin: proxy, challenge: choice.challenge, isProxy: true)
        return known.contains { $0.space == space }
    }

    // MARK: - Helpers

    /// How many entries each remembered table holds now (for `/v1/status`-style checks and tests).
    package var rememberedCounts: (
        digestSessions: Int, acceptances: Int, authorities: Int, offeredToClient: Int, trials: Int, trialWaiters: Int, proxyDoubts: Int
    ) {
        let (trials, waiters) = self.trials.withLockedValue { ($0.trials.count, $0.waiters.values.reduce(0) { $0 + $1.count }) }
        return (
            self.digestSessions.withLockedValue { $0.count }, self.acceptances.withLockedValue { $0.count },
            self.knownSpaces.withLockedValue { $0.count }, self.offeredToClient.withLockedValue { $0.count }, trials, waiters,
            self.proxyDoubts.withLockedValue { $0.count }
        )
    }

    /// How long a request waits for another's try of the same stored password before trying it
    /// itself, by default: that request's answer normally comes in well under this.
    package static let defaultTrialWait: Duration = .seconds(10)

    /// Whether `credential` is the password a server accepted at `key`'s space.
    private func isProven(_ key: PasswordTrialKey, _ credential: PasswordCredential) -> Bool {
        self.trials.withLockedValue { $0.trials.peek(key).map { $0.isProven && $0.credential == credential } ?? false }
    }

    /// Whether this request may send `credential` at `key`'s space now: it is proven there, this
    /// request is its trial (a stale nonce answered again), it becomes the trial, or the trial
    /// under way was accepted. False: the trial under way was refused, or the password has been
    /// marked refused since this request looked it up.
    private func admitToTrial(_ key: PasswordTrialKey, _ credential: PasswordCredential, state: inout RequestAuthState) async -> Bool {
        while true {
            if self.vault.isMarkedFailed(origin: key.space.origin, realm: key.storedRealm, user: key.user) { return false }
            let id = self.trialIDs.add(1, ordering: .relaxed).newValue
            enum Standing { case proceed, trying, wait(UInt64) }
            let ownTrial = state.trial?.id
            let (standing, released) = self.trials.withLockedValue { book -> (Standing, [CheckedContinuation<Bool?, Never>]) in
                if let trial = book.trials[key], trial.credential == credential {
                    if trial.isProven { return (.proceed, []) }
                    if let owner = trial.owner, owner == ownTrial { return (.proceed, []) }
                    if let owner = trial.owner { return (.wait(owner), []) }
                }
                // No trial of this password yet, or one of a password since replaced, whose
                // waiters now try the new one themselves.
                let released = book.trials.peek(key) == nil ? [] : book.takeWaiters(of: key)
                book.trials[key] = PasswordTrial(credential: credential, owner: id)
                return (.trying, released)
            }
            for waiter in released { waiter.resume(returning: nil) }
            switch standing {
            case .proceed:
                return true
            case .trying:
                state.trial = (key, id)
                return true
            case .wait(let owner):
                switch await self.verdict(of: owner, at: key, waiter: id) {
                case true?: return true
                case false?: return false
                case nil:
                    if Task.isCancelled { return false }
                    // No verdict: this request tries it itself, unless another took over.
                    let tookOver = self.trials.withLockedValue { book -> Bool in
                        guard var trial = book.trials.peek(key), trial.owner == owner else { return false }
                        trial.owner = id
                        book.trials[key] = trial
                        return true
                    }
                    if tookOver {
                        state.trial = (key, id)
                        return true
                    }
                }
            }
        }
    }

    /// Waits for the verdict of trial `owner` at `key`, at most `trialWait`.
    private func verdict(of owner: UInt64, at key: PasswordTrialKey, waiter: UInt64) async -> Bool? {
        let timeout = Task {
            try? await Task.sleep(for: self.trialWait)
            self.dropWaiter(waiter, at: key)
        }
        defer { timeout.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let registered = self.trials.withLockedValue { book -> Bool in
                    guard !Task.isCancelled, book.trials.peek(key)?.owner == owner else { return false }
                    book.waiters[key, default: [:]][waiter] = continuation
                    return true
                }
                if !registered { continuation.resume(returning: nil) }
            }
        } onCancel: {
            self.dropWaiter(waiter, at: key)
        }
    }

    private func dropWaiter(_ waiter: UInt64, at key: PasswordTrialKey) {
        let continuation = self.trials.withLockedValue { book -> CheckedContinuation<Bool?, Never>? in
            guard let continuation = book.waiters[key]?.removeValue(forKey: waiter) else { return nil }
            if book.waiters[key]?.isEmpty == true { book.waiters[key] = nil }
            return continuation
        }
        continuation?.resume(returning: nil)
    }

    /// A server accepted what this request's trial sent: the password is proven at its space,
    /// and the requests waiting send it too.
    private func provenByTrial(_ trial: (key: PasswordTrialKey, id: UInt64)) {
        let waiters = self.trials.withLockedValue { book -> [CheckedContinuation<Bool?, Never>] in
            guard var entry = book.trials.peek(trial.key), entry.owner == trial.id else { return [] }
            entry.owner = nil
            book.trials[trial.key] = entry
            return book.takeWaiters(of: trial.key)
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    /// A server refused the password stored at `key`: it is neither proven nor on trial there
    /// any more (whoever sent it), and the requests waiting give the client the challenge.
    private func refused(_ key: PasswordTrialKey, state: inout RequestAuthState) {
        state.trial = nil
        let waiters = self.trials.withLockedValue { book -> [CheckedContinuation<Bool?, Never>] in
            book.trials[key] = nil
            return book.takeWaiters(of: key)
        }
        for waiter in waiters { waiter.resume(returning: false) }
    }

    /// This request's trial ends without a verdict (it cannot answer after all): the next
    /// request tries the password at once instead of waiting out `trialWait`.
    private func releaseTrial(of state: inout RequestAuthState) {
        guard let trial = state.trial else { return }
        state.trial = nil
        self.abandon(trial)
    }

    /// The request is over; a trial it still holds ended without a verdict (its client left,
    /// its connection failed, its next answer went to the client): released as by
    /// `releaseTrial`. Every shell calls it once per request and per state (origin and proxy).
    package func requestEnded(_ state: RequestAuthState) {
        if let trial = state.trial { self.abandon(trial) }
    }

    private func abandon(_ trial: (key: PasswordTrialKey, id: UInt64)) {
        let waiters = self.trials.withLockedValue { book -> [CheckedContinuation<Bool?, Never>] in
            guard let entry = book.trials.peek(trial.key), entry.owner == trial.id else { return [] }
            book.trials[trial.key] = nil
            return book.takeWaiters(of: trial.key)
        }
        for waiter in waiters { waiter.resume(returning: nil) }
    }

    /// Records that a 407 in the proxy's `space` refused `credential` for the origin `uri` names;
    /// returns that origin and whether the password is now held back for every origin.
    private func doubt(_ space: ProtectionSpace, _ credential: PasswordCredential, uri: String) -> (origin: CanonicalOrigin?, everywhere: Bool) {
        let origin = Self.originBeyondProxy(uri)
        let changes = self.vault.changes
        return self.proxyDoubts.withLockedValue { doubts in
            var doubt =
                doubts[space].flatMap { $0.credential == credential && $0.vaultChanges == changes ? $0 : nil }
                ?? ProxyPasswordDoubt(credential: credential, vaultChanges: changes)
            if let origin { doubt.origins.insert(origin) }
            doubts[space] = doubt
            return (origin, doubt.everywhere)
        }
    }

    /// Whether `credential` is held back for the proxy's `space` on a request to the origin `uri`
    /// names (`ProxyPasswordDoubt`).
    private func isDoubted(_ space: ProtectionSpace, _ credential: PasswordCredential, uri: String) -> Bool {
        self.proxyDoubts.withLockedValue { doubts in
            guard let doubt = doubts.peek(space), doubt.credential == credential, doubt.vaultChanges == self.vault.changes else { return false }
            return doubt.everywhere || Self.originBeyondProxy(uri).map { doubt.origins.contains($0) } ?? true
        }
    }

    /// The origin of an absolute-form request target (a plain-http request through the proxy).
    private static func originBeyondProxy(_ uri: String) -> CanonicalOrigin? {
        guard case .success(.absolute(let origin, _)) = RequestTarget.parse(method: "GET", uri: uri) else { return nil }
        return origin
    }

    private func acceptanceCount(_ space: ProtectionSpace) -> UInt64 {
        self.acceptances.withLockedValue { $0.peek(space) ?? 0 }
    }

    /// The known space whose prefix covers `uri` most narrowly.
    private func knownSpace(_ authority: Authority, uri: String) -> KnownSpace? {
        let path = Self.path(of: uri)
        return self.knownSpaces.withLockedValue { known in
            known[authority]?.filter { path.hasPrefix($0.pathPrefix) }.max { $0.pathPrefix.count < $1.pathPrefix.count }
        }
    }

    private func forget(_ space: ProtectionSpace) {
        self.digestSessions.withLockedValue { $0[space] = nil }
        self.knownSpaces.withLockedValue { known in
            let authority = Authority(origin: space.origin, isProxy: space.isProxy)
            if var list = known.peek(authority) {
                list.removeAll { $0.space == space }
                known[authority] = list
            }
        }
    }

    /// 407 for a proxy's challenge (RFC 9110 §15.5.8), 401 for an origin's.
    static func challengeStatus(isProxy: Bool) -> HTTPResponseStatus {
        isProxy ? .proxyAuthenticationRequired : .unauthorized
    }

    /// "/a/b/c?x" → "/a/b/c".
    static func path(of uri: String) -> String {
        uri.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? uri
    }

    /// "/a/b/c?x" → "/a/b/": RFC 7617 §2.2's reuse scope.
    static func directory(of uri: String) -> String {
        let path = Self.path(of: uri)
        guard let slash = path.lastIndex(of: "/") else { return "/" }
        return String(path[...slash])
    }
}
