import NIOCore

/// Why the pool could not give a request a connection.
package enum PoolFailure: Sendable {
    /// The wait queue for this origin is full; the request was never queued.
    case tooManyPending(limit: Int)
    /// The pool is shutting down.
    case shuttingDown
    /// The connection made for this request could not be established.
    case connectFailed(any Error & Sendable)
}

extension PoolFailure: Equatable {
    /// Errors compare by their `String(describing:)`, which is enough for tests and logs.
    package static func == (lhs: Self, rhs: Self) -> Bool {
        switch (lhs, rhs) {
        case (.tooManyPending(let l), .tooManyPending(let r)): l == r
        case (.shuttingDown, .shuttingDown): true
        case (.connectFailed(let l), .connectFailed(let r)): String(describing: l) == String(describing: r)
        default: false
        }
    }
}

/// The keep-alive pool for one origin, as a value: events in, actions out, no I/O.
///
/// Modelled on async-http-client's `HTTPConnectionPool.StateMachine`: the shell (`UpstreamPool`)
/// calls one mutating event under its lock and runs the returned `Action` after releasing it, so
/// the policy (who gets which connection, when to connect, when to close) is testable as a
/// transcript without sockets or timers.
///
/// Peer-driven events never trap: an event for an unknown connection or request, or one that does
/// not fit the connection's state (a release of an idle connection, a stale idle timer), is
/// ignored and returns `.none`, because the outside world can always race with the pool.
///
/// Invariants: an idle connection exists only while no request waits; every request that waits
/// is either served by a connection being made, or counted against `maxPendingRequests`.
package struct UpstreamPoolStateMachine: Sendable {
    package typealias ConnectionID = Int
    package typealias RequestID = Int
    /// Which event loop (thread) a connection lives on, as the shell names it; a request that
    /// names one is given an idle connection on it when there is one, so it never changes thread.
    package typealias Affinity = Int

    /// The bounds of one origin's pool.
    package struct Limits: Sendable, Equatable {
        /// Connections open or being opened at once; at least 1.
        package var maxConnections: Int
        /// Idle connections kept for reuse; extra ones are closed at release. At most `maxConnections`.
        package var maxIdleConnections: Int
        /// Requests that may wait when every connection is busy, beyond those a connection is
        /// already being made for. 0 means a request waits only for a connection made for it.
        package var maxPendingRequests: Int

        package init(maxConnections: Int, maxIdleConnections: Int, maxPendingRequests: Int) {
            self.maxConnections = maxConnections
            self.maxIdleConnections = maxIdleConnections
            self.maxPendingRequests = maxPendingRequests
        }
    }

    /// What the shell does after an event: at most one thing for requests, one for connections.
    package struct Action: Sendable, Equatable {
        package var request: RequestAction
        package var connection: ConnectionAction

        package init(request: RequestAction, connection: ConnectionAction) {
            self.request = request
            self.connection = connection
        }

        package static let none = Action(request: .none, connection: .none)
    }

    package enum RequestAction: Sendable, Equatable {
        case none
        /// Hand the connection to the waiting request.
        case lease(ConnectionID, to: RequestID)
        /// Fail the request; it is no longer known to the pool.
        case fail(RequestID, PoolFailure)
        /// Fail every listed request (shutdown).
        case failAll([RequestID], PoolFailure)
        /// The request's wait was cancelled by its caller: resume it with `CancellationError`.
        /// (Addition to the brief: `PoolFailure` describes the pool, a cancel comes from the caller.)
        case cancel(RequestID)
    }

    package enum ConnectionAction: Sendable, Equatable {
        case none
        /// Start connecting; report `connectionCreated` or `connectionFailed` with this id.
        case create(ConnectionID)
        /// Close the connection and forget it (also cancel its idle timer, if any).
        case close(ConnectionID)
        /// Start the idle timer; when it fires report `idleTimeoutFired`.
        case scheduleIdleTimeout(ConnectionID)
        /// The connection left the idle state: stop its timer.
        case cancelIdleTimeout(ConnectionID)
        /// Close all of them (shutdown).
        case closeMany([ConnectionID])
        /// Close one connection and start another for a waiting request (a non-reusable release
        /// or a connection that died while it was being made, with requests still waiting).
        case closeAndCreate(close: ConnectionID, create: ConnectionID)
        /// The idle connection just leased left the idle state (stop its timer), and start another
        /// that no request waits for: it goes idle when made (see `leaseRequested`).
        case cancelIdleTimeoutAndCreate(cancel: ConnectionID, create: ConnectionID)
    }

    private enum ConnectionState: Sendable, Equatable {
        /// Being made; `closedEarly` when the channel was reported closed before it was reported made.
        case starting(closedEarly: Bool)
        case idle
        case leased
    }

    package let limits: Limits
    private var connections: [ConnectionID: ConnectionState] = [:]
    /// Idle connections, least recently parked first; the most recent is reused first so the
    /// others age out.
    private var idle: [ConnectionID] = []
    /// The affinity each connection was made with, when the shell reported one.
    private var affinities: [ConnectionID: Affinity] = [:]
    private var waiters = CircularBuffer<RequestID>()
    private var isShuttingDown = false
    /// The next id `create` will carry.
    package private(set) var nextConnectionID: ConnectionID

    /// - Parameter firstConnectionID: where this machine's ids start. A shell that drops and
    ///   re-creates machines passes a value past every id it has used, so a late report about an
    ///   old connection never names a new one.
    package init(limits: Limits, firstConnectionID: ConnectionID = 0) {
        let maxConnections = max(1, limits.maxConnections)
        self.limits = Limits(
            maxConnections: maxConnections,
            maxIdleConnections: min(max(0, limits.maxIdleConnections), maxConnections),
            maxPendingRequests: max(0, limits.maxPendingRequests)
        )
        self.nextConnectionID = firstConnectionID
    }

    /// No connections (in any state) and no waiting requests.
    package var isEmpty: Bool { connections.isEmpty && waiters.isEmpty }

    /// Connections open or being opened.
    package var connectionCount: Int { connections.count }
    /// Idle connections.
    package var idleConnectionCount: Int { idle.count }
    /// Requests waiting for a connection.
    package var waitingRequestCount: Int { waiters.count }

    private var startingCount: Int {
        connections.values.reduce(0) { count, state in
            if case .starting = state { return count + 1 }
            return count
        }
    }

    /// Waiters that no connection being made will serve.
    private var uncoveredWaiterCount: Int { max(0, waiters.count - startingCount) }

    // MARK: Events

    /// A request wants a connection: reuse the most recently idle one (of those with the
    /// request's `affinity`, if any has it), else start one if below `maxConnections`, else queue
    /// it, else (queue full) fail it.
    ///
    /// When the idle connection it gets lives elsewhere (none at the request's `affinity` is
    /// idle), one is also started there, which goes idle when made: below `maxConnections` and
    /// `maxIdleConnections` (one the pool could not keep idle would be closed again on release),
    /// and while none is being made. Otherwise the requests from that event loop beyond its
    /// connections would take the other loop's again and again: their I/O would change thread,
    /// and the client connection's direct relay, which takes only its own loop's connections,
    /// would hand them to the full path.
    package mutating func leaseRequested(_ request: RequestID, affinity: Affinity? = nil) -> Action {
        if isShuttingDown { return Action(request: .fail(request, .shuttingDown), connection: .none) }
        if let affinity, idle.count > 1, let index = idle.lastIndex(where: { affinities[$0] == affinity }) {
            let connection = idle.remove(at: index)
            connections[connection] = .leased
            return Action(request: .lease(connection, to: request), connection: .cancelIdleTimeout(connection))
        }
        if let connection = idle.popLast() {
            connections[connection] = .leased
            if let affinity, affinities[connection] != affinity, startingCount == 0,
                connections.count < min(limits.maxConnections, limits.maxIdleConnections)
            {
                let local = mintConnectionID(state: .starting(closedEarly: false))
                return Action(
                    request: .lease(connection, to: request),
                    connection: .cancelIdleTimeoutAndCreate(cancel: connection, create: local)
                )
            }
            return Action(request: .lease(connection, to: request), connection: .cancelIdleTimeout(connection))
        }
        if connections.count < limits.maxConnections {
            waiters.append(request)
            return Action(request: .none, connection: .create(mintConnectionID(state: .starting(closedEarly: false))))
        }
        guard uncoveredWaiterCount < limits.maxPendingRequests else {
            return Action(request: .fail(request, .tooManyPending(limit: limits.maxPendingRequests)), connection: .none)
        }
        waiters.append(request)
        return .none
    }

    /// A request that takes only an idle connection living at `affinity`, or nothing (`.none`):
    /// it never waits, and starts no connection.
    package mutating func idleLeaseRequested(_ request: RequestID, affinity: Affinity) -> Action {
        guard !isShuttingDown, let index = idle.lastIndex(where: { affinities[$0] == affinity }) else { return .none }
        let connection = idle.remove(at: index)
        connections[connection] = .leased
        return Action(request: .lease(connection, to: request), connection: .cancelIdleTimeout(connection))
    }

    /// A connection is ready: it goes to the oldest waiter, or is parked idle. `affinity`: where
    /// it lives, for `leaseRequested(_:affinity:)`.
    package mutating func connectionCreated(_ connection: ConnectionID, affinity: Affinity? = nil) -> Action {
        guard case .starting(let closedEarly) = connections[connection] else { return .none }
        if closedEarly {
            forget(connection)
            return Action(request: .none, connection: replacementIfNeeded(closing: connection))
        }
        if isShuttingDown {
            forget(connection)
            return Action(request: .none, connection: .close(connection))
        }
        connections[connection] = .leased
        affinities[connection] = affinity
        return handOver(connection)
    }

    /// A connection could not be made: the oldest waiter fails with the error, and if more requests
    /// wait than connections are being made for, another is started.
    ///
    /// Each failure consumes one waiter, so repeated failures end once the queue is empty.
    package mutating func connectionFailed(_ connection: ConnectionID, error: any Error & Sendable) -> Action {
        guard case .starting = connections[connection] else { return .none }
        forget(connection)
        guard let request = waiters.popFirst() else { return .none }
        return Action(request: .fail(request, .connectFailed(error)), connection: createIfNeeded())
    }

    /// A leased connection comes back. Reusable: to the oldest waiter, else idle (closed when
    /// `maxIdleConnections` are idle already). Not reusable: closed, and replaced if requests wait.
    package mutating func connectionReleased(_ connection: ConnectionID, reusable: Bool) -> Action {
        guard connections[connection] == .leased else { return .none }
        guard reusable, !isShuttingDown else {
            forget(connection)
            return Action(request: .none, connection: replacementIfNeeded(closing: connection))
        }
        return handOver(connection)
    }

    /// The connection's channel closed by itself (the server closed it, or it failed).
    ///
    /// An idle one is forgotten and its timer stopped; a leased one is forgotten (its later
    /// release is ignored) and replaced if requests wait; one still being made is remembered as
    /// dead so that its `connectionCreated` closes it instead of leasing it.
    package mutating func connectionClosed(_ connection: ConnectionID) -> Action {
        switch connections[connection] {
        case nil:
            return .none
        case .starting:
            connections[connection] = .starting(closedEarly: true)
            return .none
        case .idle:
            forget(connection)
            idle.removeAll { $0 == connection }
            return Action(request: .none, connection: .cancelIdleTimeout(connection))
        case .leased:
            forget(connection)
            return Action(request: .none, connection: createIfNeeded())
        }
    }

    /// The origin dropped a connection that had waited in the pool: the others waiting there
    /// are likely dropped too (a restart, a network change). Closes every idle connection, so
    /// the next request gets one made for it.
    package mutating func idleConnectionsSuspect() -> Action {
        let closing = idle
        idle.removeAll()
        for connection in closing { forget(connection) }
        return Action(request: .none, connection: closing.isEmpty ? .none : .closeMany(closing))
    }

    /// The caller stopped waiting. A connection being made for it is kept (it will serve the next
    /// request or go idle). Unknown after a lease or a failure: ignored.
    package mutating func leaseCancelled(_ request: RequestID) -> Action {
        guard let index = waiters.firstIndex(of: request) else { return .none }
        waiters.remove(at: index)
        return Action(request: .cancel(request), connection: .none)
    }

    /// An idle timer fired: close the connection if it is still idle (a stale timer is ignored).
    package mutating func idleTimeoutFired(_ connection: ConnectionID) -> Action {
        guard connections[connection] == .idle else { return .none }
        forget(connection)
        idle.removeAll { $0 == connection }
        return Action(request: .none, connection: .close(connection))
    }

    /// Fails every waiter with `.shuttingDown` and closes every idle connection. Connections being
    /// made are closed when made; leased ones when released. Later requests fail at once.
    package mutating func shutdown() -> Action {
        isShuttingDown = true
        let failed = Array(waiters)
        waiters.removeAll()
        let closing = idle
        idle.removeAll()
        for connection in closing { forget(connection) }
        return Action(
            request: failed.isEmpty ? .none : .failAll(failed, .shuttingDown),
            connection: closing.isEmpty ? .none : .closeMany(closing)
        )
    }

    // MARK: Helpers

    /// Gives a connection in hand (state `.leased`) to the oldest waiter, or parks it.
    private mutating func handOver(_ connection: ConnectionID) -> Action {
        if let request = waiters.popFirst() {
            return Action(request: .lease(connection, to: request), connection: .none)
        }
        guard idle.count < limits.maxIdleConnections else {
            forget(connection)
            return Action(request: .none, connection: .close(connection))
        }
        connections[connection] = .idle
        idle.append(connection)
        return Action(request: .none, connection: .scheduleIdleTimeout(connection))
    }

    /// `connection` is already forgotten: close it, and start another if requests need one.
    private mutating func replacementIfNeeded(closing connection: ConnectionID) -> ConnectionAction {
        if case .create(let new) = createIfNeeded() { return .closeAndCreate(close: connection, create: new) }
        return .close(connection)
    }

    private mutating func createIfNeeded() -> ConnectionAction {
        guard !isShuttingDown, uncoveredWaiterCount > 0, connections.count < limits.maxConnections else {
            return .none
        }
        return .create(mintConnectionID(state: .starting(closedEarly: false)))
    }

    private mutating func forget(_ connection: ConnectionID) {
        connections[connection] = nil
        affinities[connection] = nil
    }

    private mutating func mintConnectionID(state: ConnectionState) -> ConnectionID {
        let id = nextConnectionID
        nextConnectionID += 1
        connections[id] = state
        return id
    }
}
