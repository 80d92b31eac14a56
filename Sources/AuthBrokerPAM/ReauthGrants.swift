/// How long a re-authentication lasts, and how failures slow the next attempt down.
package struct ReauthPolicy: Sendable, Equatable {
    /// How long a successful re-authentication lets its peer reveal secrets.
    package var grantTTL: Duration
    /// Consecutive failures allowed without any delay before the next attempt.
    package var failuresWithoutDelay: Int
    /// The delay after the first failure past `failuresWithoutDelay`; it doubles with each
    /// further failure.
    package var baseDelay: Duration
    /// The longest delay.
    package var maximumDelay: Duration
    /// Failures older than this (since the last one) are forgotten.
    package var failureMemory: Duration

    package init(
        grantTTL: Duration = .seconds(300), failuresWithoutDelay: Int = 1, baseDelay: Duration = .seconds(1),
        maximumDelay: Duration = .seconds(30), failureMemory: Duration = .seconds(900)
    ) {
        self.grantTTL = grantTTL
        self.failuresWithoutDelay = max(0, failuresWithoutDelay)
        self.baseDelay = baseDelay
        self.maximumDelay = maximumDelay
        self.failureMemory = failureMemory
    }

    /// The wait before the next attempt after `failures` consecutive failures:
    /// with the defaults 0, 0, 1 s, 2 s, 4 s, … 30 s for 0, 1, 2, 3, 4, … failures.
    package func delay(afterFailures failures: Int) -> Duration {
        let doublings = failures - self.failuresWithoutDelay - 1
        guard doublings >= 0 else { return .zero }
        var delay = self.baseDelay
        for _ in 0..<min(doublings, 62) {
            delay *= 2
            if delay >= self.maximumDelay { return self.maximumDelay }
        }
        return min(delay, self.maximumDelay)
    }
}

/// Who may reveal secrets now: per-peer re-authentication grants with a time to live, and a
/// growing delay between attempts after repeated failures.
///
/// A pure value: no I/O and no clock. Every method takes the current instant from its
/// caller, so the daemon passes `ContinuousClock.now` and tests pass fixed instants.
///
/// Grants belong to one peer (uid, pid and process start time): a grant for one process is
/// not valid for another, nor for a later process that reuses the pid. Failures are counted
/// per uid, not per peer, so that starting a new process does not reset the delay; and only
/// one attempt per uid may be in progress, so that parallel attempts cannot skip it.
/// It fails closed: no record means no grant.
package struct ReauthGrants<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    /// Whether a peer may start a re-authentication now.
    package enum Decision: Sendable, Equatable {
        case allowed
        /// Too soon after a failure; try again after this long.
        case retryAfter(Duration)
        /// Another attempt for the same uid has not finished.
        case attemptInProgress
    }

    private struct Failures: Sendable {
        var count: Int
        var last: Instant
    }

    package var policy: ReauthPolicy
    private var grants: [PeerIdentity: Instant] = [:]
    private var failures: [UInt32: Failures] = [:]
    private var inProgress: Set<UInt32> = []

    package init(policy: ReauthPolicy = ReauthPolicy()) {
        self.policy = policy
    }

    /// Whether `peer` may start an attempt at `now`, without recording anything.
    package func mayAttempt(_ peer: PeerIdentity, now: Instant) -> Decision {
        if self.inProgress.contains(peer.uid) { return .attemptInProgress }
        guard let failures = self.currentFailures(uid: peer.uid, now: now) else { return .allowed }
        let delay = self.policy.delay(afterFailures: failures.count)
        let elapsed = failures.last.duration(to: now)
        return elapsed >= delay ? .allowed : .retryAfter(delay - elapsed)
    }

    /// Like `mayAttempt`, and when allowed, records the attempt as in progress until
    /// `recordSuccess`, `recordFailure` or `recordAbandoned` ends it.
    package mutating func beginAttempt(_ peer: PeerIdentity, now: Instant) -> Decision {
        let decision = self.mayAttempt(peer, now: now)
        if decision == .allowed { self.inProgress.insert(peer.uid) }
        return decision
    }

    /// PAM accepted: `peer` holds a grant until `now + grantTTL`, and its uid's failures are
    /// forgotten.
    package mutating func recordSuccess(_ peer: PeerIdentity, now: Instant) {
        self.inProgress.remove(peer.uid)
        self.failures[peer.uid] = nil
        self.grants[peer] = now.advanced(by: self.policy.grantTTL)
    }

    /// PAM refused the answer (wrong password, account problem): counts toward the delay.
    package mutating func recordFailure(_ peer: PeerIdentity, now: Instant) {
        self.inProgress.remove(peer.uid)
        let count = (self.currentFailures(uid: peer.uid, now: now)?.count ?? 0) + 1
        self.failures[peer.uid] = Failures(count: count, last: now)
    }

    /// The attempt ended without PAM judging an answer (timeout, cancellation, system
    /// error): ends it without counting a failure.
    package mutating func recordAbandoned(_ peer: PeerIdentity) {
        self.inProgress.remove(peer.uid)
    }

    /// Whether `peer` holds an unexpired grant at `now`.
    package func hasGrant(_ peer: PeerIdentity, now: Instant) -> Bool {
        self.grantExpiry(peer, now: now) != nil
    }

    /// When `peer`'s grant expires, or nil if it holds none at `now`.
    package func grantExpiry(_ peer: PeerIdentity, now: Instant) -> Instant? {
        guard let expiry = self.grants[peer], now < expiry else { return nil }
        return expiry
    }

    /// Withdraws `peer`'s grant (its connection closed, or the user asked).
    package mutating func revoke(_ peer: PeerIdentity) {
        self.grants[peer] = nil
    }

    /// Withdraws every grant (the session was locked, the daemon is stopping).
    package mutating func revokeAll() {
        self.grants.removeAll()
    }

    /// Forgets expired grants and failures older than `failureMemory`, so memory stays
    /// bounded by the live peers. Changes no decision.
    package mutating func prune(now: Instant) {
        self.grants = self.grants.filter { now < $0.value }
        self.failures = self.failures.filter { $0.value.last.duration(to: now) < self.policy.failureMemory }
    }

    /// The number of grants and failure records held (for tests and metrics).
    package var recordCount: Int { self.grants.count + self.failures.count }

    private func currentFailures(uid: UInt32, now: Instant) -> Failures? {
        guard let failures = self.failures[uid], failures.last.duration(to: now) < self.policy.failureMemory else { return nil }
        return failures
    }
}
