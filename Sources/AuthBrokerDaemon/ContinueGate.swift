import AuthBrokerCore
import NIOConcurrencyHelpers
import NIOHTTP1

/// The shell over one attempt's `ContinueGateStateMachine`: the request side waits here for the
/// body's fate, the response pump reports the origin's 100, final head or failure, and a timer
/// sends a held body after `ExpectContinue.timeout`.
final class ContinueGate: Sendable {
    private struct State {
        var machine: ContinueGateStateMachine
        /// The decision an event made, kept for a request side that was not waiting yet.
        var decided: ContinueGateStateMachine.BodyDecision?
        var decisionWaiter: CheckedContinuation<ContinueGateStateMachine.BodyDecision, Never>?
        var continueWriteWaiters: [CheckedContinuation<Void, Never>] = []

        /// The body's fate once known: an event's decision, or the machine's own (body not held).
        var decision: ContinueGateStateMachine.BodyDecision? { self.decided ?? self.machine.decision }
    }
    private let box: NIOLockedValueBox<State>

    init(_ machine: ContinueGateStateMachine) {
        self.box = NIOLockedValueBox(State(machine: machine))
    }

    /// Whether a 100 has gone to the client (carried to the request's next attempt).
    var continueSentToClient: Bool { self.box.withLockedValue { $0.machine.continueSentToClient } }

    /// Whether this attempt sent no body because a final status came first.
    var bodyWithheld: Bool { self.box.withLockedValue { $0.machine.state == .bodyWithheld } }

    // MARK: Request side

    /// Waits until the body may go (the origin's 100, or `timeout`) or must not (a final status
    /// or a failure first). Returns at once when the body was not held.
    func bodyDecision(timeout: Duration) async -> ContinueGateStateMachine.BodyDecision {
        // Usually decided already (a body not held): no timer task, no continuation.
        if let now = self.box.withLockedValue({ $0.decision }) { return now }
        let timer = Task {
            try await Task.sleep(for: timeout)
            self.fire { $0.timedOut() }
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { continuation in
            let now = self.box.withLockedValue { state -> ContinueGateStateMachine.BodyDecision? in
                if let decided = state.decision { return decided }
                state.decisionWaiter = continuation
                return nil
            }
            if let now { continuation.resume(returning: now) }
        }
    }

    /// The broker's own `100 Continue` (after a timeout) is on its way to the client.
    func continueWritten() {
        let waiters = self.box.withLockedValue { state in
            state.machine.continueWritten()
            defer { state.continueWriteWaiters = [] }
            return state.continueWriteWaiters
        }
        for waiter in waiters { waiter.resume() }
    }

    // MARK: Response side

    /// The origin sent `100 Continue`: returns whether to relay it to the client.
    func originSentContinue() -> Bool {
        var relay = false
        self.fire { machine in
            let result = machine.originSentContinue()
            relay = result.relayToClient
            return result.startsBody ? machine.decision : nil
        }
        return relay
    }

    /// A final head arrived: returns whether the body was withheld (never sent on this attempt).
    /// Waits, when the broker is writing its own 100 to the client, until that is done, so the
    /// 100 cannot follow the final head.
    func finalHeadArrived(status: HTTPResponseStatus) async -> Bool {
        var action = ContinueGateStateMachine.FinalHeadAction.bodyFlowing
        self.fire { machine in
            let wasHolding = machine.isHolding
            action = machine.finalHeadArrived(status: status)
            return wasHolding ? machine.decision : nil
        }
        switch action {
        case .bodyWithheld: return true
        case .bodyFlowing: return false
        case .waitForContinueWrite:
            await withCheckedContinuation { continuation in
                let resumeNow = self.box.withLockedValue { state in
                    guard state.machine.finalHeadArrived(status: status) == .waitForContinueWrite else { return true }
                    state.continueWriteWaiters.append(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
            return false
        }
    }

    /// The exchange failed before a final head: a held body is not sent.
    func exchangeFailed() {
        self.fire { $0.exchangeFailed() ? .withhold : nil }
    }

    /// Applies an event; a decision it returns resumes the waiting request side.
    private func fire(_ event: (inout ContinueGateStateMachine) -> ContinueGateStateMachine.BodyDecision?) {
        let resume = self.box.withLockedValue { state -> (CheckedContinuation<ContinueGateStateMachine.BodyDecision, Never>, ContinueGateStateMachine.BodyDecision)? in
            guard let decision = event(&state.machine) else { return nil }
            state.decided = decision
            guard let waiter = state.decisionWaiter else { return nil }
            state.decisionWaiter = nil
            return (waiter, decision)
        }
        if let (waiter, decision) = resume { waiter.resume(returning: decision) }
    }
}
