import AuthBrokerCore
import Testing

/// A clock reading for transcripts: time is what the test says it is.
struct FakeInstant: InstantProtocol, Sendable {
    var offset: Duration
    func advanced(by duration: Duration) -> FakeInstant { FakeInstant(offset: self.offset + duration) }
    func duration(to other: FakeInstant) -> Duration { other.offset - self.offset }
    static func < (lhs: FakeInstant, rhs: FakeInstant) -> Bool { lhs.offset < rhs.offset }
    static func at(_ seconds: Int) -> FakeInstant { FakeInstant(offset: .seconds(seconds)) }
}

typealias TestQueue = ChallengeQueue<String, String, FakeInstant>
typealias QueueAction = TestQueue.Action

/// Transcripts: one event, one expected action.
@Suite("ChallengeQueue transcripts")
struct ChallengeQueueTranscriptTests {
    @Test("a stored answer resumes the request; the queue ends empty")
    func storedAnswer() {
        var queue = TestQueue()
        #expect(
            queue.challengeRaised(request: 1, space: "a", interactive: false, deadline: .at(30), now: .at(0))
                == QueueAction(resolve: [.init(challenge: 1, space: "a")])
        )
        #expect(queue.pending.map(\.waiters) == [[1]])
        #expect(
            queue.storeAnswered(1, answer: "secret-answer")
                == QueueAction(resume: [.init(request: 1, resolution: .answered("secret-answer"))])
        )
        #expect(queue.isEmpty)
    }

    @Test("requests for one space coalesce on one challenge and all proceed with its answer")
    func coalescing() {
        var queue = TestQueue()
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        #expect(queue.challengeRaised(request: 2, space: "a", interactive: true, deadline: .at(30), now: .at(1)).isEmpty)
        #expect(queue.challengeRaised(request: 3, space: "a", interactive: false, deadline: .at(30), now: .at(1)).isEmpty)
        // Another space is its own challenge.
        #expect(
            queue.challengeRaised(request: 4, space: "b", interactive: false, deadline: .at(30), now: .at(1))
                == QueueAction(resolve: [.init(challenge: 2, space: "b")])
        )
        #expect(queue.pending.count == 2)
        #expect(
            queue.storeAnswered(1, answer: "x")
                == QueueAction(resume: [
                    .init(request: 1, resolution: .answered("x")), .init(request: 2, resolution: .answered("x")),
                    .init(request: 3, resolution: .answered("x")),
                ])
        )
        #expect(queue.pending.map(\.space) == ["b"])
    }

    @Test("one challenge at a time per request: a second one is refused, the first is untouched")
    func oneAtATime() {
        var queue = TestQueue()
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        #expect(queue.challengeRaised(request: 1, space: "b", interactive: true, deadline: .at(30), now: .at(0)) == QueueAction(refused: [1]))
        #expect(queue.pending.map(\.space) == ["a"])
    }

    @Test("nothing stored: non-interactive requests go on at once; interactive ones wait for an agent")
    func nothingStored() {
        var queue = TestQueue()
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        _ = queue.challengeRaised(request: 2, space: "a", interactive: false, deadline: .at(30), now: .at(0))
        #expect(
            queue.storeAnswered(1, answer: nil)
                == QueueAction(resume: [.init(request: 2, resolution: .unanswered(.nothingStored))])
        )
        #expect(queue.pending.first?.awaitingAgent == true)
        // A late non-interactive request for the same space does not wait either.
        #expect(
            queue.challengeRaised(request: 3, space: "a", interactive: false, deadline: .at(30), now: .at(2))
                == QueueAction(resume: [.init(request: 3, resolution: .unanswered(.nothingStored))])
        )
        // An agent that attaches later is offered what waits.
        #expect(queue.agentAttached(7) == QueueAction(offer: [.init(challenge: 1, space: "a", agents: [7])]))
        #expect(
            queue.agentAnswered(7, challenge: 1, .answer("typed"))
                == QueueAction(resume: [.init(request: 1, resolution: .answered("typed"))])
        )
        #expect(queue.isEmpty)
    }

    @Test("the first agent to answer wins; the offer is withdrawn from the others")
    func firstAgentWins() {
        var queue = TestQueue()
        _ = queue.agentAttached(7)
        _ = queue.agentAttached(8)
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        #expect(queue.storeAnswered(1, answer: nil) == QueueAction(offer: [.init(challenge: 1, space: "a", agents: [7, 8])]))
        #expect(
            queue.agentAnswered(8, challenge: 1, .decline)
                == QueueAction(
                    resume: [.init(request: 1, resolution: .unanswered(.declined))],
                    withdraw: [.init(challenge: 1, agents: [7])]
                )
        )
        // A late answer from the other agent is ignored.
        #expect(queue.agentAnswered(7, challenge: 1, .answer("late")).isEmpty)
        #expect(queue.isEmpty)
    }

    @Test("an agent that disconnects mid-challenge ends it for its waiters, unless another agent has it")
    func agentDisconnects() {
        var queue = TestQueue()
        _ = queue.agentAttached(7)
        _ = queue.agentAttached(8)
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        _ = queue.storeAnswered(1, answer: nil)
        #expect(queue.agentDetached(7).isEmpty)
        #expect(
            queue.agentDetached(8)
                == QueueAction(resume: [.init(request: 1, resolution: .unanswered(.agentDisconnected))])
        )
        #expect(queue.isEmpty)
        #expect(queue.agentDetached(8).isEmpty)
    }

    @Test("deadlines: each waiter times out on its own; the last one drops the challenge and withdraws it")
    func deadlines() {
        var queue = TestQueue()
        _ = queue.agentAttached(7)
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(10), now: .at(0))
        _ = queue.challengeRaised(request: 2, space: "a", interactive: true, deadline: .at(20), now: .at(1))
        _ = queue.storeAnswered(1, answer: nil)
        #expect(queue.nextDeadline == .at(10))
        #expect(queue.tick(now: .at(9)).isEmpty)
        #expect(queue.tick(now: .at(10)) == QueueAction(resume: [.init(request: 1, resolution: .unanswered(.timedOut))]))
        #expect(queue.nextDeadline == .at(20))
        #expect(
            queue.tick(now: .at(25))
                == QueueAction(
                    resume: [.init(request: 2, resolution: .unanswered(.timedOut))],
                    withdraw: [.init(challenge: 1, agents: [7])]
                )
        )
        #expect(queue.isEmpty)
        #expect(queue.nextDeadline == nil)
    }

    @Test("a request that goes away is resumed as cancelled; its challenge is dropped when no one else waits")
    func requestCancelled() {
        var queue = TestQueue()
        _ = queue.agentAttached(7)
        _ = queue.challengeRaised(request: 1, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        _ = queue.challengeRaised(request: 2, space: "a", interactive: true, deadline: .at(30), now: .at(0))
        _ = queue.storeAnswered(1, answer: nil)
        #expect(queue.requestCancelled(1) == QueueAction(resume: [.init(request: 1, resolution: .cancelled)]))
        #expect(
            queue.requestCancelled(2)
                == QueueAction(resume: [.init(request: 2, resolution: .cancelled)], withdraw: [.init(challenge: 1, agents: [7])])
        )
        #expect(queue.isEmpty)
        // Cancelling again, or answering the gone challenge, does nothing.
        #expect(queue.requestCancelled(2).isEmpty)
        #expect(queue.storeAnswered(1, answer: "x").isEmpty)
        #expect(queue.agentAnswered(7, challenge: 1, .answer("x")).isEmpty)
    }

    @Test("a request cancelled while the store is asked: the store's late answer is dropped")
    func cancelledWhileResolving() {
        var queue = TestQueue()
        _ = queue.challengeRaised(request: 1, space: "a", interactive: false, deadline: .at(30), now: .at(0))
        #expect(queue.requestCancelled(1) == QueueAction(resume: [.init(request: 1, resolution: .cancelled)]))
        #expect(queue.storeAnswered(1, answer: "late").isEmpty)
        // The space is free again: a new request starts a new challenge.
        #expect(
            queue.challengeRaised(request: 2, space: "a", interactive: false, deadline: .at(30), now: .at(1))
                == QueueAction(resolve: [.init(challenge: 2, space: "a")])
        )
    }
}

