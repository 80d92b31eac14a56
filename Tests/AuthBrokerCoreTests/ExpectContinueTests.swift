import AuthBrokerCore
import NIOHTTP1
import Testing

@Suite("Expect: 100-continue")
struct ExpectContinueTests {
    static func head(_ headers: [(String, String)]) -> HTTPRequestHead {
        HTTPRequestHead(version: .http1_1, method: .PUT, uri: "/up", headers: HTTPHeaders(headers))
    }

    @Test(
        "a body's framing comes from its head",
        arguments: [
            ([], RequestBodyFraming.none),
            ([("Content-Length", "0")], .none),
            ([("Content-Length", "12")], .length(12)),
            ([("Content-Length", "junk")], .none),
            ([("Transfer-Encoding", "chunked")], .chunked),
            ([("Transfer-Encoding", "gzip, Chunked"), ("Content-Length", "3")], .chunked),
        ] as [([(String, String)], RequestBodyFraming)]
    )
    func framing(headers: [(String, String)], expected: RequestBodyFraming) {
        #expect(RequestBodyFraming(Self.head(headers)) == expected)
    }

    struct PlanCase: Sendable, CustomTestStringConvertible {
        var body: RequestBodyFraming
        var clientExpects: Bool
        var credentialUpFront: Bool
        var holds: Bool
        var addsExpect: Bool
        var testDescription: String { "\(body) client-expect=\(clientExpects) credential=\(credentialUpFront)" }
    }

    @Test(
        "the first attempt holds a body the replay buffer cannot keep, unless a credential goes up front; the client's own Expect always holds",
        arguments: [
            PlanCase(body: .none, clientExpects: false, credentialUpFront: false, holds: false, addsExpect: false),
            PlanCase(body: .none, clientExpects: true, credentialUpFront: false, holds: false, addsExpect: false),
            PlanCase(body: .length(100), clientExpects: false, credentialUpFront: false, holds: false, addsExpect: false),
            PlanCase(body: .length(1000), clientExpects: false, credentialUpFront: false, holds: false, addsExpect: false),
            PlanCase(body: .length(1001), clientExpects: false, credentialUpFront: false, holds: true, addsExpect: true),
            PlanCase(body: .length(1001), clientExpects: false, credentialUpFront: true, holds: false, addsExpect: false),
            PlanCase(body: .chunked, clientExpects: false, credentialUpFront: false, holds: true, addsExpect: true),
            PlanCase(body: .chunked, clientExpects: false, credentialUpFront: true, holds: false, addsExpect: false),
            PlanCase(body: .length(100), clientExpects: true, credentialUpFront: false, holds: true, addsExpect: false),
            PlanCase(body: .length(5000), clientExpects: true, credentialUpFront: true, holds: true, addsExpect: false),
        ]
    )
    func firstAttempt(_ c: PlanCase) {
        let plan = UploadPlan(body: c.body, clientExpectsContinue: c.clientExpects, replayBound: 1000, credentialUpFront: c.credentialUpFront)
        #expect(plan.holdsBody == c.holds)
        #expect(plan.addsExpect == c.addsExpect)
    }

    @Test("later attempts: held again while the body is unread; never once it flowed; a 417 to the broker's Expect drops it")
    func laterAttempts() {
        var plan = UploadPlan(body: .length(5000), clientExpectsContinue: false, replayBound: 1000, credentialUpFront: false)
        #expect(plan.holdsBody && plan.addsExpect)
        // A 401 answered before the body: the plan is unchanged, so the retry holds again.
        var afterStart = plan
        afterStart.bodyStarted()
        #expect(!afterStart.holdsBody && !afterStart.addsExpect)
        let refused = plan.expectationFailed()
        #expect(refused)
        #expect(!plan.holdsBody && !plan.addsExpect)

        var clients = UploadPlan(body: .length(5000), clientExpectsContinue: true, replayBound: 1000, credentialUpFront: false)
        let clientsRefused = clients.expectationFailed()
        #expect(!clientsRefused, "the client's own Expect refused is the client's to handle")
        #expect(clients.holdsBody)
    }

