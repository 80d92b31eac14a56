import NIOHTTP1

/// Whether a request's body waits for the origin's `100 Continue` (RFC 9110 §10.1.1) before it
/// is read from the client, decided per request and updated between its attempts.
///
/// The broker holds a body when the client asked for that itself (`Expect: 100-continue`: it
/// will not send before a 100 anyway), or when the body is too large for the replay buffer and
/// no credential goes up front, so a 401 would otherwise cost the whole body and could not be
/// answered. Then the broker adds `Expect: 100-continue` itself: the origin's 401 comes before
/// the body, is answered from the store, and the request goes again with the body still unread.
package struct UploadPlan: Sendable, Hashable {
    /// The body is read from the client only after the origin's 100, a final status, or
    /// `ExpectContinue.timeout`.
    package private(set) var holdsBody: Bool
    /// The broker adds `Expect: 100-continue` to the upstream head (the client sent none).
    package private(set) var addsExpect: Bool

    /// The plan for a request's first attempt.
    ///
    /// - Parameters:
    ///   - body: the request body's framing.
    ///   - clientExpectsContinue: the client sent `Expect: 100-continue`.
    ///   - replayBound: `request_body_buffer_bytes`: bodies up to this are kept for a resend.
    ///   - credentialUpFront: the first attempt carries an `Authorization` (the client's, or
    ///     the broker's for a space it knows).
    package init(body: RequestBodyFraming, clientExpectsContinue: Bool, replayBound: Int, credentialUpFront: Bool) {
        if body == .none {
            (self.holdsBody, self.addsExpect) = (false, false)
        } else if clientExpectsContinue {
            (self.holdsBody, self.addsExpect) = (true, false)
        } else if body.mayExceed(replayBound) && !credentialUpFront {
            (self.holdsBody, self.addsExpect) = (true, true)
        } else {
            (self.holdsBody, self.addsExpect) = (false, false)
        }
    }

    /// The body started to flow on an attempt: later attempts can only send its replayed copy,
    /// so nothing is held any more (the client's own `Expect` still goes upstream).
    package mutating func bodyStarted() {
        (self.holdsBody, self.addsExpect) = (false, false)
    }

    /// The origin answered 417 (Expectation Failed) to an `Expect` the broker added: send the
    /// request again without it, streaming the body (RFC 9110 §10.1.1). Returns whether that
    /// applies (false: the client's own `Expect` was refused, which is the client's to handle).
    package mutating func expectationFailed() -> Bool {
        guard self.addsExpect else { return false }
        (self.holdsBody, self.addsExpect) = (false, false)
        return true
    }
}

