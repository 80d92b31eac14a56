import AuthBrokerCore
import AuthBrokerDaemon
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

/// An in-process stand-in for the upstream connector: records every connect and close, and can
/// fail or hold connects at a gate.
private final class FakeUpstream: Sendable {
    struct Connection: Sendable, Hashable {
        var origin: UpstreamRoute
        var id: Int
    }

    enum Event: Sendable, Equatable {
        case connectStarted(Int)
        case closed(Int)
    }

    struct Refused: Error, CustomStringConvertible {
        var description: String { "connection refused (fake)" }
    }

    private struct State {
        var connects = 0
        var made: [Int] = []
        var closed: [Int] = []
        var madeConnections: [Connection] = []
        var closedConnections: [Connection] = []
        var failing = false
    }

    private let state = NIOLockedValueBox(State())
    let gate: Gate?
    let events: AsyncStream<Event>
    private let sink: AsyncStream<Event>.Continuation

    init(gate: Gate? = nil, failing: Bool = false) {
        self.gate = gate
        (events, sink) = AsyncStream.makeStream(of: Event.self)
        state.withLockedValue { $0.failing = failing }
    }

    var connects: Int { state.withLockedValue { $0.connects } }
    var made: [Int] { state.withLockedValue { $0.made } }
    var closed: [Int] { state.withLockedValue { $0.closed } }
    var madeConnections: [Connection] { state.withLockedValue { $0.madeConnections } }
    var closedConnections: [Connection] { state.withLockedValue { $0.closedConnections } }
    func setFailing(_ failing: Bool) { state.withLockedValue { $0.failing = failing } }

    func connect(_ origin: UpstreamRoute, _ id: Int) async throws -> Connection {
        state.withLockedValue { $0.connects += 1 }
        sink.yield(.connectStarted(id))
        if let gate { await gate.wait() }
        if state.withLockedValue({ $0.failing }) { throw Refused() }
        let connection = Connection(origin: origin, id: id)
        state.withLockedValue {
            $0.made.append(id)
            $0.madeConnections.append(connection)
        }
        return connection
    }

    func close(_ connection: Connection) {
        state.withLockedValue {
            $0.closed.append(connection.id)
            $0.closedConnections.append(connection)
        }
        sink.yield(.closed(connection.id))
    }

    func pool(
        maxConnections: Int = 2, maxIdle: Int = 2, maxPending: Int = 8, idleTimeout: TimeAmount = .seconds(60)
    ) -> UpstreamPool<Connection> {
        UpstreamPool(
            limits: .init(maxConnections: maxConnections, maxIdleConnections: maxIdle, maxPendingRequests: maxPending),
            idleTimeout: idleTimeout,
            eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
            connect: { origin, id in try await self.connect(origin, id) },
            close: { self.close($0) }
        )
    }
}

/// Holds connects until opened; then lets every current and later waiter through.
private final class Gate: Sendable {
    private let state = NIOLockedValueBox((open: false, waiters: [CheckedContinuation<Void, Never>]()))

