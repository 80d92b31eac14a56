import AuthBrokerCore
import Testing

private typealias Machine = UpstreamPoolStateMachine
private typealias Action = UpstreamPoolStateMachine.Action

private struct ConnectError: Error, CustomStringConvertible {
    var description: String { "connection refused" }
}

private func action(_ request: Machine.RequestAction = .none, _ connection: Machine.ConnectionAction = .none) -> Action {
    Action(request: request, connection: connection)
}

/// Transcripts: one event, one expected action, in the style of async-http-client's
/// `HTTP1ConnectionStateMachineTests`.
@Suite("UpstreamPoolStateMachine transcripts")
struct UpstreamPoolStateMachineTests {
    @Test func leaseCreateIdleReuseTimeout() {
        var pool = Machine(limits: .init(maxConnections: 2, maxIdleConnections: 2, maxPendingRequests: 4))
        #expect(pool.isEmpty)
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.leaseRequested(2) == action(.lease(0, to: 2), .cancelIdleTimeout(0)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.idleTimeoutFired(0) == action(.none, .close(0)))
        #expect(pool.isEmpty)
    }

    @Test func leasePrefersAnIdleConnectionWithTheRequestsAffinity() {
        var pool = Machine(limits: .init(maxConnections: 3, maxIdleConnections: 3, maxPendingRequests: 4))
        #expect(pool.leaseRequested(1, affinity: 10) == action(.none, .create(0)))
        #expect(pool.connectionCreated(0, affinity: 10) == action(.lease(0, to: 1)))
        #expect(pool.leaseRequested(2, affinity: 20) == action(.none, .create(1)))
        #expect(pool.connectionCreated(1, affinity: 20) == action(.lease(1, to: 2)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        // 1 is the most recently idle, but 0 lives where request 3 runs.
        #expect(pool.leaseRequested(3, affinity: 10) == action(.lease(0, to: 3), .cancelIdleTimeout(0)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        // No idle connection has affinity 30: the most recently idle one serves, and one is made
        // at 30 for the requests after it (see the next test).
        #expect(pool.leaseRequested(4, affinity: 30) == action(.lease(0, to: 4), .cancelIdleTimeoutAndCreate(cancel: 0, create: 2)))
        // Without an affinity: the most recently idle one.
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.leaseRequested(5) == action(.lease(0, to: 5), .cancelIdleTimeout(0)))
        // A closed connection's affinity is forgotten with it: 1 closes, a later 20 takes 0.
        #expect(pool.connectionClosed(1) == action(.none, .cancelIdleTimeout(1)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.leaseRequested(6, affinity: 20) == action(.lease(0, to: 6), .cancelIdleTimeout(0)))
    }

    /// A request served by another loop's idle connection also starts one on its own loop, one at
    /// a time, so that the requests after it stay on their thread (and the direct relay can take
    /// them), up to what the pool may keep idle.
    @Test func aRequestServedFromAnotherLoopStartsOneOnItsOwn() {
        var pool = Machine(limits: .init(maxConnections: 3, maxIdleConnections: 3, maxPendingRequests: 4))
        #expect(pool.leaseRequested(1, affinity: 10) == action(.none, .create(0)))
        #expect(pool.connectionCreated(0, affinity: 10) == action(.lease(0, to: 1)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        // Only 10's connection is idle: it serves at once, and one is started at 20.
        #expect(pool.leaseRequested(2, affinity: 20) == action(.lease(0, to: 2), .cancelIdleTimeoutAndCreate(cancel: 0, create: 1)))
        // While it is being made, another request from 20 starts nothing more.
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.leaseRequested(3, affinity: 20) == action(.lease(0, to: 3), .cancelIdleTimeout(0)))
        // Made with nobody waiting: parked idle, and 20's requests take it from now on.
        #expect(pool.connectionCreated(1, affinity: 20) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.leaseRequested(4, affinity: 20) == action(.lease(1, to: 4), .cancelIdleTimeout(1)))
        // 20's connection is leased: 20's requests outnumber its connections, so the other
        // loop's idle one serves and another is started at 20.
        #expect(pool.leaseRequested(5, affinity: 20) == action(.lease(0, to: 5), .cancelIdleTimeoutAndCreate(cancel: 0, create: 2)))
        #expect(pool.connectionCount == 3)
        // A connection started this way that fails fails nobody.
        #expect(pool.connectionFailed(2, error: ConnectError()) == action())
        #expect(pool.connectionCount == 2)
        // Not beyond what the pool keeps idle: 1 of 1 exists, the other loop's serves alone.
        var lean = Machine(limits: .init(maxConnections: 4, maxIdleConnections: 1, maxPendingRequests: 4))
        #expect(lean.leaseRequested(1, affinity: 10) == action(.none, .create(0)))
        #expect(lean.connectionCreated(0, affinity: 10) == action(.lease(0, to: 1)))
        #expect(lean.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(lean.leaseRequested(2, affinity: 20) == action(.lease(0, to: 2), .cancelIdleTimeout(0)))
        // At maxConnections nothing is started.
        var full = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 4))
        #expect(full.leaseRequested(1, affinity: 10) == action(.none, .create(0)))
        #expect(full.connectionCreated(0, affinity: 10) == action(.lease(0, to: 1)))
        #expect(full.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(full.leaseRequested(2, affinity: 20) == action(.lease(0, to: 2), .cancelIdleTimeout(0)))
    }

    @Test func idleLeaseTakesOnlyAnIdleConnectionWithThatAffinity() {
        var pool = Machine(limits: .init(maxConnections: 2, maxIdleConnections: 2, maxPendingRequests: 4))
        // Nothing idle: no lease, no connection started, no waiter left behind.
        #expect(pool.idleLeaseRequested(1, affinity: 10) == action())
        #expect(pool.isEmpty)
        #expect(pool.leaseRequested(2, affinity: 10) == action(.none, .create(0)))
        #expect(pool.connectionCreated(0, affinity: 10) == action(.lease(0, to: 2)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        // Idle, but elsewhere: refused (the ordinary lease would have taken it).
        #expect(pool.idleLeaseRequested(3, affinity: 20) == action())
        #expect(pool.idleConnectionCount == 1)
        #expect(pool.idleLeaseRequested(4, affinity: 10) == action(.lease(0, to: 4), .cancelIdleTimeout(0)))
        #expect(pool.idleConnectionCount == 0)
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        // After shutdown: nothing.
        #expect(pool.shutdown() == action(.none, .closeMany([0])))
        #expect(pool.idleLeaseRequested(5, affinity: 10) == action())
    }

    @Test("a dropped pooled connection makes the others that wait suspect: they close, leased ones stay")
    func idleConnectionsSuspect() {
        var pool = Machine(limits: .init(maxConnections: 3, maxIdleConnections: 3, maxPendingRequests: 4))
        #expect(pool.idleConnectionsSuspect() == .none)
        for request in 0..<3 {
            #expect(pool.leaseRequested(request) == action(.none, .create(request)))
            #expect(pool.connectionCreated(request) == action(.lease(request, to: request)))
        }
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        // Connection 2 is the one found dropped; it is still leased when the others are closed.
        #expect(pool.idleConnectionsSuspect() == action(.none, .closeMany([0, 1])))
        #expect(pool.idleConnectionCount == 0 && pool.connectionCount == 1)
        #expect(pool.connectionReleased(2, reusable: false) == action(.none, .close(2)))
        // The next request gets a connection made for it.
        #expect(pool.leaseRequested(3) == action(.none, .create(3)))
        #expect(pool.idleTimeoutFired(0) == .none, "a closed connection's timer is stale")
    }

    @Test func queueAndPendingLimit() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action())
        #expect(pool.leaseRequested(3) == action(.fail(3, .tooManyPending(limit: 1))))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.lease(0, to: 2)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.idleTimeoutFired(0) == action(.none, .close(0)))
        #expect(pool.isEmpty)
    }

    @Test func zeroPendingStillServesRequestsThatGetAConnection() {
        var pool = Machine(limits: .init(maxConnections: 2, maxIdleConnections: 0, maxPendingRequests: 0))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action(.none, .create(1)))
        #expect(pool.leaseRequested(3) == action(.fail(3, .tooManyPending(limit: 0))))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 1)))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 2)))
        // maxIdleConnections 0: a released connection is closed at once.
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .close(0)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .close(1)))
        #expect(pool.isEmpty)
    }

    @Test func connectFailuresFailOneWaiterEachAndRetryForTheRest() {
        var pool = Machine(limits: .init(maxConnections: 2, maxIdleConnections: 2, maxPendingRequests: 5))
        let error = ConnectError()
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action(.none, .create(1)))
        #expect(pool.leaseRequested(3) == action())
        #expect(pool.leaseRequested(4) == action())
        #expect(pool.connectionFailed(0, error: error) == action(.fail(1, .connectFailed(error)), .create(2)))
        #expect(pool.connectionFailed(1, error: error) == action(.fail(2, .connectFailed(error)), .create(3)))
        #expect(pool.connectionFailed(2, error: error) == action(.fail(3, .connectFailed(error))))
        #expect(pool.connectionFailed(3, error: error) == action(.fail(4, .connectFailed(error))))
        #expect(pool.isEmpty)
    }

    @Test func connectFailureWithNobodyWaiting() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseCancelled(1) == action(.cancel(1)))
        #expect(pool.connectionFailed(0, error: ConnectError()) == action())
        #expect(pool.isEmpty)
    }

    @Test func notReusableReleaseIsReplacedForAWaiter() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action())
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionReleased(0, reusable: false) == action(.none, .closeAndCreate(close: 0, create: 1)))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 2)))
        #expect(pool.connectionReleased(1, reusable: false) == action(.none, .close(1)))
        #expect(pool.isEmpty)
    }

    @Test func remoteCloseOfIdleAndLeased() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 2))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.connectionClosed(0) == action(.none, .cancelIdleTimeout(0)))
        #expect(pool.idleTimeoutFired(0) == action(), "a stale timer is ignored")
        #expect(pool.leaseRequested(2) == action(.none, .create(1)))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 2)))
        #expect(pool.leaseRequested(3) == action())
        #expect(pool.connectionClosed(1) == action(.none, .create(2)))
        #expect(pool.connectionReleased(1, reusable: true) == action(), "a release after the close is ignored")
        #expect(pool.connectionCreated(2) == action(.lease(2, to: 3)))
        #expect(pool.connectionReleased(2, reusable: false) == action(.none, .close(2)))
        #expect(pool.isEmpty)
    }

    @Test func closedWhileBeingMadeIsNeverLeased() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.connectionClosed(0) == action())
        #expect(pool.connectionCreated(0) == action(.none, .closeAndCreate(close: 0, create: 1)))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 1)))
        #expect(pool.connectionClosed(1) == action())
        #expect(pool.isEmpty)
    }

    @Test func cancelledWaiterLeavesTheConnectionForOthers() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseCancelled(1) == action(.cancel(1)))
        #expect(pool.leaseCancelled(1) == action(), "a second cancel is ignored")
        #expect(pool.connectionCreated(0) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.leaseRequested(2) == action(.lease(0, to: 2), .cancelIdleTimeout(0)))
        #expect(pool.leaseCancelled(2) == action(), "a cancel after the lease is ignored")
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.idleTimeoutFired(0) == action(.none, .close(0)))
        #expect(pool.isEmpty)
    }

    @Test func idleBeyondLimitIsClosedAndMostRecentIsReused() {
        var pool = Machine(limits: .init(maxConnections: 3, maxIdleConnections: 2, maxPendingRequests: 0))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action(.none, .create(1)))
        #expect(pool.leaseRequested(3) == action(.none, .create(2)))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 2)))
        #expect(pool.connectionCreated(2) == action(.lease(2, to: 3)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.connectionReleased(2, reusable: true) == action(.none, .close(2)))
        #expect(pool.leaseRequested(4) == action(.lease(1, to: 4), .cancelIdleTimeout(1)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.idleTimeoutFired(0) == action(.none, .close(0)))
        #expect(pool.idleTimeoutFired(1) == action(.none, .close(1)))
        #expect(pool.isEmpty)
    }

    @Test func shutdownFailsWaitersAndClosesEverything() {
        var pool = Machine(limits: .init(maxConnections: 3, maxIdleConnections: 3, maxPendingRequests: 3))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action(.none, .create(1)))
        #expect(pool.leaseRequested(3) == action(.none, .create(2)))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 2)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.lease(1, to: 3)))
        #expect(pool.leaseRequested(4) == action())
        #expect(pool.connectionReleased(1, reusable: true) == action(.lease(1, to: 4)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.leaseRequested(5) == action(.lease(1, to: 5), .cancelIdleTimeout(1)))
        #expect(pool.leaseRequested(6) == action())
        #expect(pool.leaseRequested(7) == action())
        #expect(pool.connectionReleased(1, reusable: true) == action(.lease(1, to: 6)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.lease(1, to: 7)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.leaseRequested(8) == action(.lease(1, to: 8), .cancelIdleTimeout(1)))
        #expect(pool.leaseRequested(9) == action())
        #expect(pool.leaseRequested(10) == action())
        // Now: 0 leased (1), 1 leased (8), 2 being made, 9 and 10 waiting.
        #expect(pool.connectionReleased(1, reusable: true) == action(.lease(1, to: 9)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.lease(1, to: 10)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.leaseRequested(11) == action(.lease(1, to: 11), .cancelIdleTimeout(1)))
        #expect(pool.leaseRequested(12) == action())
        #expect(pool.shutdown() == action(.failAll([12], .shuttingDown)))
        #expect(pool.leaseRequested(13) == action(.fail(13, .shuttingDown)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .close(0)))
        #expect(pool.connectionCreated(2) == action(.none, .close(2)))
        #expect(!pool.isEmpty)
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .close(1)))
        #expect(pool.isEmpty)
        #expect(pool.shutdown() == action(), "a second shutdown has nothing left to do")
    }

    @Test func shutdownClosesIdleConnections() {
        var pool = Machine(limits: .init(maxConnections: 2, maxIdleConnections: 2, maxPendingRequests: 0))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.leaseRequested(2) == action(.none, .create(1)))
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionCreated(1) == action(.lease(1, to: 2)))
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.connectionReleased(1, reusable: true) == action(.none, .scheduleIdleTimeout(1)))
        #expect(pool.shutdown() == action(.none, .closeMany([0, 1])))
        #expect(pool.idleTimeoutFired(0) == action())
        #expect(pool.isEmpty)
    }

    @Test("unknown ids are ignored", arguments: [false, true])
    func unknownIDsAreIgnored(afterShutdown: Bool) {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        if afterShutdown { #expect(pool.shutdown() == action()) }
        #expect(pool.connectionCreated(99) == action())
        #expect(pool.connectionFailed(99, error: ConnectError()) == action())
        #expect(pool.connectionReleased(99, reusable: true) == action())
        #expect(pool.connectionReleased(99, reusable: false) == action())
        #expect(pool.connectionClosed(99) == action())
        #expect(pool.leaseCancelled(99) == action())
        #expect(pool.idleTimeoutFired(99) == action())
        #expect(pool.isEmpty)
    }

    @Test func eventsOutOfStateAreIgnored() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 1))
        #expect(pool.leaseRequested(1) == action(.none, .create(0)))
        #expect(pool.connectionReleased(0, reusable: true) == action(), "released before it was made")
        #expect(pool.idleTimeoutFired(0) == action(), "timer for a connection being made")
        #expect(pool.connectionCreated(0) == action(.lease(0, to: 1)))
        #expect(pool.connectionCreated(0) == action(), "made twice")
        #expect(pool.connectionFailed(0, error: ConnectError()) == action(), "failed after it was made")
        #expect(pool.idleTimeoutFired(0) == action(), "timer for a leased connection")
        #expect(pool.connectionReleased(0, reusable: true) == action(.none, .scheduleIdleTimeout(0)))
        #expect(pool.connectionReleased(0, reusable: true) == action(), "released twice")
        #expect(pool.connectionClosed(0) == action(.none, .cancelIdleTimeout(0)))
        #expect(pool.isEmpty)
    }

    @Test func limitsAreClamped() {
        let pool = Machine(limits: .init(maxConnections: 0, maxIdleConnections: 5, maxPendingRequests: -1))
        #expect(pool.limits == .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 0))
    }

    @Test func idsStartWhereTheShellSays() {
        var pool = Machine(limits: .init(maxConnections: 1, maxIdleConnections: 1, maxPendingRequests: 0), firstConnectionID: 40)
        #expect(pool.leaseRequested(1) == action(.none, .create(40)))
        #expect(pool.nextConnectionID == 41)
    }
}

