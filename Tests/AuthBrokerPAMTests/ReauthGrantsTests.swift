import Foundation
import Testing

@testable import AuthBrokerPAM

/// An instant that is just an offset from an arbitrary origin: fixed times, no clock.
struct TestInstant: InstantProtocol, CustomStringConvertible {
    var offset: Duration

    static func at(_ seconds: Double) -> TestInstant { TestInstant(offset: .milliseconds(Int64(seconds * 1000))) }

    func advanced(by duration: Duration) -> TestInstant { TestInstant(offset: self.offset + duration) }
    func duration(to other: TestInstant) -> Duration { other.offset - self.offset }
    static func < (lhs: TestInstant, rhs: TestInstant) -> Bool { lhs.offset < rhs.offset }

    var description: String { "t=\(self.offset)" }
}

/// Transcripts at fixed instants: one event, then what the grants say.
@Suite("Re-authentication grants")
struct ReauthGrantsTests {
    typealias Grants = ReauthGrants<TestInstant>
    let alice = PeerIdentity(uid: 1000, pid: 4242, startTime: 10_000)
    let alicesOtherProcess = PeerIdentity(uid: 1000, pid: 4343, startTime: 10_500)
    /// pid 4242 again, reused by a later process.
    let reusedPid = PeerIdentity(uid: 1000, pid: 4242, startTime: 99_000)
    let bob = PeerIdentity(uid: 1001, pid: 5000, startTime: 20_000)

    @Test("a grant belongs to one process: not to the same pid and start time running another executable")
    func grantFollowsTheExecutable() {
        var grants = Grants()
        let python = PeerIdentity(uid: 1000, pid: 777, startTime: 5_000, executable: "/usr/bin/python3.11")
        let sameProcessOtherProgram = PeerIdentity(uid: 1000, pid: 777, startTime: 5_000, executable: "/tmp/evil")
        let unreadable = PeerIdentity(uid: 1000, pid: 777, startTime: 5_000, executable: nil)
        #expect(grants.beginAttempt(python, now: .at(0)) == .allowed)
        grants.recordSuccess(python, now: .at(1))
        #expect(grants.hasGrant(python, now: .at(2)))
        #expect(!grants.hasGrant(sameProcessOtherProgram, now: .at(2)))
        #expect(!grants.hasGrant(unreadable, now: .at(2)))
    }

