import AuthBrokerCore
import AuthBrokerDaemon
import Testing

/// Counts store look-ups (the store is the broker's neighbour here, so an in-process fake).
actor LookUpCounter {
    private(set) var count = 0
    func increment() { self.count += 1 }
}

@MainActor
@Suite("ChallengeBroker")
struct ChallengeBrokerTests {
    typealias Broker = ChallengeBroker<String, String>

    @Test("1000 concurrent requests to one space: one store look-up, all answered")
    func coalescesOnTheStore() async {
        let counter = LookUpCounter()
        let broker = Broker { space in
            await counter.increment()
            try? await Task.sleep(for: .milliseconds(50))
            return "stored for \(space)"
        }
        let results = await withTaskGroup(of: Broker.Resolution.self) { group in
            for _ in 0..<1000 {
                group.addTask { await broker.resolve("realm-a", interactive: false, timeout: .seconds(30)) }
            }
            var results: [Broker.Resolution] = []
                for await result in group { results.append(result) }
                return results
        }
        #expect(results.count == 1000)
        #expect(results.allSatisfy { $0 == .answered("stored for realm-a") })
        #expect(await counter.count == 1)
        #expect(broker.pending.isEmpty)
    }

    @Test("an agent that stops reading is detached once its buffer is full: memory stays bounded, its requests go on")
    func agentEventBufferIsBounded() async throws {
        let broker = Broker(agentEventBuffer: 8) { _ in nil }
        let agent = broker.attachAgent()
        let waiters = Task {
            await withTaskGroup(of: Broker.Resolution.self) { group in
                for index in 0..<50 {
                    group.addTask { await broker.resolve("realm-\(index)", interactive: true, timeout: .seconds(3)) }
                }
                var results: [Broker.Resolution] = []
                for await result in group { results.append(result) }
                return results
            }
        }
        // The agent reads nothing until the broker has given up on it.
        let giveUp = ContinuousClock.now + .seconds(20)
        while broker.agentCount > 0 {
            guard ContinuousClock.now < giveUp else {
                Issue.record("the agent that never reads was not detached")
                broker.detachAgent(agent.id)
                return
            }
            try await Task.sleep(for: .milliseconds(5))
        }
        // What was buffered is still delivered, then the stream ends.
        var delivered = 0
        for await _ in agent.events { delivered += 1 }
        #expect(delivered == 8)
        #expect(broker.agentCount == 0)
        // As for an agent that went away: the requests it held go on without an answer at once
        // (the rest wait for another agent until their deadline); none hangs.
        let results = await waiters.value
        #expect(results.count == 50)
        #expect(results.filter { $0 == .unanswered(.agentDisconnected) }.count >= 9)
    }

    @Test("1000 interactive requests wait on one offer; one agent answer releases them all")
    func oneAgentAnswerForMany() async throws {
        let broker = Broker { _ in nil }
        let agent = broker.attachAgent()
        let waiters = Task {
            await withTaskGroup(of: Broker.Resolution.self) { group in
                for _ in 0..<1000 {
                    group.addTask { await broker.resolve("realm-a", interactive: true, timeout: .seconds(60)) }
                }
                var results: [Broker.Resolution] = []
                for await result in group { results.append(result) }
                return results
            }
        }
        var iterator = agent.events.makeAsyncIterator()
        let event = await iterator.next()
        guard case .offered(let challenge, let space, _)? = event else {
            Issue.record("expected an offer, got \(String(describing: event))")
            return
        }
        #expect(space == "realm-a")
        // Let every request join the one pending challenge before answering.
        while broker.pending.first?.challenge.waiters.count != 1000 {
            try await Task.sleep(for: .milliseconds(5))
        }
        broker.agentAnswered(agent.id, challenge: challenge, .answer("typed by the user"))
        let results = await waiters.value
        #expect(results.count == 1000)
        #expect(results.allSatisfy { $0 == .answered("typed by the user") })
        #expect(broker.pending.isEmpty)
    }

    @Test("an agent that never answers: the request ends at its deadline and the offer is withdrawn")
    func deadline() async {
        let broker = Broker { _ in nil }
        let agent = broker.attachAgent()
        let result = await broker.resolve("realm-a", interactive: true, timeout: .milliseconds(100))
        #expect(result == .unanswered(.timedOut))
        var iterator = agent.events.makeAsyncIterator()
        guard case .offered(let challenge, _, _)? = await iterator.next() else {
            Issue.record("expected an offer")
            return
        }
        #expect(await iterator.next() == .withdrawn(challenge: challenge))
        #expect(broker.pending.isEmpty)
    }

    @Test("an agent that disconnects mid-challenge: the request goes on without an answer")
    func agentDisconnects() async throws {
        let broker = Broker { _ in nil }
        let agent = broker.attachAgent()
        let waiter = Task { await broker.resolve("realm-a", interactive: true, timeout: .seconds(60)) }
        var iterator = agent.events.makeAsyncIterator()
        _ = await iterator.next()
        broker.detachAgent(agent.id)
        #expect(await waiter.value == .unanswered(.agentDisconnected))
        #expect(broker.agentCount == 0)
    }

    @Test("a request cancelled while it waits is resumed as cancelled and its challenge withdrawn")
    func cancellation() async throws {
        let broker = Broker { _ in nil }
        let agent = broker.attachAgent()
        let waiter = Task { await broker.resolve("realm-a", interactive: true, timeout: .seconds(60)) }
        var iterator = agent.events.makeAsyncIterator()
        guard case .offered(let challenge, _, _)? = await iterator.next() else {
            Issue.record("expected an offer")
            return
        }
        waiter.cancel()
        #expect(await waiter.value == .cancelled)
        #expect(await iterator.next() == .withdrawn(challenge: challenge))
        #expect(broker.pending.isEmpty)
    }

    @Test("without an agent, a non-interactive request is passed on at once when the store has nothing")
    func nothingStored() async {
        let broker = Broker { _ in nil }
        #expect(await broker.resolve("realm-a", interactive: false, timeout: .seconds(60)) == .unanswered(.nothingStored))
    }
}