    func wait() async {
        await withCheckedContinuation { continuation in
            let resumeNow = state.withLockedValue { state -> Bool in
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLockedValue { state in
            state.open = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

extension AsyncStream<FakeUpstream.Event>.Iterator {
    /// Waits for the next event equal to `event`, skipping others.
    fileprivate mutating func wait(for event: FakeUpstream.Event) async {
        while let next = await next() {
            if next == event { return }
        }
        Issue.record("event stream ended before \(event)")
    }
}

@Suite("UpstreamPool shell")
struct UpstreamPoolTests {
    let origin: UpstreamRoute
    let other: UpstreamRoute

    init() throws {
        origin = UpstreamRoute(try CanonicalOrigin(parsing: "https://example.test/"))
        other = UpstreamRoute(try CanonicalOrigin(parsing: "http://other.test:8080/"))
    }

    @Test func leaseConnectsOnceAndReuses() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool()
        let first = try await pool.lease(origin)
        #expect(first.route == origin)
        #expect(first.connection == .init(origin: origin, id: first.id))
        pool.release(first, reusable: true)
        let second = try await pool.lease(origin)
        #expect(second.id == first.id)
        #expect(upstream.connects == 1)
        #expect(pool.openConnectionCount == 1)
        pool.release(second, reusable: true)
        await pool.shutdown()
        #expect(upstream.closed == [first.id])
        #expect(pool.openConnectionCount == 0)
    }

    @Test("a lease says whether its connection waited in the pool or was made for it")
    func leaseSaysWhetherReused() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool()
        let first = try await pool.lease(origin)
        #expect(!first.reused, "made for this lease")
        pool.release(first, reusable: true)
        let second = try await pool.lease(origin)
        #expect(second.id == first.id && second.reused, "it waited idle")
        pool.release(second, reusable: true)
        await pool.shutdown()
    }

    @Test("a dropped pooled connection closes the origin's idle ones with it; the next lease gets a new one")
    func closeWithIdle() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(maxConnections: 4, maxIdle: 4)
        var events = upstream.events.makeAsyncIterator()
        let leases = [try await pool.lease(origin), try await pool.lease(origin), try await pool.lease(origin)]
        let other = try await pool.lease(self.other)
        pool.release(leases[0], reusable: true)
        pool.release(leases[1], reusable: true)
        pool.release(other, reusable: true)
        pool.release(leases[2], .closeWithIdle)
        // The dropped one first, then the idle ones in the order they went idle.
        for lease in [leases[2], leases[0], leases[1]] { await events.wait(for: .closed(lease.id)) }
        #expect(pool.openConnectionCount == 1, "the other origin's idle connection stays")
        let next = try await pool.lease(origin)
        #expect(!next.reused && !leases.map(\.id).contains(next.id))
        pool.release(next, reusable: true)
        await pool.shutdown()
    }

    @Test func originsHaveSeparatePools() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(maxConnections: 1)
        let a = try await pool.lease(origin)
        let b = try await pool.lease(other)
        #expect(b.route == other)
        #expect(upstream.connects == 2)
        #expect(pool.openConnectionCount == 2)
        pool.release(a, reusable: true)
        pool.release(b, reusable: true)
        await pool.shutdown()
        #expect(Set(upstream.closed) == Set(upstream.made))
    }

    @Test func notReusableReleaseCloses() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool()
        var events = upstream.events.makeAsyncIterator()
        let lease = try await pool.lease(origin)
        pool.release(lease, reusable: false)
        await events.wait(for: .closed(lease.id))
        #expect(pool.openConnectionCount == 0)
        let next = try await pool.lease(origin)
        #expect(next.id != lease.id)
        pool.release(next, reusable: true)
        await pool.shutdown()
    }

    @Test func connectFailureReachesTheCaller() async throws {
        let upstream = FakeUpstream(failing: true)
        let pool = upstream.pool()
        do {
            let lease = try await pool.lease(origin)
            Issue.record("leased \(lease.id) from a failing upstream")
        } catch let error as UpstreamPoolError {
            #expect(error.code == "connect_failed")
            #expect(error.underlying is FakeUpstream.Refused)
            #expect(error.message.contains("example.test"))
        }
        upstream.setFailing(false)
        let lease = try await pool.lease(origin)
        pool.release(lease, reusable: true)
        await pool.shutdown()
    }

    @Test func pendingLimitRefusesAtOnce() async throws {
        let gate = Gate()
        let upstream = FakeUpstream(gate: gate)
        let pool = upstream.pool(maxConnections: 1, maxPending: 0)
        var events = upstream.events.makeAsyncIterator()
        let origin = self.origin
        let first = Task { try await pool.lease(origin) }
        await events.wait(for: .connectStarted(0))
        await #expect(throws: UpstreamPoolError.self) { try await pool.lease(origin) }
        do {
            _ = try await pool.lease(origin)
        } catch let error as UpstreamPoolError {
            #expect(error.code == "too_many_pending")
        }
        gate.open()
        let lease = try await first.value
        pool.release(lease, reusable: true)
        await pool.shutdown()
    }

