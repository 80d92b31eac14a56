import AuthBrokerCore
import Testing

/// The request state machine's rules as transcripts (events in, actions out), and a seeded
/// random drive that checks its invariants on every path.
@Suite("Request state machine")
struct RequestStateMachineTests {
    typealias Machine = RequestStateMachine

    static func request(
        hasBody: Bool = false, keepAlive: Bool = true, ask: Bool = false, adopted: Bool = false, holdsBody: Bool = false,
        closedConnectionRetried: Bool = false
    ) -> Machine.Request {
        Machine.Request(
            hasBody: hasBody, idempotent: true, clientWantsKeepAlive: keepAlive, mayAskAboutTrust: ask, adopted: adopted,
            closedConnectionRetried: closedConnectionRetried, maxAttempts: 6,
            uploadPlan: UploadPlan(
                body: hasBody ? (holdsBody ? .chunked : .length(10)) : .none, clientExpectsContinue: false, replayBound: 100,
                credentialUpFront: false
            )
        )
    }

    static func sent(_ action: Machine.Action) -> Machine.Attempt? {
        if case .send(let attempt) = action { attempt } else { nil }
    }

    /// A bodiless request's machine after its end was read, at its first attempt.
    static func startedWithoutBody(_ request: Machine.Request = request()) throws -> (Machine, Machine.Attempt) {
        var machine = Machine(request)
        #expect(machine.start() == .readRequestEnd)
        let attempt = try #require(Self.sent(machine.requestEndRead(ended: true)))
        return (machine, attempt)
    }

    // MARK: transcripts

