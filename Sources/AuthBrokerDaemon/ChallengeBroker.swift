import AuthBrokerCore

/// The one place every challenge goes through (DESIGN.md: ChallengeBroker).
///
/// A `@MainActor` shell over the pure `ChallengeQueue`: it keeps one continuation per waiting
/// request, asks the store on a detached task (a keyring look-up must never run on the main
/// actor or an event loop), keeps one timer for the nearest deadline, and streams offers and
/// withdrawals to attached agents. Nothing here blocks: every answer comes back as an event.
@MainActor
package final class ChallengeBroker<Space: Hashable & Sendable, Answer: Equatable & Sendable> {
    package typealias Queue = ChallengeQueue<Space, Answer, ContinuousClock.Instant>
    package typealias Resolution = Queue.Resolution

    /// What an attached agent hears.
    package enum AgentEvent: Equatable, Sendable {
        case offered(challenge: Queue.ChallengeID, space: Space, requester: Requester?)
        case withdrawn(challenge: Queue.ChallengeID)
        /// Something the user should act on that no answer settles (no Kerberos ticket: `kinit`).
        case notice(AgentNotice)
    }

    private var queue = Queue()
    private var waiting: [Queue.RequestID: CheckedContinuation<Resolution, Never>] = [:]
    private var agentStreams: [Queue.AgentID: AsyncStream<AgentEvent>.Continuation] = [:]
    /// Who raised each pending challenge first (coalesced waiters share it).
    private var requesters: [Queue.ChallengeID: Requester] = [:]
    private var nextRequestID: Queue.RequestID = 1
    private var nextAgentID: Queue.AgentID = 1
    private var timer: Task<Void, Never>?
    private var timerDeadline: ContinuousClock.Instant?
    private let clock = ContinuousClock()
    private let lookUp: @Sendable (Space) async -> Answer?
    private let agentEventBuffer: Int

    /// - Parameters:
    ///   - agentEventBuffer: events queued for an agent that does not read them; one more and
    ///     the agent is detached (as if it went away), so it cannot grow memory.
    ///   - lookUp: the store's answer for a space, or nil. Runs off the main actor.
    package nonisolated init(agentEventBuffer: Int = 1024, lookUp: @escaping @Sendable (Space) async -> Answer?) {
        self.agentEventBuffer = max(1, agentEventBuffer)
        self.lookUp = lookUp
    }

    /// Raises a challenge for `space` and waits for its resolution. Cancelling the calling task
    /// resumes it with `.cancelled` (and withdraws the challenge if no one else waits on it).
    ///
    /// - Parameters:
    ///   - interactive: whether this request may wait for an agent when the store has nothing.
    ///   - timeout: how long it may wait in all.
    ///   - requester: the process behind the request, shown to agents.
    package func resolve(_ space: Space, interactive: Bool, timeout: Duration, requester: Requester? = nil) async -> Resolution {
        let request = self.nextRequestID
        self.nextRequestID += 1
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if Task.isCancelled {
                    continuation.resume(returning: .cancelled)
                    return
                }
                let now = self.clock.now
                let action = self.queue.challengeRaised(
                    request: request, space: space, interactive: interactive, deadline: now.advanced(by: timeout), now: now
                )
                if action.refused.contains(request) {
                    // Cannot happen for a fresh id; answered rather than trapped all the same.
                    continuation.resume(returning: .unanswered(.nothingStored))
                    return
                }
                self.waiting[request] = continuation
                if let requester {
                    for resolve in action.resolve { self.requesters[resolve.challenge] = requester }
                }
                self.run(action)
            }
        } onCancel: {
            Task { @MainActor in self.run(self.queue.requestCancelled(request)) }
        }
    }

    /// Attaches an agent; it is offered every challenge that waits for one, now and later.
    /// Ending the stream's iteration (or `detachAgent`) detaches it.
    package func attachAgent() -> (id: Queue.AgentID, events: AsyncStream<AgentEvent>) {
        let id = self.nextAgentID
        self.nextAgentID += 1
        let (stream, continuation) = AsyncStream<AgentEvent>.makeStream(
            // Room for the offers of everything pending now, which arrive before it can read.
            bufferingPolicy: .bufferingOldest(self.agentEventBuffer + self.queue.pending.count)
        )
        continuation.onTermination = { _ in
            Task { @MainActor in self.detachAgent(id) }
        }
        self.agentStreams[id] = continuation
        self.run(self.queue.agentAttached(id))
        return (id, stream)
    }

    package func detachAgent(_ id: Queue.AgentID) {
        guard let continuation = self.agentStreams.removeValue(forKey: id) else { return }
        continuation.finish()
        self.run(self.queue.agentDetached(id))
    }

    /// The space of a challenge that `agent` holds (offered to it and still unanswered).
    package func space(of challenge: Queue.ChallengeID, heldBy agent: Queue.AgentID) -> Space? {
        self.queue.space(of: challenge, heldBy: agent)
    }

    /// An agent's answer; ignored unless that agent holds that challenge.
    package func agentAnswered(_ agent: Queue.AgentID, challenge: Queue.ChallengeID, _ answer: Queue.AgentAnswer) {
        self.run(self.queue.agentAnswered(agent, challenge: challenge, answer))
    }

    /// What is pending, oldest first, with the age of each and who raised it.
    package var pending: [(challenge: Queue.PendingChallenge, age: Duration, requester: Requester?)] {
        let now = self.clock.now
        return self.queue.pending.map { ($0, $0.raisedAt.duration(to: now), self.requesters[$0.id]) }
    }

    package var agentCount: Int { self.agentStreams.count }

    /// Tells every attached agent; an agent that is not reading misses it (notices are advice,
    /// not state: nothing waits on them).
    package func notify(_ notice: AgentNotice) {
        for continuation in self.agentStreams.values { continuation.yield(.notice(notice)) }
    }

    // MARK: - Running actions

    private func run(_ action: Queue.Action) {
        for resolve in action.resolve {
            let lookUp = self.lookUp
            Task.detached {
                let answer = await lookUp(resolve.space)
                await self.storeAnswered(resolve.challenge, answer)
            }
        }
        for resume in action.resume {
            self.waiting.removeValue(forKey: resume.request)?.resume(returning: resume.resolution)
        }
        var overflowing: Set<Queue.AgentID> = []
        for offer in action.offer {
            for agent in offer.agents {
                let result = self.agentStreams[agent]?.yield(
                    .offered(challenge: offer.challenge, space: offer.space, requester: self.requesters[offer.challenge])
                )
                if case .dropped? = result { overflowing.insert(agent) }
            }
        }
        for withdraw in action.withdraw {
            for agent in withdraw.agents {
                if case .dropped? = self.agentStreams[agent]?.yield(.withdrawn(challenge: withdraw.challenge)) {
                    overflowing.insert(agent)
                }
            }
        }
        // An agent that stopped reading would miss what was dropped: it is detached, and sees
        // its stream end (the daemon's events have been lost; reattaching gets the full state).
        for agent in overflowing.sorted() { self.detachAgent(agent) }
        // Requesters of challenges that ended are forgotten.
        if !action.resume.isEmpty || !action.withdraw.isEmpty {
            self.requesters = self.requesters.filter { self.queue.isPending($0.key) }
        }
        self.rescheduleTimer()
    }

    private func storeAnswered(_ challenge: Queue.ChallengeID, _ answer: Answer?) {
        self.run(self.queue.storeAnswered(challenge, answer: answer))
    }

    /// One timer, for the nearest deadline; replaced when that changes.
    private func rescheduleTimer() {
        let deadline = self.queue.nextDeadline
        guard deadline != self.timerDeadline else { return }
        self.timer?.cancel()
        self.timerDeadline = deadline
        guard let deadline else {
            self.timer = nil
            return
        }
        self.timer = Task { @MainActor [clock] in
            do {
                try await Task.sleep(until: deadline, clock: clock)
            } catch {
                return  // replaced by a newer timer
            }
            self.timerDeadline = nil
            self.run(self.queue.tick(now: clock.now))
        }
    }
}

/// Runs `wait` (a challenge's wait) until it finishes or the client goes away, whichever comes
/// first; nil when the client went first. The wait is then cancelled, which withdraws the
/// challenge from agents when nobody else waits on it (nobody would read the answer).
func untilClientGone<Result: Sendable>(
    _ clientGone: @escaping @Sendable () async -> Void, _ wait: @escaping @Sendable () async -> Result
) async -> Result? {
    await withTaskGroup(of: Result?.self) { group in
        group.addTask { await wait() }
        group.addTask {
            await clientGone()
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

/// A notice for agents: what happened, for which host, and what the user can do.
package struct AgentNotice: Equatable, Sendable {
    /// A broker error code (`kerberos_ticket_needed`).
    package var code: String
    package var host: String
    package var message: String

    package init(code: String, host: String, message: String) {
        self.code = code
        self.host = host
        self.message = message
    }
}