    @Test func waitersAreServedByReleasedConnections() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(maxConnections: 2, maxPending: 100)
        let origin = self.origin
        let served = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<40 {
                group.addTask {
                    let lease = try await pool.lease(origin)
                    await Task.yield()
                    pool.release(lease, reusable: true)
                    return lease.id
                }
            }
            var ids: [Int] = []
            for try await id in group { ids.append(id) }
            return ids
        }
        #expect(served.count == 40)
        #expect(upstream.connects <= 2)
        await pool.shutdown()
        #expect(upstream.closed.sorted() == upstream.made.sorted())
    }

    @Test func cancelledWaiterThrowsAndTheConnectionIsKept() async throws {
        let gate = Gate()
        let upstream = FakeUpstream(gate: gate)
        let pool = upstream.pool(maxConnections: 1)
        var events = upstream.events.makeAsyncIterator()
        let origin = self.origin
        let waiter = Task { try await pool.lease(origin) }
        await events.wait(for: .connectStarted(0))
        waiter.cancel()
        await #expect(throws: CancellationError.self) { try await waiter.value }
        gate.open()
        // The connection made for the cancelled request serves the next one.
        let lease = try await pool.lease(origin)
        #expect(lease.id == 0)
        #expect(upstream.connects == 1)
        pool.release(lease, reusable: true)
        await pool.shutdown()
    }

    @Test func alreadyCancelledTaskNeverWaits() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool()
        let origin = self.origin
        let task = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await pool.lease(origin)
        }
        await #expect(throws: CancellationError.self) { try await task.value }
        await pool.shutdown()
        #expect(upstream.connects == 0)
    }

    @Test func idleConnectionsTimeOut() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(idleTimeout: .milliseconds(20))
        var events = upstream.events.makeAsyncIterator()
        let lease = try await pool.lease(origin)
        pool.release(lease, reusable: true)
        await events.wait(for: .closed(lease.id))
        #expect(pool.openConnectionCount == 0)
        let next = try await pool.lease(origin)
        #expect(next.id != lease.id)
        pool.release(next, reusable: false)
        await pool.shutdown()
    }

    @Test func reuseStopsTheIdleTimer() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(idleTimeout: .milliseconds(30))
        var events = upstream.events.makeAsyncIterator()
        // Park and re-lease many times; a stale timer from an earlier idle spell must never close
        // the connection while it is leased.
        var lease = try await pool.lease(origin)
        for _ in 0..<50 {
            pool.release(lease, reusable: true)
            lease = try await pool.lease(origin)
            #expect(!upstream.closed.contains(lease.id), "a leased connection was closed by a stale timer")
        }
        pool.release(lease, reusable: true)
        await events.wait(for: .closed(lease.id))
        await pool.shutdown()
    }

    /// The idle timer is not cancelled by a lease nor scheduled again by each release: when the
    /// one armed at the first release fires, the connection has been idle only since the second.
    @Test func idleTimeoutCountsFromTheLastRelease() async throws {
        let upstream = FakeUpstream()
        let timeout = Duration.milliseconds(300)
        let pool = upstream.pool(idleTimeout: .milliseconds(300))
        var events = upstream.events.makeAsyncIterator()
        let first = try await pool.lease(origin)
        pool.release(first, reusable: true)
        try await Task.sleep(for: .milliseconds(100))
        let second = try await pool.lease(origin)
        try #require(second.id == first.id, "the idle connection is reused")
        let lastRelease = ContinuousClock.now
        pool.release(second, reusable: true)
        await events.wait(for: .closed(second.id))
        #expect(ContinuousClock.now - lastRelease >= timeout, "closed before a whole timeout idle")
        await pool.shutdown()
    }

    @Test func remoteCloseForgetsTheConnection() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool()
        let lease = try await pool.lease(origin)
        pool.release(lease, reusable: true)
        pool.connectionClosed(route: origin, id: lease.id)
        #expect(pool.openConnectionCount == 0)
        let next = try await pool.lease(origin)
        #expect(next.id != lease.id)
        // A leased connection closed by the server: the later release is ignored.
        pool.connectionClosed(route: origin, id: next.id)
        pool.release(next, reusable: true)
        #expect(pool.openConnectionCount == 0)
        pool.connectionClosed(route: other, id: 12345)
        await pool.shutdown()
        #expect(upstream.closed.isEmpty, "the pool does not close what the server closed")
    }

    @Test func idsAreNotReusedAfterAnOriginEmpties() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool()
        var seen: Set<Int> = []
        for _ in 0..<5 {
            let lease = try await pool.lease(origin)
            #expect(seen.insert(lease.id).inserted)
            pool.release(lease, reusable: false)
        }
        await pool.shutdown()
    }

    @Test func shutdownFailsWaitersAndWaitsForLeases() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(maxConnections: 2)
        var events = upstream.events.makeAsyncIterator()
        let origin = self.origin
        let idle = try await pool.lease(origin)
        let held = try await pool.lease(origin)
        pool.release(idle, reusable: true)
        let stuckGate = Gate()
        let slowUpstream = FakeUpstream(gate: stuckGate)
        let slowPool = slowUpstream.pool(maxConnections: 1)
        var slowEvents = slowUpstream.events.makeAsyncIterator()
        let slowFirst = Task { try await slowPool.lease(origin) }
        await slowEvents.wait(for: .connectStarted(0))
        let slowSecond = Task { try await slowPool.lease(origin) }

        let done = NIOLockedValueBox(false)
        let shutdown = Task {
            await pool.shutdown()
            done.withLockedValue { $0 = true }
        }
        await events.wait(for: .closed(idle.id))
        #expect(!done.withLockedValue { $0 }, "shutdown returned while a connection was leased")
        do {
            _ = try await pool.lease(origin)
            Issue.record("leased after shutdown")
        } catch let error as UpstreamPoolError {
            #expect(error.code == "shutting_down")
        }
        pool.release(held, reusable: true)
        await events.wait(for: .closed(held.id))
        await shutdown.value
        #expect(done.withLockedValue { $0 })

        // A pool with a connect in flight and waiters: they fail, the connection is closed when made.
        let slowShutdown = Task { await slowPool.shutdown() }
        do {
            _ = try await slowSecond.value
            Issue.record("the waiter was served during shutdown")
        } catch let error as UpstreamPoolError {
            #expect(error.code == "shutting_down")
        }
        stuckGate.open()
        await slowShutdown.value
        #expect(slowUpstream.closed == [0])
        do {
            _ = try await slowFirst.value
            Issue.record("the first waiter was served during shutdown")
        } catch let error as UpstreamPoolError {
            #expect(error.code == "shutting_down")
        }
    }

    /// Many tasks over two origins lease, release (reusable or not), report remote closes and
    /// cancel, while idle timers fire; afterwards every connection made was closed exactly once,
    /// by the pool or by the "server".
    @Test func concurrentChurnLeavesNothingBehind() async throws {
        let upstream = FakeUpstream()
        let pool = upstream.pool(maxConnections: 3, maxIdle: 1, maxPending: 1000, idleTimeout: .milliseconds(2))
        let origins = [origin, other]
        let remoteClosed = NIOLockedValueBox([FakeUpstream.Connection]())
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<300 {
                group.addTask {
                    let origin = origins[index % 2]
                    let leaseTask = Task { try await pool.lease(origin) }
                    if index % 7 == 0 { leaseTask.cancel() }
                    guard let lease = try? await leaseTask.value else { return }
                    await Task.yield()
                    switch index % 5 {
                    case 0:
                        remoteClosed.withLockedValue { $0.append(lease.connection) }
                        pool.connectionClosed(route: lease.route, id: lease.id)
                        pool.release(lease, reusable: true)
                    case 1:
                        pool.release(lease, reusable: false)
                    default:
                        pool.release(lease, reusable: true)
                    }
                }
            }
        }
        await pool.shutdown()
        #expect(pool.openConnectionCount == 0)
        let closedByPool = upstream.closedConnections
        let closedByServer = remoteClosed.withLockedValue { $0 }
        #expect(Set(closedByPool).count == closedByPool.count, "a connection was closed twice")
        #expect(Set(closedByPool).isDisjoint(with: closedByServer))
        #expect(Set(closedByPool).union(closedByServer) == Set(upstream.madeConnections))
        #expect(upstream.madeConnections.count == closedByPool.count + closedByServer.count)
    }

    /// A request whose task runs on an event loop gets the idle connection on that loop, not
    /// the most recently idle one, and a connection made for it is made on its loop.
    @Test func leasePrefersTheRequestsEventLoop() async throws {
        struct LoopConnection: Sendable {
            var id: Int
            var loop: any EventLoop
        }
        let group = MultiThreadedEventLoopGroup(numberOfThreads: 2)
        let executors = EventLoopTaskExecutor.executors(for: group)
        let (loopA, loopB) = (executors[0].eventLoop, executors[1].eventLoop)
        let pool = UpstreamPool<LoopConnection>(
            limits: .init(maxConnections: 4, maxIdleConnections: 4, maxPendingRequests: 4),
            idleTimeout: .seconds(60), eventLoop: loopA,
            connect: { _, id, loop in LoopConnection(id: id, loop: loop ?? loopA) },
            close: { _ in },
            eventLoopOf: { $0.loop }
        )
        func lease(on executor: EventLoopTaskExecutor) async throws -> PooledConnection<LoopConnection> {
            let origin = self.origin
            let task = Task(executorPreference: executor, operation: { try await pool.lease(origin) })
            return try await task.value
        }
        let onA = try await lease(on: executors[0])
        let onB = try await lease(on: executors[1])
        #expect(onA.connection.loop === loopA, "a connection made for a request on loop A is on loop A")
        #expect(onB.connection.loop === loopB)
        pool.release(onA, reusable: true)
        pool.release(onB, reusable: true)
        // B's connection is the most recently idle; a request on A still gets A's.
        let again = try await lease(on: executors[0])
        #expect(again.id == onA.id)
        pool.release(again, reusable: true)
        // A request on no event loop gets the most recently idle one.
        let anywhere = try await pool.lease(origin)
        #expect(anywhere.id == onA.id)
        pool.release(anywhere, reusable: true)
        await pool.shutdown()
        try await group.shutdownGracefully()
    }
}