    @Test("a plain request: read its end, send once whole, reuse the connection, keep the client")
    func plainRequest() throws {
        var (machine, attempt) = try Self.startedWithoutBody()
        #expect(attempt.number == 1 && attempt.requestEnded && !attempt.adopted && attempt.mayRetryClosedConnection)
        let step = machine.attemptEnded(.init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: true))
        #expect(step == Machine.Step(release: .reuse, next: .finish(keepAlive: true)))
        #expect(machine.isFinished)
    }

    @Test("the direct relay's request: one attempt, answering no challenge; reuse, retry and keep-alive as on the full path")
    func directlyRelayed() throws {
        var (machine, attempt) = try Self.startedWithoutBody(.directlyRelayed)
        #expect(attempt.number == 1 && !attempt.mayAnswerChallenges && attempt.mayRetryClosedConnection)
        var step = machine.attemptEnded(.init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: true))
        #expect(step == Machine.Step(release: .reuse, next: .finish(keepAlive: true)))

        // The origin said close; the daemon began draining before the response ended.
        (machine, _) = try Self.startedWithoutBody(.directlyRelayed)
        step = machine.attemptEnded(.init(exchange: .completed(upstreamKeepAlive: false, clientKeepAlive: true), requestComplete: true))
        #expect(step == Machine.Step(release: .close, next: .finish(keepAlive: true)))
        (machine, _) = try Self.startedWithoutBody(.directlyRelayed)
        step = machine.attemptEnded(
            .init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: true, draining: true)
        )
        #expect(step == Machine.Step(release: .reuse, next: .finish(keepAlive: false)))

        // A pooled connection closed before the head: a second attempt, which the relay hands to
        // the full path; closed by a TLS alert, or any other failure: the broker's error.
        (machine, _) = try Self.startedWithoutBody(.directlyRelayed)
        step = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true))
        #expect(step.release == .closeWithIdle && Self.sent(step.next)?.number == 2)
        (machine, _) = try Self.startedWithoutBody(.directlyRelayed)
        step = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true, closedByTLSAlert: true))
        #expect(step == Machine.Step(release: .close, next: .sendExchangeError(keepAlive: true)))
        (machine, _) = try Self.startedWithoutBody(.directlyRelayed)
        step = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: false), requestComplete: true, draining: true))
        #expect(step == Machine.Step(release: .close, next: .sendExchangeError(keepAlive: false)))

        // Cut off after the head: the client's connection is cut too.
        (machine, _) = try Self.startedWithoutBody(.directlyRelayed)
        step = machine.attemptEnded(.init(exchange: .abortedAfterHead, requestComplete: true))
        #expect(step == Machine.Step(release: .close, next: .finishAborting))
    }

    @Test("rule 1: a response that ended before its request body was sent whole never returns the connection for reuse")
    func responseBeforeBodyIsNotReused() {
        var machine = Machine(Self.request(hasBody: true))
        guard case .send(let attempt) = machine.start() else { Issue.record("no attempt"); return }
        #expect(!attempt.requestEnded && !attempt.mayRetryClosedConnection)
        let step = machine.attemptEnded(.init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: false))
        #expect(step == Machine.Step(release: .close, next: .finish(keepAlive: false)))
    }

    @Test("a connection changed under it (closed, or verified under old anchors) is not reused")
    func unusableConnectionIsNotReused() throws {
        var (machine, _) = try Self.startedWithoutBody()
        let step = machine.attemptEnded(
            .init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: true, connectionUsable: false)
        )
        #expect(step.release == .close)
        #expect(step.next == .finish(keepAlive: true))
    }

    @Test("a bodiless request is retried once when its pooled connection was closed, the origin's other idle ones closed with it, and only once")
    func closedPooledConnectionRetriedOnce() throws {
        var (machine, first) = try Self.startedWithoutBody()
        #expect(first.retriesClosedConnection(reused: true, closedByTLSAlert: false))
        let retry = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true))
        guard case .send(let second) = retry.next else { Issue.record("not retried: \(retry)"); return }
        #expect(retry.release == .closeWithIdle && second.number == 2 && !second.mayRetryClosedConnection)
        #expect(!second.retriesClosedConnection(reused: true, closedByTLSAlert: false))
        let end = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true))
        #expect(end == Machine.Step(release: .closeWithIdle, next: .sendExchangeError(keepAlive: true)))

        // The same when the head could not even be written.
        var (sending, _) = try Self.startedWithoutBody()
        let resend = sending.sendFailed(closedByTLSAlert: false, connectionReused: true)
        #expect(resend.release == .closeWithIdle && Self.sent(resend.next)?.number == 2)
        #expect(
            sending.sendFailed(closedByTLSAlert: false, connectionReused: true)
                == Machine.Step(release: .closeWithIdle, next: .respondWithError(.closedOnSend, clientKeepAlive: true, requestEnded: true))
        )
    }

    @Test("a connection made for the request that closes before any answer is the origin's answer: no retry")
    func freshConnectionClosedIsNotRetried() throws {
        var (machine, first) = try Self.startedWithoutBody()
        #expect(!first.retriesClosedConnection(reused: false, closedByTLSAlert: false))
        let step = machine.attemptEnded(
            .init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true, connectionReused: false)
        )
        #expect(step == Machine.Step(release: .close, next: .sendExchangeError(keepAlive: true)))
        var (sending, _) = try Self.startedWithoutBody()
        #expect(
            sending.sendFailed(closedByTLSAlert: false, connectionReused: false)
                == Machine.Step(release: .close, next: .respondWithError(.closedOnSend, clientKeepAlive: true, requestEnded: true))
        )
    }

    @Test("a bodiless POST is never sent again (RFC 9110 §9.2.2), but its dropped pooled connection still clears the others")
    func nonIdempotentIsNotRetried() throws {
        let post = Machine.Request(
            hasBody: false, idempotent: Machine.Request.isIdempotent(method: "POST"), clientWantsKeepAlive: true, mayAskAboutTrust: false,
            adopted: false, maxAttempts: 6, uploadPlan: UploadPlan(body: .none, clientExpectsContinue: false, replayBound: 100, credentialUpFront: false)
        )
        #expect(!post.idempotent && Machine.Request.isIdempotent(method: "PUT") && Machine.Request.isIdempotent(method: "GET"))
        var (machine, first) = try Self.startedWithoutBody(post)
        #expect(!first.mayRetryClosedConnection)
        let step = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true))
        #expect(step == Machine.Step(release: .closeWithIdle, next: .sendExchangeError(keepAlive: true)))
        var (sending, _) = try Self.startedWithoutBody(post)
        #expect(sending.sendFailed(closedByTLSAlert: false, connectionReused: true).release == .closeWithIdle)

        // A body: not sent again either, and the same for the idle ones.
        var withBody = Machine(Self.request(hasBody: true))
        _ = withBody.start()
        #expect(withBody.sendFailed(closedByTLSAlert: false, connectionReused: true).release == .closeWithIdle)
        // A connection made for it, or closed by an alert: only itself.
        var (fresh, _) = try Self.startedWithoutBody(post)
        #expect(fresh.sendFailed(closedByTLSAlert: false, connectionReused: false).release == .close)
        var (alerted, _) = try Self.startedWithoutBody(post)
        #expect(alerted.sendFailed(closedByTLSAlert: true, connectionReused: true).release == .close)
    }

    @Test("the one retry also serves a later attempt: a pooled connection closed under the resend after a challenge")
    func retryAfterChallenge() throws {
        var (machine, _) = try Self.startedWithoutBody()
        guard case .send(let second) = machine.attemptEnded(.init(exchange: .challengeAnswered(upstreamKeepAlive: true), requestComplete: true)).next
        else { Issue.record("no resend after the challenge"); return }
        #expect(second.mayRetryClosedConnection)
        let retry = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true))
        #expect(retry.release == .closeWithIdle && Self.sent(retry.next)?.number == 3)
    }

    @Test("a request the direct relay handed over after its pooled connection closed has had its retry")
    func handedOverAfterClosedConnection() throws {
        var (machine, first) = try Self.startedWithoutBody(Self.request(closedConnectionRetried: true))
        #expect(first.number == 1 && !first.mayRetryClosedConnection)
        let step = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true))
        #expect(step == Machine.Step(release: .closeWithIdle, next: .sendExchangeError(keepAlive: true)))
    }

    @Test("a TLS alert that closed the connection is the origin's answer: no retry")
    func tlsAlertIsNotRetried() throws {
        var (machine, _) = try Self.startedWithoutBody()
        let step = machine.attemptEnded(
            .init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true, closedByTLSAlert: true)
        )
        #expect(step.next == .sendExchangeError(keepAlive: true))
        var (sending, _) = try Self.startedWithoutBody()
        #expect(
            sending.sendFailed(closedByTLSAlert: true, connectionReused: true).next
                == .respondWithError(.tlsAlertOnSend, clientKeepAlive: true, requestEnded: true)
        )
    }

    @Test("a request with a body is never retried on a closed connection: its body may have gone")
    func bodyIsNotRetried() {
        var machine = Machine(Self.request(hasBody: true))
        _ = machine.start()
        #expect(
            machine.sendFailed(closedByTLSAlert: false, connectionReused: true).next
                == .respondWithError(.closedOnSend, clientKeepAlive: true, requestEnded: false)
        )
    }

    @Test("trust is asked about once: a yes connects anew, a second refusal is the broker's error")
    func trustAskedOnce() throws {
        var (machine, _) = try Self.startedWithoutBody(Self.request(ask: true))
        #expect(machine.leaseFailed(untrustedServer: true) == Machine.Step(release: nil, next: .askAboutTrust))
        guard case .send(let again) = machine.trustAnswered(true) else { Issue.record("not sent again"); return }
        #expect(again.number == 2)
        #expect(machine.leaseFailed(untrustedServer: true).next == .respondWithError(.leaseFailed, clientKeepAlive: true, requestEnded: true))
    }

    @Test("without Authbroker-Interactive, or for another failure, a lease failure is answered at once")
    func leaseFailureWithoutAgent() throws {
        var (machine, _) = try Self.startedWithoutBody()
        #expect(machine.leaseFailed(untrustedServer: true).next == .respondWithError(.leaseFailed, clientKeepAlive: true, requestEnded: true))
        var (asking, _) = try Self.startedWithoutBody(Self.request(ask: true))
        #expect(asking.leaseFailed(untrustedServer: false).next == .respondWithError(.leaseFailed, clientKeepAlive: true, requestEnded: true))
    }

    @Test("an agent's no answers the client with the lease's error")
    func trustRefused() throws {
        var (machine, _) = try Self.startedWithoutBody(Self.request(ask: true))
        _ = machine.leaseFailed(untrustedServer: true)
        #expect(machine.trustAnswered(false) == .respondWithError(.leaseFailed, clientKeepAlive: true, requestEnded: true))
    }

    @Test("the client's broken body outranks the origin, unless the origin's answer already reached the client")
    func malformedBodyOutranks() {
        for exchange: Machine.Exchange in [.failedBeforeHead(connectionClosed: true), .challengeAnswered(upstreamKeepAlive: true), .expectationRefused] {
            var machine = Machine(Self.request(hasBody: true))
            _ = machine.start()
            let step = machine.attemptEnded(.init(exchange: exchange, requestComplete: false, malformedBody: true))
            #expect(step == Machine.Step(release: .close, next: .respondWithError(.malformedBody, clientKeepAlive: false, requestEnded: true)))
        }
        var machine = Machine(Self.request(hasBody: true))
        _ = machine.start()
        let answered = machine.attemptEnded(.init(exchange: .errorSent(keepAlive: false), requestComplete: false, malformedBody: true))
        #expect(answered == Machine.Step(release: .close, next: .finish(keepAlive: false)))
    }

    @Test("an answered challenge resends on the same connection when it stayed in step; never on the last attempt")
    func challengeAnswered() throws {
        var (machine, first) = try Self.startedWithoutBody()
        #expect(first.mayAnswerChallenges)
        var attempt = first
        for number in 2...6 {
            let step = machine.attemptEnded(.init(exchange: .challengeAnswered(upstreamKeepAlive: true), requestComplete: true))
            #expect(step.release == .reuse)
            guard case .send(let next) = step.next else { Issue.record("no resend"); return }
            #expect(next.number == number && next.requestEnded)
            attempt = next
        }
        #expect(!attempt.mayAnswerChallenges, "the sixth attempt's 401 goes to the client")
    }

    @Test("a 304 that did not select what the cache validated sends the request again, on the same connection when it stayed in step")
    func cacheValidationNotSelected() throws {
        var (machine, first) = try Self.startedWithoutBody()
        let step = machine.attemptEnded(.init(exchange: .cacheValidationNotSelected(upstreamKeepAlive: true), requestComplete: true))
        #expect(step.release == .reuse)
        guard case .send(let second) = step.next else { Issue.record("no resend"); return }
        #expect(second.number == first.number + 1 && second.requestEnded && second.mayAnswerChallenges)
        var (closing, _) = try Self.startedWithoutBody()
        #expect(closing.attemptEnded(.init(exchange: .cacheValidationNotSelected(upstreamKeepAlive: false), requestComplete: true)).release == .close)
    }

    @Test("a body withheld for 100 Continue leaves the connection out of step, and the client connection ends")
    func withheldBody() {
        var machine = Machine(Self.request(hasBody: true, holdsBody: true))
        guard case .send(let first) = machine.start() else { Issue.record("no attempt"); return }
        #expect(first.uploadPlan.holdsBody && first.uploadPlan.addsExpect)
        let answered = machine.attemptEnded(
            .init(exchange: .challengeAnswered(upstreamKeepAlive: true), requestComplete: false, bodyWithheld: true)
        )
        #expect(answered.release == .close)
        guard case .send(let second) = answered.next else { Issue.record("no resend"); return }
        #expect(second.uploadPlan.holdsBody, "the body is still unread: the next attempt holds it too")
        let done = machine.attemptEnded(
            .init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: false, bodyWithheld: true)
        )
        #expect(done == Machine.Step(release: .close, next: .finishDiscardingBody))
    }

    @Test("a 417 to the broker's own Expect resends without it, streaming the body")
    func expectationRefused() {
        var machine = Machine(Self.request(hasBody: true, holdsBody: true))
        _ = machine.start()
        let step = machine.attemptEnded(.init(exchange: .expectationRefused, requestComplete: false, bodyWithheld: true))
        guard case .send(let second) = step.next else { Issue.record("no resend"); return }
        #expect(step.release == .close && !second.uploadPlan.addsExpect && !second.uploadPlan.holdsBody)
    }

    @Test("draining or a client that asked to close: the client connection ends after the response")
    func keepAliveRules() throws {
        var (draining, _) = try Self.startedWithoutBody()
        let step = draining.attemptEnded(
            .init(exchange: .completed(upstreamKeepAlive: true, clientKeepAlive: true), requestComplete: true, draining: true)
        )
        #expect(step == Machine.Step(release: .reuse, next: .finish(keepAlive: false)))
        var (closing, _) = try Self.startedWithoutBody(Self.request(keepAlive: false))
        #expect(closing.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: false), requestComplete: true)).next
            == .sendExchangeError(keepAlive: false))
    }

    @Test("the relay's adopted exchange is the first attempt only")
    func adopted() throws {
        var (machine, first) = try Self.startedWithoutBody(Self.request(adopted: true))
        #expect(first.adopted)
        guard case .send(let second) = machine.attemptEnded(.init(exchange: .failedBeforeHead(connectionClosed: true), requestComplete: true)).next
        else { Issue.record("no retry"); return }
        #expect(!second.adopted)
    }

    @Test("a client that leaves before its bodiless request ends: nothing goes upstream")
    func clientGoneBeforeEnd() {
        var machine = Machine(Self.request())
        _ = machine.start()
        #expect(machine.requestEndRead(ended: false) == .finishClientGone)
        #expect(machine.isFinished)
    }

    // MARK: seeded random drive

    @Test("random drives: every request ends, attempts are bounded, rule 1 holds, trust is asked at most once", arguments: 0..<8)
    func randomDrives(batch: Int) {
        for seed in UInt64(batch * 250)..<UInt64(batch * 250 + 250) {
            var random = ChallengeQueueRandomTests.SplitMix(state: seed)
            let request = Self.request(
                hasBody: Bool.random(using: &random), keepAlive: Bool.random(using: &random), ask: Bool.random(using: &random),
                adopted: Bool.random(using: &random), holdsBody: Bool.random(using: &random),
                closedConnectionRetried: Int.random(in: 0..<4, using: &random) == 0
            )
            var machine = Machine(request)
            var action = machine.start()
            var attempts = 0
            var questions = 0
            var steps = 0
            var requestEnded = false
            var retries = 0
            while !machine.isFinished {
                steps += 1
                guard steps < 100 else {
                    Issue.record("seed \(seed): no end after 100 steps")
                    return
                }
                switch action {
                case .readRequestEnd:
                    action = machine.requestEndRead(ended: Int.random(in: 0..<10, using: &random) > 0)
                    requestEnded = true
                case .askAboutTrust:
                    questions += 1
                    action = machine.trustAnswered(Bool.random(using: &random))
                case .send(let attempt):
                    attempts += 1
                    #expect(attempt.number == attempts, "seed \(seed)")
                    #expect(!attempt.adopted || attempt.number == 1, "seed \(seed)")
                    switch Int.random(in: 0..<10, using: &random) {
                    case 0:
                        action = machine.leaseFailed(untrustedServer: Bool.random(using: &random)).next
                    case 1:
                        let reused = Bool.random(using: &random)
                        let step = machine.sendFailed(closedByTLSAlert: Bool.random(using: &random), connectionReused: reused)
                        if case .send = step.next, step.release == .closeWithIdle {
                            retries += 1
                            #expect(reused, "seed \(seed): retried after a fresh connection closed")
                        }
                        if step.release == .closeWithIdle { #expect(reused, "seed \(seed): idle ones closed after a fresh connection") }
                        action = step.next
                    default:
                        let complete = attempt.requestEnded || Bool.random(using: &random)
                        let reused = Bool.random(using: &random)
                        requestEnded = complete
                        let exchanges: [Machine.Exchange] = [
                            .completed(upstreamKeepAlive: Bool.random(using: &random), clientKeepAlive: Bool.random(using: &random)),
                            .failedBeforeHead(connectionClosed: Bool.random(using: &random)),
                            .errorSent(keepAlive: Bool.random(using: &random)), .abortedAfterHead,
                            .challengeAnswered(upstreamKeepAlive: Bool.random(using: &random)), .expectationRefused,
                        ]
                        // A challenge is answered only where the attempt allows it.
                        var exchange = exchanges.randomElement(using: &random) ?? .abortedAfterHead
                        if case .challengeAnswered = exchange, !attempt.mayAnswerChallenges { exchange = .abortedAfterHead }
                        let step = machine.attemptEnded(
                            .init(
                                exchange: exchange, requestComplete: complete, malformedBody: !complete && Int.random(in: 0..<8, using: &random) == 0,
                                bodyWithheld: !complete && attempt.uploadPlan.holdsBody && Bool.random(using: &random),
                                connectionUsable: Bool.random(using: &random), closedByTLSAlert: Int.random(in: 0..<6, using: &random) == 0,
                                connectionReused: reused, draining: Int.random(in: 0..<10, using: &random) == 0
                            )
                        )
                        if case .send = step.next, step.release == .closeWithIdle {
                            retries += 1
                            #expect(reused && !request.hasBody, "seed \(seed): retried after a fresh connection closed, or with a body")
                        }
                        if step.release == .reuse { #expect(complete, "seed \(seed): reused a connection whose request did not end") }
                        action = step.next
                    }
                case .respondWithError, .sendExchangeError, .finish, .finishDiscardingBody, .finishAborting, .finishClientGone:
                    Issue.record("seed \(seed): a final action \(action) did not finish the machine")
                    return
                }
            }
            #expect(questions <= 1, "seed \(seed): asked about trust \(questions) times")
            #expect(retries <= (request.closedConnectionRetried ? 0 : 1), "seed \(seed): \(retries) retries on closed connections")
            #expect(attempts <= 8, "seed \(seed): \(attempts) attempts")
            if case .finish(true) = action { #expect(requestEnded, "seed \(seed): kept a client whose request did not end") }
            if case .send = action { Issue.record("seed \(seed): finished with a send pending") }
        }
    }
}
