import AuthBrokerCore
import AuthBrokerPAM
import Logging
import NIOConcurrencyHelpers

/// Re-authentication before a secret is revealed (DESIGN.md: PAM).
///
/// The daemon runs the PAM conversation for its own user; the client relays each prompt to
/// the person and posts the answer back, one control request per step. A success grants the
/// asking process (uid, pid, start time) a short window; failures make the next attempt wait
/// longer (`ReauthGrants`). PAM runs on its own threads (`PAMAuthenticator`), never here.
package final class ReauthService: Sendable {
    /// What a step of the dialogue ends with.
    package enum Step: Sendable {
        /// PAM asks something: answer it with `answer(transaction:…)`. `messages` are PAM's
        /// informational or error texts that came before the prompt.
        case prompt(transaction: UInt64, prompt: PAMPrompt, messages: [String])
        case granted(expiresInSeconds: Int, messages: [String])
        /// `code` is PAM's outcome code (`authentication_failed`, `timed_out`, …), `attempt_in_progress`
        /// or `system_error`.
        case refused(code: BrokerErrorCode, message: String, messages: [String])
        /// Too many failures: try again after this long.
        case retryAfter(Duration)
    }

    private let authenticator: PAMAuthenticator
    private let clock = ContinuousClock()
    private let grants: NIOLockedValueBox<ReauthGrants<ContinuousClock.Instant>>
    private let transactions = NIOLockedValueBox<[UInt64: ReauthTransaction]>([:])
    private let nextID = NIOLockedValueBox<UInt64>(1)
    private let logger: Logger

    package init(authenticator: PAMAuthenticator, policy: ReauthPolicy, logger: Logger) {
        self.authenticator = authenticator
        self.grants = NIOLockedValueBox(ReauthGrants(policy: policy))
        self.logger = logger
    }

    /// Whether `peer` holds a grant now.
    package func hasGrant(_ peer: PeerIdentity) -> Bool {
        let now = self.clock.now
        return self.grants.withLockedValue { $0.hasGrant(peer, now: now) }
    }

    /// Starts a PAM transaction for the daemon's user on behalf of `peer`.
    package func begin(for peer: PeerIdentity) async -> Step {
        let now = self.clock.now
        switch self.grants.withLockedValue({ $0.beginAttempt(peer, now: now) }) {
        case .retryAfter(let delay):
            return .retryAfter(delay)
        case .attemptInProgress:
            return .refused(
                code: .attemptInProgress,
                message: "Another re-authentication for your user is under way; finish or cancel it, then try again.",
                messages: []
            )
        case .allowed:
            break
        }
        guard let user = PAMAuthenticator.currentUserName() else {
            self.grants.withLockedValue { $0.recordAbandoned(peer) }
            return .refused(
                code: .systemError, message: "The daemon cannot find the name of the user it runs as (getpwuid failed).", messages: []
            )
        }
        let id = self.nextID.withLockedValue { id in
            defer { id += 1 }
            return id
        }
        let transaction = ReauthTransaction(id: id, peer: peer)
        self.transactions.withLockedValue { $0[id] = transaction }
        let authenticator = self.authenticator
        Task {
            let outcome = await authenticator.authenticate(user: user, responder: transaction)
            // Settled here, not when a client reads the outcome: a client that left mid-dialogue
            // (Ctrl-C at the prompt, a program that began and hung up) never reads it, and the
            // attempt would stay in progress, refusing every other one until a restart.
            self.settle(transaction, outcome)
            await transaction.finish(outcome)
        }
        return await self.next(transaction)
    }

    /// Ends the attempt in the grants as PAM ended it, and forgets the transaction.
    private func settle(_ transaction: ReauthTransaction, _ outcome: PAMOutcome) {
        self.transactions.withLockedValue { $0[transaction.id] = nil }
        let now = self.clock.now
        switch outcome {
        case .success:
            self.grants.withLockedValue { $0.recordSuccess(transaction.peer, now: now) }
            self.logger.info("re-authenticated; secrets may be revealed to this process for a while", metadata: ["peer": "\(transaction.peer)"])
        case .failure(let error):
            self.grants.withLockedValue { grants in
                if error.code == "authentication_failed" || error.code == "account_unavailable" {
                    grants.recordFailure(transaction.peer, now: now)
                } else {
                    grants.recordAbandoned(transaction.peer)
                }
            }
            self.logger.notice("re-authentication refused", metadata: ["peer": "\(transaction.peer)", "code": "\(error.code)"])
        }
    }

    /// Answers the prompt of transaction `id`; only the peer that began it may.
    package func answer(transaction id: UInt64, from peer: PeerIdentity, _ response: PAMResponse) async -> Step? {
        guard let transaction = self.transactions.withLockedValue({ $0[id] }), transaction.peer == peer else { return nil }
        await transaction.answer(response)
        return await self.next(transaction)
    }

    private func next(_ transaction: ReauthTransaction) async -> Step {
        let event = await transaction.nextEvent()
        switch event.kind {
        case .prompt(let prompt):
            return .prompt(transaction: transaction.id, prompt: prompt, messages: event.messages)
        case .finished(let outcome):
            // Settled in the grants already (`settle`), whether or not anyone reads this.
            switch outcome {
            case .success:
                let ttl = self.grants.withLockedValue { $0.policy.grantTTL }
                return .granted(expiresInSeconds: Int(ttl.components.seconds), messages: event.messages)
            case .failure(let error):
                return .refused(code: BrokerErrorCode(error.kind), message: error.message, messages: event.messages)
            }
        }
    }
}

