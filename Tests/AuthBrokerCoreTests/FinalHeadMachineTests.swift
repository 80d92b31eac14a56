import AuthBrokerCore
import NIOHTTP1
import Testing

/// The order of the broker's checks on a final response head, as transcripts, and a seeded
/// drive against the full path's former if-chain as a model (checks asked and decision).
@Suite("Final head machine")
struct FinalHeadMachineTests {
    typealias Machine = FinalHeadMachine

    /// What the shell would learn at each step.
    struct Answers {
        var bodyWithheld = false
        /// The 407 is in the upstream proxy's own space.
        var proxyChallenge = false
        var proxyRefused = false
        var challengeAnswered = false
        var originRefused = false
        var cache = Machine.CacheDecision.forward
    }

    /// Runs the machine to its decision, answering each action from `answers`; returns the
    /// actions in order (the decision last).
    static func run(_ head: Machine.Head, _ answers: Answers = Answers()) -> [Machine.Action] {
        var machine = Machine(head)
        var action = machine.start()
        var actions = [action]
        while !machine.isDecided, actions.count < 10 {
            switch action {
            case .askContinueGate:
                action = machine.gateAnswered(bodyWithheld: answers.bodyWithheld, isProxyChallenge: answers.proxyChallenge)
            case .checkProxyAccepted: action = machine.proxyChecked(refused: answers.proxyRefused)
            case .answerChallenge: action = machine.challengeAnswered(answers.challengeAnswered)
            case .checkOriginAccepted: action = machine.originChecked(refused: answers.originRefused)
            case .consultCache: action = machine.cacheDecided(answers.cache)
            case .discard, .kerberosError, .serveStored, .forward: Issue.record("a decision before isDecided: \(action)")
            }
            actions.append(action)
        }
        return actions
    }