    @Test("the peer is read from /proc at once: it still names the process after that process is gone")
    func identityReadAtOnce() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sleep")
        process.arguments = ["30"]
        try process.run()
        let pid = process.processIdentifier
        let identity = try #require(PeerIdentity.read(uid: getuid(), pid: pid))
        #expect(identity.executable == "/usr/bin/sleep" || identity.executable == "/bin/sleep")
        kill(pid, SIGKILL)  // not SIGTERM: the test runner's children inherit it blocked
        process.waitUntilExit()
        #expect(PeerIdentity.read(uid: getuid(), pid: pid) == nil, "a gone process still reads")
        #expect(identity.pid == pid && identity.startTime > 0)
    }

    @Test("a grant holds for its TTL and not a moment longer")
    func grantWithinTTL() {
        var grants = Grants()
        #expect(!grants.hasGrant(alice, now: .at(0)))
        #expect(grants.beginAttempt(alice, now: .at(0)) == .allowed)
        grants.recordSuccess(alice, now: .at(1))
        #expect(grants.hasGrant(alice, now: .at(1)))
        #expect(grants.hasGrant(alice, now: .at(300.999)))
        #expect(grants.grantExpiry(alice, now: .at(2)) == .at(301))
        #expect(!grants.hasGrant(alice, now: .at(301)))
        #expect(grants.grantExpiry(alice, now: .at(301)) == nil)
    }

    @Test("the TTL is configurable")
    func configurableTTL() {
        var grants = Grants(policy: ReauthPolicy(grantTTL: .seconds(30)))
        grants.recordSuccess(alice, now: .at(0))
        #expect(grants.hasGrant(alice, now: .at(29)))
        #expect(!grants.hasGrant(alice, now: .at(30)))
    }

    @Test("a grant is for one peer: not another pid, not a reused pid, not another user")
    func perPeerIsolation() {
        var grants = Grants()
        grants.recordSuccess(alice, now: .at(0))
        #expect(grants.hasGrant(alice, now: .at(10)))
        #expect(!grants.hasGrant(alicesOtherProcess, now: .at(10)))
        #expect(!grants.hasGrant(reusedPid, now: .at(10)))
        #expect(!grants.hasGrant(bob, now: .at(10)))
    }

    @Test("revoke withdraws one peer's grant; revokeAll withdraws every grant")
    func revoke() {
        var grants = Grants()
        grants.recordSuccess(alice, now: .at(0))
        grants.recordSuccess(alicesOtherProcess, now: .at(0))
        grants.recordSuccess(bob, now: .at(0))
        grants.revoke(alice)
        #expect(!grants.hasGrant(alice, now: .at(1)))
        #expect(grants.hasGrant(alicesOtherProcess, now: .at(1)))
        grants.revokeAll()
        #expect(!grants.hasGrant(alicesOtherProcess, now: .at(1)))
        #expect(!grants.hasGrant(bob, now: .at(1)))
    }

    @Test("a renewed grant runs from the latest success")
    func renewal() {
        var grants = Grants()
        grants.recordSuccess(alice, now: .at(0))
        grants.recordSuccess(alice, now: .at(200))
        #expect(grants.hasGrant(alice, now: .at(450)))
        #expect(!grants.hasGrant(alice, now: .at(500)))
    }

    @Test("delays grow after repeated failures: none, 1 s, 2 s, 4 s, … capped at 30 s")
    func growingDelays() {
        var grants = Grants()
        // Failure 1 at t=0: no delay.
        grants.recordFailure(alice, now: .at(0))
        #expect(grants.mayAttempt(alice, now: .at(0)) == .allowed)
        // Failure 2 at t=0: 1 s.
        grants.recordFailure(alice, now: .at(0))
        #expect(grants.mayAttempt(alice, now: .at(0)) == .retryAfter(.seconds(1)))
        #expect(grants.mayAttempt(alice, now: .at(0.25)) == .retryAfter(.milliseconds(750)))
        #expect(grants.mayAttempt(alice, now: .at(1)) == .allowed)
        // Failure 3 at t=1: 2 s.
        grants.recordFailure(alice, now: .at(1))
        #expect(grants.mayAttempt(alice, now: .at(1)) == .retryAfter(.seconds(2)))
        #expect(grants.mayAttempt(alice, now: .at(3)) == .allowed)
        // Failure 4 at t=3: 4 s.
        grants.recordFailure(alice, now: .at(3))
        #expect(grants.mayAttempt(alice, now: .at(3)) == .retryAfter(.seconds(4)))
        // Failures 5…9: 8, 16, 30, 30, 30.
        var now = 7.0
        for expected in [8, 16, 30, 30, 30] {
            grants.recordFailure(alice, now: .at(now))
            #expect(grants.mayAttempt(alice, now: .at(now)) == .retryAfter(.seconds(expected)))
            now += Double(expected)
            #expect(grants.mayAttempt(alice, now: .at(now)) == .allowed)
        }
        #expect(!grants.hasGrant(alice, now: .at(now)))
    }

    @Test("the delay policy as a table", arguments: [(0, 0), (1, 0), (2, 1), (3, 2), (4, 4), (5, 8), (6, 16), (7, 30), (8, 30), (1000, 30)])
    func delayTable(failures: Int, seconds: Int) {
        #expect(ReauthPolicy().delay(afterFailures: failures) == .seconds(seconds))
    }

    @Test("success resets the failure count")
    func resetOnSuccess() {
        var grants = Grants()
        for second in 0..<4 { grants.recordFailure(alice, now: .at(Double(second) * 100)) }
        #expect(grants.mayAttempt(alice, now: .at(300)) == .retryAfter(.seconds(4)))
        grants.recordSuccess(alice, now: .at(304))
        #expect(grants.mayAttempt(alice, now: .at(304)) == .allowed)
        grants.recordFailure(alice, now: .at(305))
        #expect(grants.mayAttempt(alice, now: .at(305)) == .allowed)
        grants.recordFailure(alice, now: .at(305))
        #expect(grants.mayAttempt(alice, now: .at(305)) == .retryAfter(.seconds(1)))
    }

    @Test("a failure does not withdraw an existing grant")
    func failureKeepsGrant() {
        var grants = Grants()
        grants.recordSuccess(alice, now: .at(0))
        grants.recordFailure(alicesOtherProcess, now: .at(1))
        #expect(grants.hasGrant(alice, now: .at(2)))
        #expect(!grants.hasGrant(alicesOtherProcess, now: .at(2)))
    }

    @Test("failures count per user: a new process of the same user does not start afresh; another user does")
    func failuresPerUID() {
        var grants = Grants()
        grants.recordFailure(alice, now: .at(0))
        grants.recordFailure(alice, now: .at(0))
        #expect(grants.mayAttempt(alicesOtherProcess, now: .at(0)) == .retryAfter(.seconds(1)))
        #expect(grants.mayAttempt(reusedPid, now: .at(0)) == .retryAfter(.seconds(1)))
        #expect(grants.mayAttempt(bob, now: .at(0)) == .allowed)
    }

    @Test("one attempt per user at a time; abandoning one counts no failure")
    func oneAttemptAtATime() {
        var grants = Grants()
        #expect(grants.beginAttempt(alice, now: .at(0)) == .allowed)
        #expect(grants.beginAttempt(alicesOtherProcess, now: .at(0)) == .attemptInProgress)
        #expect(grants.mayAttempt(alice, now: .at(0)) == .attemptInProgress)
        #expect(grants.beginAttempt(bob, now: .at(0)) == .allowed)
        grants.recordAbandoned(alice)
        #expect(grants.beginAttempt(alicesOtherProcess, now: .at(1)) == .allowed)
        grants.recordFailure(alicesOtherProcess, now: .at(2))
        #expect(grants.beginAttempt(alice, now: .at(2)) == .allowed)
        grants.recordFailure(alice, now: .at(2))
        #expect(grants.beginAttempt(alice, now: .at(2.5)) == .retryAfter(.milliseconds(500)))
        #expect(grants.mayAttempt(alice, now: .at(3)) == .allowed)
    }

    @Test("failures are forgotten after the failure memory; prune drops expired records")
    func forgettingAndPruning() {
        var grants = Grants(policy: ReauthPolicy(grantTTL: .seconds(300), failureMemory: .seconds(900)))
        for _ in 0..<5 { grants.recordFailure(alice, now: .at(0)) }
        grants.recordSuccess(bob, now: .at(0))
        #expect(grants.mayAttempt(alice, now: .at(899)) == .allowed)  // 8 s delay long past
        grants.recordFailure(alice, now: .at(899))
        #expect(grants.mayAttempt(alice, now: .at(899)) == .retryAfter(.seconds(16)))
        #expect(grants.recordCount == 2)
        grants.prune(now: .at(1000))
        #expect(grants.recordCount == 1)  // bob's grant expired at 300; alice's failures are recent
        grants.prune(now: .at(1799))
        #expect(grants.recordCount == 0)
        // After the memory, a failure counts as the first again.
        grants.recordFailure(alice, now: .at(1800))
        #expect(grants.mayAttempt(alice, now: .at(1800)) == .allowed)
    }
}

@Suite("Peer identity")
struct PeerIdentityTests {
    @Test("start time is field 22 of /proc/<pid>/stat, even when the command name has spaces and parentheses")
    func parseStat() {
        let line = "4242 (evil) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000000 200\n"
        #expect(PeerIdentity.startTime(statLine: line) == 123_456)
        #expect(PeerIdentity.startTime(statLine: "4242 (short) S 1 2 3") == nil)
        #expect(PeerIdentity.startTime(statLine: "garbage") == nil)
    }

    @Test("reading this process gives a start time that stays the same")
    func readSelf() throws {
        let first = try #require(PeerIdentity.read(uid: getuid(), pid: getpid()))
        let second = try #require(PeerIdentity.read(uid: getuid(), pid: getpid()))
        #expect(first == second)
        #expect(first.startTime > 0)
        #expect(PeerIdentity.read(uid: 0, pid: -1) == nil)
    }
}