// MARK: - Randomised drive against a model of the outside world

/// The world around one pool: which requests wait, which connections are being made, idle (with a
/// timer) or leased. Every action the machine returns is checked against it, in the style of
/// async-http-client's `MockConnectionPool` and `MockRequestQueuer`.
private struct World {
    var waiting: Set<Int> = []
    var starting: Set<Int> = []
    /// Connections reported closed while being made; their `connectionCreated` must close them.
    var closedWhileStarting: Set<Int> = []
    var idle: Set<Int> = []
    var timers: Set<Int> = []
    var leased: [Int: Int] = [:]
    var everCreated: Set<Int> = []
    /// A connection the current event put in the machine's hands (made, released); the action
    /// must lease, park or close it.
    var inHand: Int?
    /// A request the current event made; the action must lease, fail or queue it.
    var newRequest: Int?
    var failures: [Int: PoolFailure] = [:]
    var served = 0

    var isEmpty: Bool { waiting.isEmpty && starting.isEmpty && idle.isEmpty && timers.isEmpty && leased.isEmpty }

    mutating func apply(_ action: UpstreamPoolStateMachine.Action) {
        let newRequest = self.newRequest
        self.newRequest = nil
        var newRequestResolved = false
        /// Takes a request out of the world: the new one, or one that waits.
        func resolve(_ request: Int) {
            if request == newRequest {
                newRequestResolved = true
            } else {
                #expect(waiting.contains(request), "action for unknown request \(request)")
                waiting.remove(request)
            }
        }
        switch action.request {
        case .none:
            break
        case .lease(let connection, let request):
            resolve(request)
            #expect(connection == inHand || idle.contains(connection), "lease of unavailable connection \(connection)")
            if connection == inHand { inHand = nil } else { idle.remove(connection) }
            leased[connection] = request
            served += 1
        case .fail(let request, let failure):
            resolve(request)
            failures[request] = failure
        case .failAll(let requests, let failure):
            for request in requests {
                resolve(request)
                failures[request] = failure
            }
        case .cancel(let request):
            resolve(request)
        }
        if let newRequest, !newRequestResolved { waiting.insert(newRequest) }

        func close(_ connection: Int) {
            #expect(connection == inHand || idle.contains(connection), "close of connection \(connection) not idle or in hand")
            if connection == inHand { inHand = nil }
            idle.remove(connection)
            timers.remove(connection)
        }
        func create(_ connection: Int) {
            #expect(!everCreated.contains(connection), "connection id \(connection) reused")
            everCreated.insert(connection)
            starting.insert(connection)
        }
        switch action.connection {
        case .none:
            break
        case .create(let connection):
            create(connection)
        case .close(let connection):
            close(connection)
        case .closeMany(let connections):
            connections.forEach(close)
        case .closeAndCreate(let closing, let creating):
            close(closing)
            create(creating)
        case .scheduleIdleTimeout(let connection):
            #expect(connection == inHand, "idle timer for a connection not in hand")
            inHand = nil
            idle.insert(connection)
            timers.insert(connection)
        case .cancelIdleTimeout(let connection):
            #expect(timers.contains(connection))
            timers.remove(connection)
        case .cancelIdleTimeoutAndCreate(let connection, let creating):
            #expect(timers.contains(connection))
            timers.remove(connection)
            create(creating)
        }
        #expect(inHand == nil, "the machine dropped connection \(inHand ?? -1)")
        #expect(timers == idle, "every idle connection has exactly one timer")
    }
}