    typealias Machine = ContinueGateStateMachine

    @Test("transcript: the origin's 100 starts the body and is relayed once to a client that asked")
    func continueFromOrigin() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: true, continueSentToClient: false)
        #expect(machine.isHolding)
        #expect(machine.decision == nil)
        #expect(machine.originSentContinue() == (relayToClient: true, startsBody: true))
        #expect(machine.decision == .send(writeContinueToClient: false))
        #expect(machine.continueSentToClient)
        #expect(machine.originSentContinue() == (relayToClient: false, startsBody: false), "never a second 100")
        #expect(machine.timedOut() == nil, "the timer is too late")
        #expect(machine.finalHeadArrived(status: .ok) == .bodyFlowing)
    }

    @Test("transcript: a client that did not ask never sees a 100")
    func continueNotAsked() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: false, continueSentToClient: false)
        #expect(machine.originSentContinue() == (relayToClient: false, startsBody: true))
        #expect(machine.decision == .send(writeContinueToClient: false))
        var timed = Machine(holdsBody: true, clientExpectsContinue: false, continueSentToClient: false)
        #expect(timed.timedOut() == .send(writeContinueToClient: false))
        #expect(timed.finalHeadArrived(status: .ok) == .bodyFlowing)
    }

    @Test("transcript: a final status before the 100 withholds the body, for good on this attempt")
    func finalFirst() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: true, continueSentToClient: false)
        #expect(machine.finalHeadArrived(status: .unauthorized) == .bodyWithheld)
        #expect(machine.decision == .withhold)
        #expect(machine.timedOut() == nil)
        #expect(machine.originSentContinue() == (relayToClient: false, startsBody: false), "a 100 after the final status goes nowhere")
        #expect(!machine.continueSentToClient)
        let failedLate = machine.exchangeFailed()
        #expect(!failedLate)
        #expect(machine.state == .bodyWithheld)
    }

    @Test("transcript: a 2xx before the 100 lets the body flow (the origin reads as it answers); no 100 after it")
    func successFirst() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: true, continueSentToClient: false)
        #expect(machine.finalHeadArrived(status: .ok) == .bodyFlowing)
        #expect(machine.decision == .send(writeContinueToClient: false))
        #expect(machine.originSentContinue() == (relayToClient: false, startsBody: false))
        #expect(machine.timedOut() == nil)
        #expect(!machine.continueSentToClient)
    }

    @Test("transcript: the timeout sends the body and the broker's own 100 to a waiting client; the final head waits for that write")
    func timeout() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: true, continueSentToClient: false)
        #expect(machine.timedOut() == .send(writeContinueToClient: true))
        #expect(machine.continueSentToClient)
        #expect(machine.originSentContinue() == (relayToClient: false, startsBody: false), "the origin's late 100 is not a second one")
        #expect(machine.finalHeadArrived(status: .ok) == .waitForContinueWrite)
        machine.continueWritten()
        #expect(machine.finalHeadArrived(status: .ok) == .bodyFlowing)
    }

    @Test("transcript: a 100 already sent on an earlier attempt is not sent again")
    func laterAttemptContinue() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: true, continueSentToClient: true)
        #expect(machine.timedOut() == .send(writeContinueToClient: false))
        var relayed = Machine(holdsBody: true, clientExpectsContinue: true, continueSentToClient: true)
        #expect(relayed.originSentContinue() == (relayToClient: false, startsBody: true))
    }

    @Test("transcript: a body not held flows at once; the origin's 100 still reaches a client that asked")
    func notHeld() {
        var machine = Machine(holdsBody: false, clientExpectsContinue: true, continueSentToClient: false)
        #expect(!machine.isHolding)
        #expect(machine.decision == .send(writeContinueToClient: false))
        #expect(machine.timedOut() == nil)
        #expect(machine.originSentContinue() == (relayToClient: true, startsBody: false))
        let failedLate = machine.exchangeFailed()
        #expect(!failedLate)
        #expect(machine.finalHeadArrived(status: .ok) == .bodyFlowing)
    }

    @Test("transcript: a failed exchange withholds a held body")
    func failure() {
        var machine = Machine(holdsBody: true, clientExpectsContinue: false, continueSentToClient: false)
        let failedWhileHeld = machine.exchangeFailed()
        #expect(failedWhileHeld)
        #expect(machine.decision == .withhold)
        #expect(machine.timedOut() == nil)
    }

    @Test("random drives: the body's fate is decided once, at most one 100 reaches the client, never after a final head or before the body is wanted")
    func randomDrives() {
        // Seeded, so a failure replays.
        var random = ChallengeQueueRandomTests.SplitMix(state: 0x5EED_100C)
        for _ in 0..<2000 {
            let clientExpects = Bool.random(using: &random)
            let sentBefore = Bool.random(using: &random)
            var machine = Machine(holdsBody: Bool.random(using: &random), clientExpectsContinue: clientExpects, continueSentToClient: sentBefore)
            var continues = sentBefore ? 1 : 0
            var finalSeen = false
            var fate = machine.decision
            var writeInFlight = false
            for _ in 0..<8 {
                switch Int.random(in: 0..<5, using: &random) {
                case 0:
                    let result = machine.originSentContinue()
                    if result.relayToClient {
                        continues += 1
                        #expect(!finalSeen)
                    }
                case 1:
                    if case .send(true)? = machine.timedOut() {
                        continues += 1
                        writeInFlight = true
                        #expect(!finalSeen)
                    }
                case 2:
                    if writeInFlight {
                        machine.continueWritten()
                        writeInFlight = false
                    }
                case 3:
                    let status: HTTPResponseStatus = [.ok, .created, .unauthorized, .payloadTooLarge].randomElement(using: &random)!  // never empty
                    let action = machine.finalHeadArrived(status: status)
                    #expect(action != .waitForContinueWrite || writeInFlight)
                    if action != .waitForContinueWrite { finalSeen = true }
                default:
                    _ = machine.exchangeFailed()
                }
                if let decided = machine.decision {
                    if let earlier = fate {
                        #expect(Self.sameFate(earlier, decided))
                    }
                    fate = decided
                }
            }
            #expect(continues <= 1)
            #expect(!clientExpects ? continues == (sentBefore ? 1 : 0) : true)
        }
    }

    static func sameFate(_ a: Machine.BodyDecision, _ b: Machine.BodyDecision) -> Bool {
        switch (a, b) {
        case (.send, .send), (.withhold, .withhold): true
        default: false
        }
    }

    @Test(
        "a final status to a withheld body: a challenge may be answered, 417 to the broker's Expect is retried without it, the rest reach the client",
        arguments: [
            (HTTPResponseStatus.unauthorized, false, true, ExpectContinue.WithheldOutcome.challenge),
            (.proxyAuthenticationRequired, true, false, .challenge),
            (.proxyAuthenticationRequired, false, true, .relayAndClose),
            (.expectationFailed, false, true, .expectationRefused),
            (.expectationFailed, false, false, .relayAndClose),
            (.payloadTooLarge, false, true, .relayAndClose),
            (.ok, false, true, .relayAndClose),
        ] as [(HTTPResponseStatus, Bool, Bool, ExpectContinue.WithheldOutcome)]
    )
    func withheldOutcome(status: HTTPResponseStatus, proxyChallenge: Bool, brokerAdded: Bool, expected: ExpectContinue.WithheldOutcome) {
        #expect(ExpectContinue.withheldOutcome(status: status, isProxyChallenge: proxyChallenge, brokerAddedExpect: brokerAdded) == expected)
    }
}