/// Randomised drives against a model of the outside world: every accepted request is resumed
/// exactly once, and once time runs past every deadline the queue is empty.
@Suite("ChallengeQueue random drives")
struct ChallengeQueueRandomTests {
    struct SplitMix: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            self.state &+= 0x9E37_79B9_7F4A_7C15
            var z = self.state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    @Test("random drive ends empty with every request resumed once", arguments: 0..<32)
    func randomDrive(seed: Int) throws {
        var random = SplitMix(state: UInt64(seed) &* 7919 &+ 1)
        var queue = TestQueue()
        var now = 0
        var nextRequest: UInt64 = 1
        var waiting = Set<UInt64>()  // accepted, not yet resumed
        var resumedCount: [UInt64: Int] = [:]
        var resolving = Set<UInt64>()  // challenges the store was asked about
        var offers: [UInt64: Set<UInt64>] = [:]  // agent → challenges it holds
        var agents = Set<UInt64>()
        var nextAgent: UInt64 = 100

        func apply(_ action: QueueAction, raised: UInt64? = nil) {
            for request in action.refused { #expect(waiting.contains(request)) }
            for resolve in action.resolve { resolving.insert(resolve.challenge) }
            for resume in action.resume {
                resumedCount[resume.request, default: 0] += 1
                waiting.remove(resume.request)
            }
            for offer in action.offer {
                for agent in offer.agents {
                    #expect(agents.contains(agent))
                    offers[agent, default: []].insert(offer.challenge)
                }
            }
            for withdraw in action.withdraw {
                for agent in withdraw.agents {
                    #expect(agents.contains(agent), "withdrawn from agent \(agent), which is gone")
                    offers[agent]?.remove(withdraw.challenge)
                }
            }
        }

        for _ in 0..<400 {
            switch random.next() % 9 {
            case 0, 1:
                let request = nextRequest
                nextRequest += 1
                let space = ["a", "b", "c"][Int(random.next() % 3)]
                let interactive = random.next() % 2 == 0
                waiting.insert(request)
                apply(
                    queue.challengeRaised(
                        request: request, space: space, interactive: interactive,
                        deadline: .at(now + 1 + Int(random.next() % 20)), now: .at(now)
                    )
                )
            case 2:
                // An already waiting request raises again: refused, nothing else changes.
                if let request = waiting.randomElement(using: &random) {
                    let action = queue.challengeRaised(request: request, space: "z", interactive: true, deadline: .at(now + 5), now: .at(now))
                    #expect(action == QueueAction(refused: [request]))
                }
            case 3:
                if let challenge = resolving.randomElement(using: &random) {
                    resolving.remove(challenge)
                    let answer: String? = random.next() % 2 == 0 ? "stored" : nil
                    apply(queue.storeAnswered(challenge, answer: answer))
                }
            case 4:
                let agent = nextAgent
                nextAgent += 1
                agents.insert(agent)
                apply(queue.agentAttached(agent))
            case 5:
                if let agent = agents.randomElement(using: &random) {
                    agents.remove(agent)
                    offers[agent] = nil
                    apply(queue.agentDetached(agent))
                }
            case 6:
                if let agent = agents.randomElement(using: &random), let challenge = offers[agent]?.randomElement(using: &random) {
                    let answer: TestQueue.AgentAnswer = random.next() % 3 == 0 ? .decline : .answer("typed")
                    apply(queue.agentAnswered(agent, challenge: challenge, answer))
                }
            case 7:
                if let request = waiting.randomElement(using: &random) {
                    apply(queue.requestCancelled(request))
                }
            default:
                now += Int(random.next() % 4)
                apply(queue.tick(now: .at(now)))
            }
            // Every waiting request is in exactly one pending challenge.
            let pendingWaiters = queue.pending.flatMap(\.waiters)
            #expect(Set(pendingWaiters) == waiting)
            #expect(pendingWaiters.count == waiting.count)
        }

        // The world settles: the store answers what it was asked, and time runs out.
        for challenge in resolving { apply(queue.storeAnswered(challenge, answer: nil)) }
        apply(queue.tick(now: .at(now + 1000)))
        #expect(queue.isEmpty)
        #expect(waiting.isEmpty)
        #expect(resumedCount.values.allSatisfy { $0 == 1 })
        #expect(resumedCount.count == Int(nextRequest - 1))
    }
}