@Suite("UpstreamPoolStateMachine randomised")
struct UpstreamPoolStateMachineRandomTests {
    @Test("random drive ends empty", arguments: Array(1...24) as [UInt64])
    func randomDrive(seed: UInt64) {
        var random = PoolDriveRandom(seed: seed)
        func pick(_ n: Int) -> Int { Int(random.next() % UInt64(n)) }
        let limits = UpstreamPoolStateMachine.Limits(
            maxConnections: 1 + pick(4), maxIdleConnections: pick(4), maxPendingRequests: pick(5))
        var pool = UpstreamPoolStateMachine(limits: limits)
        var world = World()
        var nextRequest = 0
        let shutdownAt = seed % 3 == 0 ? pick(1500) : Int.max

        for step in 0..<1500 {
            if step == shutdownAt { world.apply(pool.shutdown()) }
            switch pick(9) {
            case 0, 1:
                world.newRequest = nextRequest
                // Two event loops, or none named: the affinity rules start connections too.
                let affinity = [nil, 10, 20][pick(3)]
                world.apply(pool.leaseRequested(nextRequest, affinity: affinity))
                nextRequest += 1
            case 2:
                guard let connection = world.starting.randomElement(using: &random) else { continue }
                world.starting.remove(connection)
                if world.closedWhileStarting.remove(connection) != nil {
                    world.inHand = connection
                    let action = pool.connectionCreated(connection)
                    #expect(action.request == .none, "a dead connection was leased")
                    world.apply(action)
                } else {
                    world.inHand = connection
                    world.apply(pool.connectionCreated(connection, affinity: [nil, 10, 20][pick(3)]))
                }
            case 3:
                guard let connection = world.starting.randomElement(using: &random) else { continue }
                world.starting.remove(connection)
                world.closedWhileStarting.remove(connection)
                world.apply(pool.connectionFailed(connection, error: ConnectError()))
            case 4:
                guard let (connection, _) = world.leased.randomElement(using: &random) else { continue }
                world.leased[connection] = nil
                world.inHand = connection
                let reusable = pick(3) != 0
                world.apply(pool.connectionReleased(connection, reusable: reusable))
            case 5:
                // The server closes an idle, leased or still-connecting connection.
                switch pick(3) {
                case 0:
                    guard let connection = world.idle.randomElement(using: &random) else { continue }
                    world.idle.remove(connection)
                    world.apply(pool.connectionClosed(connection))
                case 1:
                    guard let (connection, _) = world.leased.randomElement(using: &random) else { continue }
                    world.leased[connection] = nil
                    world.apply(pool.connectionClosed(connection))
                default:
                    guard let connection = world.starting.randomElement(using: &random) else { continue }
                    world.closedWhileStarting.insert(connection)
                    world.apply(pool.connectionClosed(connection))
                }
            case 6:
                guard let request = world.waiting.randomElement(using: &random) else { continue }
                world.apply(pool.leaseCancelled(request))
            case 7:
                guard let connection = world.timers.randomElement(using: &random) else { continue }
                world.apply(pool.idleTimeoutFired(connection))
            default:
                // Stale or unknown events must change nothing.
                #expect(pool.connectionReleased(1_000_000 + step, reusable: true) == .none)
                #expect(pool.leaseCancelled(-1) == .none)
            }
            #expect(pool.connectionCount <= limits.maxConnections)
            #expect(pool.connectionCount == world.starting.count + world.idle.count + world.leased.count)
            #expect(pool.waitingRequestCount == world.waiting.count)
            #expect(pool.idleConnectionCount == world.idle.count)
            #expect(pool.idleConnectionCount <= pool.limits.maxIdleConnections)
            // Liveness: a waiting request always has a connection in flight that can reach it.
            if !world.waiting.isEmpty {
                #expect(!world.starting.isEmpty || !world.leased.isEmpty, "requests wait with nothing in flight")
            }
        }

        // Drain: no new requests; the world finishes everything it started. A request still waiting
        // when nothing else is in flight would wait forever: that is a liveness bug.
        var rounds = 0
        while !world.isEmpty, rounds < 100_000 {
            rounds += 1
            if let connection = world.starting.first {
                world.starting.remove(connection)
                world.closedWhileStarting.remove(connection)
                world.inHand = connection
                world.apply(pool.connectionCreated(connection))
            } else if let (connection, _) = world.leased.first {
                world.leased[connection] = nil
                world.inHand = connection
                world.apply(pool.connectionReleased(connection, reusable: true))
            } else if let connection = world.timers.first {
                world.apply(pool.idleTimeoutFired(connection))
            } else {
                Issue.record("requests \(world.waiting.sorted()) wait with no connection in flight")
                break
            }
        }
        #expect(world.isEmpty)
        #expect(pool.isEmpty)
        #expect(world.served > 0)
    }
}

/// A small deterministic generator, so a failing seed reproduces.
private struct PoolDriveRandom: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