    @Test("a plain 200: the gate, the origin's acceptance, then the client")
    func plainResponse() {
        #expect(
            Self.run(.init(status: .ok, mayAnswerChallenges: true))
                == [.askContinueGate, .checkOriginAccepted(byProxy: false), .forward(closeClient: false)]
        )
    }

    @Test("a 417 to the broker's own Expect, body withheld: read away and sent again; to the client's own Expect it is the client's")
    func expectationRefused() {
        let withheld = Answers(bodyWithheld: true)
        #expect(
            Self.run(.init(status: .expectationFailed, mayAnswerChallenges: true, brokerAddedExpect: true), withheld)
                == [.askContinueGate, .discard(.expectationRefused)]
        )
        #expect(
            Self.run(.init(status: .expectationFailed, mayAnswerChallenges: true), withheld)
                == [.askContinueGate, .checkOriginAccepted(byProxy: false), .forward(closeClient: true)]
        )
        // The body went (the origin sent 100 first): an ordinary response.
        #expect(
            Self.run(.init(status: .expectationFailed, mayAnswerChallenges: true, brokerAddedExpect: true)).last
                == .forward(closeClient: false)
        )
    }

    @Test("a 401 is answered from the store when the attempt may; declined or on the last attempt, the origin's checks follow")
    func challenge() {
        let head = Machine.Head(status: .unauthorized, mayAnswerChallenges: true)
        #expect(
            Self.run(head, Answers(challengeAnswered: true))
                == [.askContinueGate, .answerChallenge(byProxy: false), .discard(.challengeAnswered(byProxy: false))]
        )
        #expect(
            Self.run(head)
                == [.askContinueGate, .answerChallenge(byProxy: false), .checkOriginAccepted(byProxy: false), .forward(closeClient: false)]
        )
        // Negotiate the app cannot answer otherwise: the broker's Kerberos error instead.
        #expect(Self.run(head, Answers(originRefused: true)).last == .kerberosError)
        #expect(
            Self.run(.init(status: .unauthorized, mayAnswerChallenges: false), Answers(challengeAnswered: true))
                == [.askContinueGate, .checkOriginAccepted(byProxy: false), .forward(closeClient: false)]
        )
        // A challenge to a withheld body is still answered: the body goes with the next attempt.
        #expect(
            Self.run(head, Answers(bodyWithheld: true, challengeAnswered: true)).last == .discard(.challengeAnswered(byProxy: false))
        )
        #expect(Self.run(head, Answers(bodyWithheld: true)).last == .forward(closeClient: true))
    }

    @Test("through the upstream proxy: an origin's head first confirms the proxy; the proxy's own 407 is answered as the proxy's")
    func throughProxy() {
        let originHead = Machine.Head(status: .ok, throughProxy: true, mayAnswerChallenges: true)
        #expect(
            Self.run(originHead)
                == [.askContinueGate, .checkProxyAccepted, .checkOriginAccepted(byProxy: false), .forward(closeClient: false)]
        )
        #expect(Self.run(originHead, Answers(proxyRefused: true)) == [.askContinueGate, .checkProxyAccepted, .kerberosError])
        // An origin's 401 behind the proxy: the proxy is confirmed before the 401 is answered.
        #expect(
            Self.run(.init(status: .unauthorized, throughProxy: true, mayAnswerChallenges: true), Answers(challengeAnswered: true))
                == [.askContinueGate, .checkProxyAccepted, .answerChallenge(byProxy: false), .discard(.challengeAnswered(byProxy: false))]
        )
        let proxyChallenge = Machine.Head(status: .proxyAuthenticationRequired, throughProxy: true, mayAnswerChallenges: true)
        #expect(
            Self.run(proxyChallenge, Answers(proxyChallenge: true, challengeAnswered: true))
                == [.askContinueGate, .answerChallenge(byProxy: true), .discard(.challengeAnswered(byProxy: true))]
        )
        #expect(
            Self.run(proxyChallenge, Answers(proxyChallenge: true)).suffix(2) == [.checkOriginAccepted(byProxy: true), .forward(closeClient: false)]
        )
        // An origin's own 407 behind the proxy is no challenge of the broker's to answer.
        #expect(
            !Self.run(proxyChallenge, Answers(challengeAnswered: true)).contains { if case .answerChallenge = $0 { true } else { false } }
        )
        // Without a proxy, or on another status, a "proxy challenge" answer means nothing.
        #expect(
            Self.run(.init(status: .proxyAuthenticationRequired, mayAnswerChallenges: true), Answers(proxyChallenge: true, challengeAnswered: true))
                == [.askContinueGate, .checkOriginAccepted(byProxy: false), .forward(closeClient: false)]
        )
    }

    @Test("the cache decides last: forward, answer from its store, or send again without its conditions")
    func cache() {
        let head = Machine.Head(status: .notModified, mayAnswerChallenges: true, cacheTakesPart: true)
        #expect(
            Self.run(head) == [.askContinueGate, .checkOriginAccepted(byProxy: false), .consultCache, .forward(closeClient: false)]
        )
        #expect(Self.run(head, Answers(cache: .serveStored)).last == .serveStored)
        #expect(Self.run(head, Answers(cache: .repeatUnconditionally)).last == .discard(.cacheValidationNotSelected))
        // A refused origin never reaches the cache.
        #expect(!Self.run(head, Answers(originRefused: true)).contains(.consultCache))
    }

    /// The full path's if-chain before the machine, as the model: the checks it made, in order,
    /// and what the head came to (each check has side effects: an agent asked, auth state kept).
    static func model(_ head: Machine.Head, _ answers: Answers) -> [Machine.Action] {
        var actions: [Machine.Action] = [.askContinueGate]
        let fromProxy = answers.proxyChallenge && head.throughProxy && head.status == .proxyAuthenticationRequired
        if answers.bodyWithheld, head.status == .expectationFailed, !fromProxy, head.brokerAddedExpect {
            return actions + [.discard(.expectationRefused)]
        }
        if !fromProxy, head.throughProxy {
            actions.append(.checkProxyAccepted)
            if answers.proxyRefused { return actions + [.kerberosError] }
        }
        if head.status == .unauthorized || fromProxy, head.mayAnswerChallenges {
            actions.append(.answerChallenge(byProxy: fromProxy))
            if answers.challengeAnswered { return actions + [.discard(.challengeAnswered(byProxy: fromProxy))] }
        }
        actions.append(.checkOriginAccepted(byProxy: fromProxy))
        if answers.originRefused { return actions + [.kerberosError] }
        if head.cacheTakesPart {
            actions.append(.consultCache)
            switch answers.cache {
            case .forward: break
            case .serveStored: return actions + [.serveStored]
            case .repeatUnconditionally: return actions + [.discard(.cacheValidationNotSelected)]
            }
        }
        return actions + [.forward(closeClient: answers.bodyWithheld)]
    }

    @Test("seeded random heads and answers: the model's checks in the model's order, and its decision, within six steps")
    func randomDrive() {
        var generator = ChallengeQueueRandomTests.SplitMix(state: 0x4E41_4C48)
        let statuses: [HTTPResponseStatus] = [.ok, .notModified, .unauthorized, .proxyAuthenticationRequired, .expectationFailed, .notFound]
        let decisions: [Machine.CacheDecision] = [.forward, .serveStored, .repeatUnconditionally]
        for round in 0..<2000 {
            let status = statuses[Int(generator.next() % UInt64(statuses.count))]
            let throughProxy = generator.next() % 2 == 0
            let head = Machine.Head(
                status: status, throughProxy: throughProxy, mayAnswerChallenges: generator.next() % 3 != 0,
                brokerAddedExpect: generator.next() % 2 == 0, cacheTakesPart: generator.next() % 2 == 0
            )
            let answers = Answers(
                bodyWithheld: generator.next() % 3 == 0, proxyChallenge: generator.next() % 2 == 0, proxyRefused: generator.next() % 5 == 0,
                challengeAnswered: generator.next() % 2 == 0, originRefused: generator.next() % 5 == 0,
                cache: decisions[Int(generator.next() % 3)]
            )
            let actions = Self.run(head, answers)
            #expect(actions.count <= 6, "round \(round): \(actions)")
            #expect(actions == Self.model(head, answers), "round \(round): \(head) \(answers)")
        }
    }
}
