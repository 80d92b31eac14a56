/// Every pending authentication challenge, as a value: events in, actions out, no I/O.
///
/// The rules it enforces are those DESIGN.md takes from Apple's CustomHTTPProtocol sample:
/// - **One challenge at a time per request.** A request that raises a second challenge while its
///   first is outstanding is refused at once (`Action.refused`); its first wait is untouched.
/// - **Coalescing.** While a challenge for a space (a protection space, or a server's chain for a
///   trust challenge) is pending, other requests for that space wait on it: one store look-up,
///   one prompt, and every waiter proceeds with the one answer.
/// - **Store first, then agents.** A new challenge is first resolved from the store
///   (`Action.resolve`). With no stored answer, requests that may not wait for a person get
///   `.unanswered(.nothingStored)` at once; interactive ones wait for an agent, each until its own
///   deadline. Agents attached now, or later, are offered the challenge; the first answer wins
///   and the offer is withdrawn from the others.
/// - **Exactly one resumption.** Every request that was accepted into the queue is resumed exactly
///   once (`Action.resume`): answered, unanswered with a reason, or cancelled. A challenge with no
///   waiters left is dropped and withdrawn from agents, so nothing is orphaned.
///
/// Generic over the space, the answer and the clock's instant, so transcripts run at fixed times.
/// Events that do not fit the current state (an answer for a challenge already resolved, an agent
/// unknown to the queue) are ignored: the outside world always races with the queue.
package struct ChallengeQueue<Space: Hashable & Sendable, Answer: Equatable & Sendable, Instant: InstantProtocol & Sendable>:
    Sendable