/// One PAM transaction's dialogue: PAM's prompts go out through `nextEvent()`, the person's
/// answers come back through `answer(_:)`.
actor ReauthTransaction: PAMResponder {
    struct Event: Sendable {
        enum Kind: Sendable {
            case prompt(PAMPrompt)
            case finished(PAMOutcome)
        }
        var kind: Kind
        var messages: [String]
    }

    nonisolated let id: UInt64
    nonisolated let peer: PeerIdentity
    private var messages: [String] = []
    private var pendingEvent: Event?
    private var eventWaiter: CheckedContinuation<Event, Never>?
    private var answerWaiter: CheckedContinuation<PAMResponse, Never>?
    private var finished = false

    init(id: UInt64, peer: PeerIdentity) {
        self.id = id
        self.peer = peer
    }

    /// Called by PAM's conversation (through `PAMAuthenticator`) for each prompt.
    func respond(to prompt: PAMPrompt) async -> PAMResponse {
        guard prompt.expectsAnswer else {
            self.messages.append(prompt.text)
            return .acknowledged
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                self.answerWaiter?.resume(returning: .cancel)
                self.answerWaiter = continuation
                self.emit(Event(kind: .prompt(prompt), messages: self.takeMessages()))
            }
        } onCancel: {
            Task { await self.cancelPendingAnswer() }
        }
    }

    func answer(_ response: PAMResponse) {
        self.answerWaiter?.resume(returning: response)
        self.answerWaiter = nil
    }

    func finish(_ outcome: PAMOutcome) {
        self.finished = true
        self.cancelPendingAnswer()
        self.emit(Event(kind: .finished(outcome), messages: self.takeMessages()))
    }

    func nextEvent() async -> Event {
        if let event = self.pendingEvent {
            self.pendingEvent = nil
            return event
        }
        return await withCheckedContinuation { continuation in
            self.eventWaiter = continuation
        }
    }

    private func emit(_ event: Event) {
        if let waiter = self.eventWaiter {
            self.eventWaiter = nil
            waiter.resume(returning: event)
        } else {
            self.pendingEvent = event
        }
    }

    private func cancelPendingAnswer() {
        self.answerWaiter?.resume(returning: .cancel)
        self.answerWaiter = nil
    }

    private func takeMessages() -> [String] {
        defer { self.messages = [] }
        return self.messages
    }
}
