import NIOHTTP1

/// What becomes of an attempt's final response head before the client sees any of it: the
/// order of the broker's checks, as decisions. Pure: the shell (the full path's response pump,
/// and the direct relay) runs each action and reports what it learnt.
///
/// The checks, in order, each pinned by a transcript test (`FinalHeadMachineTests`):
/// 1. **The continue gate** learns a final head came, and says whether the request body was held
///    for `100 Continue` and never sent. A 417 to an `Expect` the broker added itself, with the
///    body withheld, is not the client's: the attempt is read away and sent again without it.
/// 2. **A head from beyond the upstream proxy** (the request went through it, and this is not
///    its own challenge) means the proxy took what it was sent; a proxy whose final Negotiate
///    token does not prove who it is gets the broker's Kerberos error instead.
/// 3. **A challenge** (a 401, or the upstream proxy's own 407) on an attempt that may answer
///    one: the authenticator answers it from the store, or declines. Answered, the response is
///    read away and the request goes again.
/// 4. **The origin** takes the head as the answer to what it was sent (a Digest `rspauth`, a
///    final Negotiate token checked); a challenge the app could answer only with Kerberos that
///    the broker could not do, or a server that does not prove who it is, gets the broker's
///    Kerberos error instead.
/// 5. **The cache**, where it takes part, forwards the head, answers from its store, or has the
///    request sent again without the conditions it added.
/// 6. Otherwise the head goes to the client; with the body withheld, the client connection ends
///    after the response (the body stays unread).
package struct FinalHeadMachine: Sendable {
    /// What the shell knows of the head and the attempt when the head arrives.
    package struct Head: Sendable, Hashable {
        package var status: HTTPResponseStatus
        /// The request went through the upstream proxy in absolute form (an `http://` origin).
        package var throughProxy: Bool
        /// A challenge may be answered on this attempt (`RequestStateMachine.Attempt`).
        package var mayAnswerChallenges: Bool
        /// The broker added `Expect: 100-continue` to this attempt itself.
        package var brokerAddedExpect: Bool
        /// The cache takes part in the exchange (it stores the response or validated one).
        package var cacheTakesPart: Bool

        package init(
            status: HTTPResponseStatus, throughProxy: Bool = false, mayAnswerChallenges: Bool, brokerAddedExpect: Bool = false,
            cacheTakesPart: Bool = false
        ) {
            self.status = status
            self.throughProxy = throughProxy
            self.mayAnswerChallenges = mayAnswerChallenges
            self.brokerAddedExpect = brokerAddedExpect
            self.cacheTakesPart = cacheTakesPart
        }
    }

    /// Why the client never sees this response: the attempt ends after it is read away.
    package enum Discarded: Sendable, Hashable {
        /// 417 to the broker's own `Expect`, before the body: send again without it.
        case expectationRefused
        /// The challenge was answered from the store: send again with the credential.
        case challengeAnswered(byProxy: Bool)
        /// A 304 to the cache's own validation that does not select what it stored.
        case cacheValidationNotSelected
    }

    package enum Action: Sendable, Hashable {
        /// Tell the continue gate a final head came: `gateAnswered(bodyWithheld:isProxyChallenge:)`
        /// follows.
        case askContinueGate
        /// Check that the upstream proxy accepted what it was sent: `proxyChecked(refused:)`.
        case checkProxyAccepted
        /// Ask the authenticator to answer the challenge: `challengeAnswered(_:)` follows.
        case answerChallenge(byProxy: Bool)
        /// Check that the origin (or the proxy, for its own challenge) accepts this head as the
        /// answer to what it was sent: `originChecked(refused:)` follows.
        case checkOriginAccepted(byProxy: Bool)
        /// Ask the cache what it makes of the head: `cacheDecided(_:)` follows.
        case consultCache
        /// Read the response away; the attempt ends, and nothing reached the client.
        case discard(Discarded)
        /// Read the response away and answer with the broker's Kerberos error instead.
        case kerberosError
        /// The cache answers from its store instead.
        case serveStored
        /// The head goes to the client. `closeClient`: with `Connection: close` (the request
        /// body was withheld and stays unread).
        case forward(closeClient: Bool)
    }

    /// What the cache makes of a final head.
    package enum CacheDecision: Sendable, Hashable {
        case forward
        case serveStored
        case repeatUnconditionally
    }

    private let head: Head
    private var bodyWithheld = false
    /// A 407 in the upstream proxy's own space: its challenge, not an origin's behind it.
    private var isProxyChallenge = false
    package private(set) var isDecided = false

    package init(_ head: Head) {
        self.head = head
    }

    /// The first action.
    package func start() -> Action {
        .askContinueGate
    }

    /// The gate said whether the attempt's body was held and never sent; `isProxyChallenge`: the
    /// head is a 407 in the upstream proxy's own space (asked after the gate, which may wait:
    /// the proxy's spaces may have been learnt meanwhile).
    package mutating func gateAnswered(bodyWithheld: Bool, isProxyChallenge: Bool = false) -> Action {
        self.bodyWithheld = bodyWithheld
        self.isProxyChallenge = isProxyChallenge && self.head.throughProxy && self.head.status == .proxyAuthenticationRequired
        if bodyWithheld,
            ExpectContinue.withheldOutcome(
                status: self.head.status, isProxyChallenge: self.isProxyChallenge, brokerAddedExpect: self.head.brokerAddedExpect
            ) == .expectationRefused
        {
            return self.decide(.discard(.expectationRefused))
        }
        if self.head.throughProxy, !self.isProxyChallenge { return .checkProxyAccepted }
        return self.challengeOrOrigin()
    }

    /// The upstream proxy's final Negotiate token did (or did not) prove who it is.
    package mutating func proxyChecked(refused: Bool) -> Action {
        refused ? self.decide(.kerberosError) : self.challengeOrOrigin()
    }

    /// The authenticator answered the challenge (`retry`), or declined.
    package mutating func challengeAnswered(_ retry: Bool) -> Action {
        retry ? self.decide(.discard(.challengeAnswered(byProxy: self.isProxyChallenge))) : self.checkOrigin()
    }

    /// The origin's (or proxy's) acceptance was checked: `refused` means the broker's Kerberos
    /// error replaces the head.
    package mutating func originChecked(refused: Bool) -> Action {
        if refused { return self.decide(.kerberosError) }
        return self.head.cacheTakesPart ? .consultCache : self.decide(.forward(closeClient: self.bodyWithheld))
    }

    package mutating func cacheDecided(_ decision: CacheDecision) -> Action {
        switch decision {
        case .forward: self.decide(.forward(closeClient: self.bodyWithheld))
        case .serveStored: self.decide(.serveStored)
        case .repeatUnconditionally: self.decide(.discard(.cacheValidationNotSelected))
        }
    }

    // MARK: -

    private var isChallenge: Bool { self.head.status == .unauthorized || self.isProxyChallenge }

    private func challengeOrOrigin() -> Action {
        self.isChallenge && self.head.mayAnswerChallenges ? .answerChallenge(byProxy: self.isProxyChallenge) : self.checkOrigin()
    }

    private func checkOrigin() -> Action {
        .checkOriginAccepted(byProxy: self.isProxyChallenge)
    }

    private mutating func decide(_ action: Action) -> Action {
        self.isDecided = true
        return action
    }
}