where Instant.Duration == Duration {
    package typealias RequestID = UInt64
    package typealias ChallengeID = UInt64
    package typealias AgentID = UInt64

    /// How a waiting request ends.
    package enum Resolution: Equatable, Sendable {
        case answered(Answer)
        case unanswered(UnansweredReason)
        /// The request itself went away (its client disconnected or its task was cancelled).
        case cancelled
    }

    /// Why a request goes on without an answer: the broker then passes the challenge to the client.
    package enum UnansweredReason: Equatable, Sendable {
        /// The store had no answer and the request may not wait for an agent.
        case nothingStored
        /// The request's deadline passed while it waited for an agent.
        case timedOut
        /// An agent declined (cancelled) the challenge.
        case declined
        /// The agent handling the challenge disconnected, and no other agent is attached.
        case agentDisconnected
    }

    /// What an agent says about a challenge it was offered.
    package enum AgentAnswer: Equatable, Sendable {
        case answer(Answer)
        case decline
    }

    /// A pending challenge, for `GET /v1/challenges`.
    package struct PendingChallenge: Equatable, Sendable {
        package var id: ChallengeID
        package var space: Space
        package var raisedAt: Instant
        package var waiters: [RequestID]
        /// False while the store is being asked; true once it waits for an agent.
        package var awaitingAgent: Bool
    }

    /// What the shell does after an event, in this order: refuse, resolve, resume, offer, withdraw.
    package struct Action: Equatable, Sendable {
        /// A request that raised a challenge while one of its own was outstanding.
        package var refused: [RequestID] = []
        /// Ask the store for an answer to this challenge; report with `storeAnswered`.
        package var resolve: [Resolve] = []
        /// Resume these requests; each appears once in the queue's lifetime.
        package var resume: [Resume] = []
        /// Offer these challenges to these agents.
        package var offer: [Offer] = []
        /// Tell these agents that these challenges no longer need an answer.
        package var withdraw: [Withdraw] = []

        package init(
            refused: [RequestID] = [], resolve: [Resolve] = [], resume: [Resume] = [], offer: [Offer] = [],
            withdraw: [Withdraw] = []
        ) {
            self.refused = refused
            self.resolve = resolve
            self.resume = resume
            self.offer = offer
            self.withdraw = withdraw
        }

        package struct Resolve: Equatable, Sendable {
            package var challenge: ChallengeID
            package var space: Space
            package init(challenge: ChallengeID, space: Space) {
                self.challenge = challenge
                self.space = space
            }
        }
        package struct Resume: Equatable, Sendable {
            package var request: RequestID
            package var resolution: Resolution
            package init(request: RequestID, resolution: Resolution) {
                self.request = request
                self.resolution = resolution
            }
        }
        package struct Offer: Equatable, Sendable {
            package var challenge: ChallengeID
            package var space: Space
            package var agents: [AgentID]
            package init(challenge: ChallengeID, space: Space, agents: [AgentID]) {
                self.challenge = challenge
                self.space = space
                self.agents = agents
            }
        }
        package struct Withdraw: Equatable, Sendable {
            package var challenge: ChallengeID
            package var agents: [AgentID]
            package init(challenge: ChallengeID, agents: [AgentID]) {
                self.challenge = challenge
                self.agents = agents
            }
        }

        package static var none: Action { Action() }
        package var isEmpty: Bool { self == .none }
    }

    private enum Phase: Sendable {
        case resolving
        /// Offered to these agents (all attached ones, in attach order).
        case awaitingAgent(offeredTo: [AgentID])
    }

    private struct Waiter: Sendable {
        var request: RequestID
        var interactive: Bool
        var deadline: Instant
    }

    private struct Challenge: Sendable {
        var id: ChallengeID
        var space: Space
        var raisedAt: Instant
        var waiters: [Waiter]
        var phase: Phase
    }

    private var challenges: [ChallengeID: Challenge] = [:]
    private var challengeBySpace: [Space: ChallengeID] = [:]
    private var challengeByRequest: [RequestID: ChallengeID] = [:]
    private var agents: [AgentID] = []
    private var nextChallengeID: ChallengeID = 1

    package init() {}

    // MARK: - Events

    /// A request met a challenge for `space`. `interactive` says whether it may wait for an agent,
    /// and until when.
    package mutating func challengeRaised(
        request: RequestID, space: Space, interactive: Bool, deadline: Instant, now: Instant
    ) -> Action {
        if self.challengeByRequest[request] != nil {
            return Action(refused: [request])
        }
        let waiter = Waiter(request: request, interactive: interactive, deadline: deadline)
        if let id = self.challengeBySpace[space], var challenge = self.challenges[id] {
            if case .awaitingAgent = challenge.phase, !interactive {
                // The store already had nothing, and this request may not wait for a person.
                return Action(resume: [.init(request: request, resolution: .unanswered(.nothingStored))])
            }
            challenge.waiters.append(waiter)
            self.challenges[id] = challenge
            self.challengeByRequest[request] = id
            return .none
        }
        let id = self.nextChallengeID
        self.nextChallengeID += 1
        self.challenges[id] = Challenge(id: id, space: space, raisedAt: now, waiters: [waiter], phase: .resolving)
        self.challengeBySpace[space] = id
        self.challengeByRequest[request] = id
        return Action(resolve: [.init(challenge: id, space: space)])
    }

    /// The store answered (`nil`: it has nothing for this space).
    package mutating func storeAnswered(_ id: ChallengeID, answer: Answer?) -> Action {
        guard var challenge = self.challenges[id], case .resolving = challenge.phase else { return .none }
        if let answer {
            return self.finish(challenge, with: .answered(answer))
        }
        var action = Action()
        let (interactive, others) = challenge.waiters.partitioned { $0.interactive }
        for waiter in others {
            action.resume.append(.init(request: waiter.request, resolution: .unanswered(.nothingStored)))
            self.challengeByRequest[waiter.request] = nil
        }
        if interactive.isEmpty {
            self.remove(challenge)
            return action
        }
        challenge.waiters = interactive
        challenge.phase = .awaitingAgent(offeredTo: self.agents)
        self.challenges[id] = challenge
        if !self.agents.isEmpty {
            action.offer.append(.init(challenge: id, space: challenge.space, agents: self.agents))
        }
        return action
    }

    /// An agent connected: it is offered every challenge that waits for one.
    package mutating func agentAttached(_ agent: AgentID) -> Action {
        guard !self.agents.contains(agent) else { return .none }
        self.agents.append(agent)
        var action = Action()
        for id in self.challenges.keys.sorted() {
            guard var challenge = self.challenges[id], case .awaitingAgent(var offeredTo) = challenge.phase else { continue }
            offeredTo.append(agent)
            challenge.phase = .awaitingAgent(offeredTo: offeredTo)
            self.challenges[id] = challenge
            action.offer.append(.init(challenge: id, space: challenge.space, agents: [agent]))
        }
        return action
    }

    /// An agent went away. A challenge that no remaining agent was offered ends for its waiters
    /// with `.agentDisconnected`: the request fails over to the client instead of hanging.
    package mutating func agentDetached(_ agent: AgentID) -> Action {
        guard let index = self.agents.firstIndex(of: agent) else { return .none }
        self.agents.remove(at: index)
        var action = Action()
        for id in self.challenges.keys.sorted() {
            guard var challenge = self.challenges[id], case .awaitingAgent(var offeredTo) = challenge.phase,
                let position = offeredTo.firstIndex(of: agent)
            else { continue }
            offeredTo.remove(at: position)
            challenge.phase = .awaitingAgent(offeredTo: offeredTo)
            if offeredTo.isEmpty {
                action.merge(self.finish(challenge, with: .unanswered(.agentDisconnected)))
            } else {
                self.challenges[id] = challenge
            }
        }
        return action
    }

    /// The space of `challenge` when it waits for an answer from `agent` (offered to it, not yet
    /// answered), else nil. An agent's answer has side effects (a kept password, a saved trust
    /// exception) that must happen only for a challenge the agent really holds, so the shell asks
    /// this before it applies them and answers the queue after.
    package func space(of challenge: ChallengeID, heldBy agent: AgentID) -> Space? {
        guard let challenge = self.challenges[challenge], case .awaitingAgent(let offeredTo) = challenge.phase,
            offeredTo.contains(agent)
        else { return nil }
        return challenge.space
    }

    /// An agent answered or declined a challenge it was offered; the first word wins.
    package mutating func agentAnswered(_ agent: AgentID, challenge id: ChallengeID, _ answer: AgentAnswer) -> Action {
        guard let challenge = self.challenges[id], case .awaitingAgent(let offeredTo) = challenge.phase,
            offeredTo.contains(agent)
        else { return .none }
        switch answer {
        case .answer(let value): return self.finish(challenge, with: .answered(value), answeredBy: agent)
        case .decline: return self.finish(challenge, with: .unanswered(.declined), answeredBy: agent)
        }
    }

    /// The request went away while it waited. It is resumed with `.cancelled`; a challenge left
    /// without waiters is dropped and withdrawn from agents.
    package mutating func requestCancelled(_ request: RequestID) -> Action {
        guard let id = self.challengeByRequest.removeValue(forKey: request), var challenge = self.challenges[id] else {
            return .none
        }
        challenge.waiters.removeAll { $0.request == request }
        var action = Action(resume: [.init(request: request, resolution: .cancelled)])
        if challenge.waiters.isEmpty {
            action.merge(self.drop(challenge))
        } else {
            self.challenges[id] = challenge
        }
        return action
    }

    /// Time passed: waiters whose deadline is at or before `now` end with `.timedOut`.
    package mutating func tick(now: Instant) -> Action {
        var action = Action()
        for id in self.challenges.keys.sorted() {
            guard var challenge = self.challenges[id] else { continue }
            let (expired, remaining) = challenge.waiters.partitioned { $0.deadline <= now }
            guard !expired.isEmpty else { continue }
            for waiter in expired {
                action.resume.append(.init(request: waiter.request, resolution: .unanswered(.timedOut)))
                self.challengeByRequest[waiter.request] = nil
            }
            challenge.waiters = remaining
            if remaining.isEmpty {
                action.merge(self.drop(challenge))
            } else {
                self.challenges[id] = challenge
            }
        }
        return action
    }

    // MARK: - Queries

    /// The earliest deadline of any waiter, for the shell's one timer.
    package var nextDeadline: Instant? {
        self.challenges.values.lazy.flatMap { $0.waiters.map(\.deadline) }.min()
    }

    /// What is pending, oldest first.
    package var pending: [PendingChallenge] {
        self.challenges.values.sorted { $0.id < $1.id }.map { challenge in
            let awaitingAgent: Bool = if case .awaitingAgent = challenge.phase { true } else { false }
            return PendingChallenge(
                id: challenge.id, space: challenge.space, raisedAt: challenge.raisedAt,
                waiters: challenge.waiters.map(\.request), awaitingAgent: awaitingAgent
            )
        }
    }

    /// No challenge pending and no request waiting (agents may still be attached).
    package var isEmpty: Bool {
        self.challenges.isEmpty && self.challengeBySpace.isEmpty && self.challengeByRequest.isEmpty
    }

    /// Whether challenge `id` still waits (answered, withdrawn or timed-out ones do not).
    package func isPending(_ id: ChallengeID) -> Bool { self.challenges[id] != nil }

    // MARK: - Helpers

    /// Resumes every waiter with `resolution`, removes the challenge, and withdraws it from the
    /// agents it was offered to (but the one that answered).
    private mutating func finish(_ challenge: Challenge, with resolution: Resolution, answeredBy: AgentID? = nil) -> Action {
        var action = Action()
        for waiter in challenge.waiters {
            action.resume.append(.init(request: waiter.request, resolution: resolution))
        }
        if case .awaitingAgent(let offeredTo) = challenge.phase {
            let others = offeredTo.filter { $0 != answeredBy }
            if !others.isEmpty { action.withdraw.append(.init(challenge: challenge.id, agents: others)) }
        }
        self.remove(challenge)
        return action
    }

    /// Removes a challenge that has no waiters left, withdrawing any offer of it.
    private mutating func drop(_ challenge: Challenge) -> Action {
        var action = Action()
        if case .awaitingAgent(let offeredTo) = challenge.phase, !offeredTo.isEmpty {
            action.withdraw.append(.init(challenge: challenge.id, agents: offeredTo))
        }
        self.remove(challenge)
        return action
    }

    private mutating func remove(_ challenge: Challenge) {
        self.challenges[challenge.id] = nil
        if self.challengeBySpace[challenge.space] == challenge.id { self.challengeBySpace[challenge.space] = nil }
        for waiter in challenge.waiters where self.challengeByRequest[waiter.request] == challenge.id {
            self.challengeByRequest[waiter.request] = nil
        }
    }
}

extension ChallengeQueue.Action {
    package mutating func merge(_ other: Self) {
        self.refused += other.refused
        self.resolve += other.resolve
        self.resume += other.resume
        self.offer += other.offer
        self.withdraw += other.withdraw
    }
}

extension Array {
    /// The elements that satisfy `predicate`, and the rest, each in order.
    fileprivate func partitioned(by predicate: (Element) -> Bool) -> (matching: [Element], rest: [Element]) {
        var matching: [Element] = []
        var rest: [Element] = []
        for element in self {
            if predicate(element) { matching.append(element) } else { rest.append(element) }
        }
        return (matching, rest)
    }
}