/// One attempt's hand-off between the response pump (which sees the origin's 100 and final
/// status) and the request side (which holds the client's body), as a value: every event returns
/// what to do, and nothing here waits or writes.
///
/// Invariants: the body is either sent or withheld, decided once per attempt; at most one
/// `100 Continue` reaches the client per request, never after a final status and never before
/// the broker wants the body.
package struct ContinueGateStateMachine: Sendable, Hashable {
    package enum State: Sendable, Hashable {
        /// The upstream head went with `Expect`; the body waits.
        case holding
        /// The body is (being) sent.
        case bodyFlowing
        /// A final status came first: this attempt never sends the body.
        case bodyWithheld
    }

    /// What the request side does once the body's fate is decided.
    package enum BodyDecision: Sendable, Hashable {
        /// Send the body; first write `100 Continue` to the client when `writeContinueToClient`
        /// (then report `continueWritten()`).
        case send(writeContinueToClient: Bool)
        /// Do not send it on this attempt.
        case withhold
    }

    /// What the response pump does with a final response head.
    package enum FinalHeadAction: Sendable, Hashable {
        /// The body was never sent on this attempt: the upstream connection is out of step, and
        /// a 401 can be answered with the body still unread.
        case bodyWithheld
        /// The body was sent (or is being sent): carry on as for any response.
        case bodyFlowing
        /// The request side is writing a `100 Continue` to the client: wait for `continueWritten()`
        /// before writing the final head, then carry on as `bodyFlowing`.
        case waitForContinueWrite
    }

    package private(set) var state: State
    /// The client sent `Expect: 100-continue` (it may be waiting for a 100 before its body).
    package let clientExpectsContinue: Bool
    /// A 100 went to the client, on this attempt or an earlier one of the request.
    package private(set) var continueSentToClient: Bool
    private var continueWriteInFlight = false
    /// A final head arrived: no 100 may reach the client after it (RFC 9110 §15.2).
    private var finalHeadSeen = false

    package init(holdsBody: Bool, clientExpectsContinue: Bool, continueSentToClient: Bool) {
        self.state = holdsBody ? .holding : .bodyFlowing
        self.clientExpectsContinue = clientExpectsContinue
        self.continueSentToClient = continueSentToClient
    }

    /// Whether the body still waits (the request side should wait for a decision).
    package var isHolding: Bool { self.state == .holding }

    /// The origin sent `100 Continue`. Returns whether the pump relays it to the client;
    /// `startsBody` says whether this decided the body's fate (`.send(writeContinueToClient: false)`).
    package mutating func originSentContinue() -> (relayToClient: Bool, startsBody: Bool) {
        let startsBody = self.state == .holding
        if startsBody { self.state = .bodyFlowing }
        guard self.state == .bodyFlowing, self.clientExpectsContinue, !self.continueSentToClient, !self.continueWriteInFlight,
            !self.finalHeadSeen
        else { return (false, startsBody) }
        self.continueSentToClient = true
        return (true, startsBody)
    }

    /// The wait for the origin's 100 ran out (the origin ignores `Expect`, or speaks HTTP/1.0):
    /// send the body anyway. Nil when the fate was already decided.
    package mutating func timedOut() -> BodyDecision? {
        guard self.state == .holding else { return nil }
        self.state = .bodyFlowing
        // The broker now wants the body: a client waiting for a 100 gets one from the broker.
        let write = self.clientExpectsContinue && !self.continueSentToClient
        if write {
            self.continueSentToClient = true
            self.continueWriteInFlight = true
        }
        return .send(writeContinueToClient: write)
    }

    /// The request side finished writing the broker's own `100 Continue`.
    package mutating func continueWritten() {
        self.continueWriteInFlight = false
    }

    /// A final response head arrived. While the body is held, a 2xx means the origin reads the
    /// body as it answers (a full-duplex echo, say): the body flows, as curl does; any other
    /// status withholds it (RFC 9110 §10.1.1).
    package mutating func finalHeadArrived(status: HTTPResponseStatus) -> FinalHeadAction {
        self.finalHeadSeen = true
        switch self.state {
        case .holding where (200..<300).contains(status.code):
            self.state = .bodyFlowing
            return .bodyFlowing
        case .holding, .bodyWithheld:
            self.state = .bodyWithheld
            return .bodyWithheld
        case .bodyFlowing:
            return self.continueWriteInFlight ? .waitForContinueWrite : .bodyFlowing
        }
    }

    /// The exchange failed before a final head: a held body is not sent. Returns whether this
    /// decided the body's fate (`.withhold`).
    package mutating func exchangeFailed() -> Bool {
        guard self.state == .holding else { return false }
        self.state = .bodyWithheld
        return true
    }

    /// The decision for the request side once the state left `holding` through an event of the
    /// response pump (the origin's 100, a final status, a failure).
    package var decision: BodyDecision? {
        switch self.state {
        case .holding: nil
        case .bodyFlowing: .send(writeContinueToClient: false)
        case .bodyWithheld: .withhold
        }
    }
}

/// RFC 9110 §10.1.1's constants and the status that follows an unread body.
package enum ExpectContinue {
    /// How long a held body waits for the origin's 100 before it is sent anyway: the RFC leaves
    /// it to the client; one second is what curl waits.
    package static let timeout: Duration = .seconds(1)

    /// A final status that came while the body was withheld, and what it means for the request.
    package enum WithheldOutcome: Sendable, Hashable {
        /// The origin's challenge (401, or the upstream proxy's 407): the authenticator may answer
        /// it, and the request goes again with the body still unread.
        case challenge
        /// 417 to the `Expect` the broker added: go again without it.
        case expectationRefused
        /// Anything else (3xx to 5xx; a 2xx lets the body flow instead): the client gets it, and
        /// its unread body ends the client connection.
        case relayAndClose
    }

    package static func withheldOutcome(status: HTTPResponseStatus, isProxyChallenge: Bool, brokerAddedExpect: Bool)
        -> WithheldOutcome
    {
        if status == .unauthorized || isProxyChallenge { return .challenge }
        if status == .expectationFailed && brokerAddedExpect { return .expectationRefused }
        return .relayAndClose
    }
}
