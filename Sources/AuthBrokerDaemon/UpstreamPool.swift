import AuthBrokerCore
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

/// A connection leased from the pool; give it back with `UpstreamPool.release(_:reusable:)`.
package struct PooledConnection<Connection: Sendable>: Sendable {
    package let route: UpstreamRoute
    /// Unique within `route` for the pool's lifetime (also after the route's pool was emptied).
    package let id: Int
    package let connection: Connection
    /// The connection had waited in the pool (idle, or released by an earlier request) rather
    /// than being made for this lease: the origin may have dropped it unseen.
    package let reused: Bool

    package init(route: UpstreamRoute, id: Int, connection: Connection, reused: Bool) {
        self.route = route
        self.id = id
        self.connection = connection
        self.reused = reused
    }
}

/// Why the pool gave no connection. Equality compares `code` only.
package struct UpstreamPoolError: Error, Equatable, CustomStringConvertible {
    private enum Code: String {
        case tooManyPending = "too_many_pending"
        case shuttingDown = "shutting_down"
        case connectFailed = "connect_failed"
    }

    private var kind: Code
    /// `too_many_pending`, `shutting_down` or `connect_failed`.
    package var code: String { kind.rawValue }
    package var message: String
    package var failure: PoolFailure
    package var route: UpstreamRoute
    /// The error the connect closure threw, for `connect_failed`, so the daemon can map it to a
    /// `Proxy-Status` (DNS, refused, TLS, timeout…).
    package var underlying: (any Error)? {
        if case .connectFailed(let error) = failure { return error }
        return nil
    }

    package var description: String { "\(code): \(message)" }

    package init(_ failure: PoolFailure, route: UpstreamRoute) {
        self.failure = failure
        self.route = route
        switch failure {
        case .tooManyPending(let limit):
            kind = .tooManyPending
            message =
                "\(limit) requests to \(route) are already waiting for a connection; retry later, or raise the pool's pending-request limit in config.toml."
        case .shuttingDown:
            kind = .shuttingDown
            message = "The broker is shutting down and opens no more connections to \(route); retry once it has restarted."
        case .connectFailed(let error):
            kind = .connectFailed
            message = "Could not connect to \(route): \(error)."
        }
    }

    package static func == (lhs: Self, rhs: Self) -> Bool { lhs.kind == rhs.kind }
}

/// Per-route keep-alive pools of upstream connections: the lock-protected shell around
/// `UpstreamPoolStateMachine`.
///
/// Each event runs the route's machine under one lock; the resulting actions (resume a waiter,
/// connect, close, start or stop an idle timer) run after the lock is released, like
/// async-http-client's `modifyStateAndRunActions`, so no user closure ever runs under the lock.
/// Every waiter's continuation is taken out of the state under the lock before it is resumed,
/// which is what makes "resumed exactly once" hold under races.
///
/// The pool does not watch connections itself: the owner reports a channel that closed on its
/// own with `connectionClosed(route:id:)`.
package final class UpstreamPool<Connection: Sendable>: Sendable {
    private typealias Machine = UpstreamPoolStateMachine
    private typealias Waiter = CheckedContinuation<PooledConnection<Connection>, any Error>

    /// An idle connection's timer, armed lazily: a lease does not cancel it and a release does not
    /// schedule another while it is pending (both happened per request on a busy connection);
    /// when it fires it closes the connection if idle for the whole timeout, and otherwise is
    /// scheduled again for when that will be.
    private struct IdleTimer {
        var token: Int
        var scheduled: Scheduled<Void>?
        /// When the connection last went idle; nil while it is leased.
        var idleSince: NIODeadline?
    }

    private struct RouteState {
        var machine: Machine
        var waiters: [Machine.RequestID: Waiter] = [:]
        /// Established connections (idle or leased); ones being made are not here yet.
        var connections: [Machine.ConnectionID: Connection] = [:]
        /// The pending idle timer of each connection that has one. A timer that fires with
        /// another token is stale (its connection closed meanwhile) and is ignored.
        var idleTimers: [Machine.ConnectionID: IdleTimer] = [:]
    }

    private struct State {
        var routes: [UpstreamRoute: RouteState] = [:]
        var nextRequestID = 0
        var nextTimerToken = 0
        /// Past every connection id handed out so far: a machine made for an route again starts
        /// here, so a late report about an old connection can never name a new one.
        var firstFreeConnectionID = 0
        var isShutdown = false
        var shutdownWaiters: [CheckedContinuation<Void, Never>] = []
    }

    /// Work decided under the lock, done after it.
    private struct Effects {
        var cancelTimers: [Scheduled<Void>] = []
        var close: [Connection] = []
        var fail: [(Waiter, any Error)] = []
        var lease: [(Waiter, PooledConnection<Connection>)] = []
        var create: [(UpstreamRoute, Int, (any EventLoop)?)] = []
        /// The event loop of the request being served, for a connection made for it.
        var preferredLoop: (any EventLoop)?
        /// Idle timers to start, each on its connection's event loop when it has one.
        var schedule: [(UpstreamRoute, Int, token: Int, loop: (any EventLoop)?, deadline: NIODeadline)] = []
        /// The request that takes an idle connection at once, without waiting (see `lease`).
        var immediateRequest: Int?
        var leasedNow: Result<PooledConnection<Connection>, any Error>?
        /// The connection just made, in the event that reports it: leased now, it is not reused.
        var justCreated: Int?
        var shutdownDone: [CheckedContinuation<Void, Never>] = []
    }

    private let limits: Machine.Limits
    private let idleTimeout: TimeAmount
    private let eventLoop: any EventLoop
    private let connect: @Sendable (UpstreamRoute, _ id: Int, _ on: (any EventLoop)?) async throws -> Connection
    private let closeConnection: @Sendable (Connection) -> Void
    private let eventLoopOf: @Sendable (Connection) -> (any EventLoop)?
    private let state = NIOLockedValueBox(State())

    /// - Parameters:
    ///   - limits: applied to each route separately.
    ///   - idleTimeout: how long an idle connection is kept before it is closed.
    ///   - eventLoop: runs the idle timers of connections with no event loop of their own.
    ///   - connect: makes a connection; its error fails one waiting request (`connect_failed`).
    ///   - close: closes a connection the pool no longer wants; must not block.
    ///   - eventLoopOf: the event loop a connection lives on. A request made on an event loop
    ///     (its task runs there) gets an idle connection on the same loop when there is one, and a
    ///     connection made for it is made on that loop (`connect`'s third argument), so the
    ///     request's I/O stays on one thread.
    package init(
        limits: UpstreamPoolStateMachine.Limits, idleTimeout: TimeAmount, eventLoop: any EventLoop,
        connect: @escaping @Sendable (UpstreamRoute, _ id: Int, _ on: (any EventLoop)?) async throws -> Connection,
        close: @escaping @Sendable (Connection) -> Void,
        eventLoopOf: @escaping @Sendable (Connection) -> (any EventLoop)?
    ) {
        self.limits = limits
        self.idleTimeout = idleTimeout
        self.eventLoop = eventLoop
        self.connect = connect
        self.closeConnection = close
        self.eventLoopOf = eventLoopOf
    }

    /// A pool whose connections have no event loop preference.
    package convenience init(
        limits: UpstreamPoolStateMachine.Limits, idleTimeout: TimeAmount, eventLoop: any EventLoop,
        connect: @escaping @Sendable (UpstreamRoute, _ id: Int) async throws -> Connection,
        close: @escaping @Sendable (Connection) -> Void
    ) {
        self.init(
            limits: limits, idleTimeout: idleTimeout, eventLoop: eventLoop,
            connect: { route, id, _ in try await connect(route, id) }, close: close, eventLoopOf: { _ in nil }
        )
    }

    /// How the state machine names an event loop.
    private static func affinity(_ loop: (any EventLoop)?) -> UpstreamPoolStateMachine.Affinity? {
        loop.map { Int(bitPattern: ObjectIdentifier($0)) }
    }

    /// Established connections (idle or leased) over all routes; ones being made are not counted.
    package var openConnectionCount: Int {
        state.withLockedValue { state in state.routes.values.reduce(0) { $0 + $1.connections.count } }
    }

    /// Leases a connection to `route`, creating one if allowed; waits (cancellably: Task
    /// cancellation → leaseCancelled) otherwise.
    ///
    /// - Throws: `UpstreamPoolError` (`too_many_pending`, `shutting_down`, `connect_failed`), or
    ///   `CancellationError` when the task is cancelled while it waits.
    package func lease(_ route: UpstreamRoute) async throws -> PooledConnection<Connection> {
        // The loop this task runs on, when it runs on one (a client connection's task does).
        let loop = MultiThreadedEventLoopGroup.currentEventLoop
        let affinity = Self.affinity(loop)
        let requestID = state.withLockedValue { state in
            defer { state.nextRequestID += 1 }
            return state.nextRequestID
        }
        // An idle connection is handed over at once, without suspending: while one is idle no
        // request waits (the machine's invariant), so the machine answers with a lease.
        let now = self.modify(route) { entry, effects in
            guard !Task.isCancelled, entry.machine.idleConnectionCount > 0 else { return .none }
            effects.immediateRequest = requestID
            effects.preferredLoop = loop
            return entry.machine.leaseRequested(requestID, affinity: affinity)
        }
        self.run(now)
        if let leased = now.leasedNow { return try leased.get() }
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: Waiter) in
                // Task.isCancelled is read under the lock: the cancellation flag is set before the
                // handler runs, so either the handler finds the waiter or this check sees the flag.
                self.run(
                    self.modify(route) { entry, effects in
                        if Task.isCancelled {
                            effects.fail.append((continuation, CancellationError()))
                            return .none
                        }
                        entry.waiters[requestID] = continuation
                        effects.preferredLoop = loop
                        return entry.machine.leaseRequested(requestID, affinity: affinity)
                    }
                )
            }
        } onCancel: {
            self.run(self.modify(route) { entry, _ in entry.machine.leaseCancelled(requestID) })
        }
    }

    /// An idle connection to `route` living on `loop`, leased at once, or nil: never waits and
    /// never connects (the client connection's fast relay, which runs on `loop`, takes only these).
    package func leaseIdle(_ route: UpstreamRoute, on loop: any EventLoop) -> PooledConnection<Connection>? {
        let affinity = Int(bitPattern: ObjectIdentifier(loop))
        let effects = self.modify(route) { entry, effects in
            guard entry.machine.idleConnectionCount > 0 else { return .none }
            let request = -1  // never a waiter's id (those count up from 0)
            effects.immediateRequest = request
            return entry.machine.idleLeaseRequested(request, affinity: affinity)
        }
        self.run(effects)
        return try? effects.leasedNow?.get()
    }

    /// Gives a leased connection back. `reusable` false (the exchange left the connection in an
    /// unknown state, or the server said `Connection: close`) closes it.
    package func release(_ lease: PooledConnection<Connection>, reusable: Bool) {
        run(modify(lease.route) { entry, _ in entry.machine.connectionReleased(lease.id, reusable: reusable) })
    }

    /// Gives a leased connection back as the request state machine decided.
    package func release(_ lease: PooledConnection<Connection>, _ release: RequestStateMachine.Release) {
        self.release(lease, reusable: release == .reuse)
        if release == .closeWithIdle {
            run(modify(lease.route) { entry, _ in entry.machine.idleConnectionsSuspect() })
        }
    }

    /// The connection's channel closed by itself (server closed, error).
    package func connectionClosed(route: UpstreamRoute, id: Int) {
        run(
            modify(route) { entry, _ in
                entry.connections[id] = nil
                return entry.machine.connectionClosed(id)
            }
        )
    }

    /// Fails every waiting request with `shutting_down`, closes idle connections, and returns once
    /// every connection is gone: ones being made when their connect ends, leased ones when they
    /// are released or reported closed.
    package func shutdown() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            var effects = Effects()
            state.withLockedValue { state in
                state.isShutdown = true
                state.shutdownWaiters.append(continuation)
                for route in Array(state.routes.keys) {
                    self.apply(route, in: &state, effects: &effects) { entry, _ in entry.machine.shutdown() }
                }
                Self.finishShutdownIfDone(&state, effects: &effects)
            }
            run(effects)
        }
    }

    // MARK: Events from the connect task and the timers

    private func connectionCreated(_ route: UpstreamRoute, id: Int, connection: Connection) {
        let affinity = Self.affinity(self.eventLoopOf(connection))
        run(
            modify(route) { entry, effects in
                entry.connections[id] = connection
                effects.justCreated = id
                let action = entry.machine.connectionCreated(id, affinity: affinity)
                if action == .none {
                    // The machine did not expect this connection: never keep one nobody owns.
                    entry.connections[id] = nil
                    effects.close.append(connection)
                }
                return action
            }
        )
    }

    private func connectionFailed(_ route: UpstreamRoute, id: Int, error: any Error) {
        run(modify(route) { entry, _ in entry.machine.connectionFailed(id, error: error) })
    }

    private func idleTimerFired(_ route: UpstreamRoute, id: Int, token: Int) {
        let now = NIODeadline.now()
        run(
            modify(route) { entry, effects in
                guard let timer = entry.idleTimers[id], timer.token == token else { return .none }
                guard let idleSince = timer.idleSince else {
                    // Leased: its next release arms a new timer.
                    entry.idleTimers[id] = nil
                    return .none
                }
                let deadline = idleSince + self.idleTimeout
                guard deadline <= now else {
                    // Leased and released since it was armed: due later.
                    effects.schedule.append(
                        (route, id, token: token, loop: entry.connections[id].flatMap(self.eventLoopOf), deadline: deadline)
                    )
                    return .none
                }
                entry.idleTimers[id] = nil
                return entry.machine.idleTimeoutFired(id)
            }
        )
    }

    private func timerScheduled(_ route: UpstreamRoute, id: Int, token: Int, scheduled: Scheduled<Void>) {
        let stale = state.withLockedValue { state -> Bool in
            guard state.routes[route]?.idleTimers[id]?.token == token else { return true }
            state.routes[route]?.idleTimers[id]?.scheduled = scheduled
            return false
        }
        // The connection left the idle state between scheduling and here.
        if stale { scheduled.cancel() }
    }

    // MARK: Running the machine

    private func modify(
        _ route: UpstreamRoute, _ event: (inout RouteState, inout Effects) -> Machine.Action
    ) -> Effects {
        var effects = Effects()
        state.withLockedValue { state in
            self.apply(route, in: &state, effects: &effects, event)
            Self.finishShutdownIfDone(&state, effects: &effects)
        }
        return effects
    }

    /// Runs one event on the route's machine and turns its action into effects; called under the
    /// lock, so it only moves values around.
    private func apply(
        _ route: UpstreamRoute, in state: inout State, effects: inout Effects,
        _ event: (inout RouteState, inout Effects) -> Machine.Action
    ) {
        var nextTimerToken = state.nextTimerToken
        // Changed in place in the dictionary, not copied out: a copy would share the machine's
        // storage with the dictionary, and every mutation would copy it whole. By index rather
        // than `subscript(_:default:)`, whose default's closure was an allocation per event.
        let index: Dictionary<UpstreamRoute, RouteState>.Index
        if let existing = state.routes.index(forKey: route) {
            index = existing
        } else {
            var entry = RouteState(machine: Machine(limits: limits, firstConnectionID: state.firstFreeConnectionID))
            // A machine made after shutdown refuses at once.
            if state.isShutdown { _ = entry.machine.shutdown() }
            state.routes[route] = entry
            index = state.routes.index(forKey: route)!  // just inserted
        }
        let after = self.apply(route, to: &state.routes.values[index], effects: &effects, nextTimerToken: &nextTimerToken, event)
        state.nextTimerToken = nextTimerToken
        if after.unused {
            // Forget idle routes so the state stays bounded by the routes in use.
            state.routes[route] = nil
        }
        state.firstFreeConnectionID = max(state.firstFreeConnectionID, after.nextConnectionID)
    }

    /// `apply` on the route's entry: whether the route is unused after it, and its machine's
    /// next connection id.
    private func apply(
        _ route: UpstreamRoute, to entry: inout RouteState, effects: inout Effects, nextTimerToken: inout Int,
        _ event: (inout RouteState, inout Effects) -> Machine.Action
    ) -> (unused: Bool, nextConnectionID: Int) {
        let action = event(&entry, &effects)

        switch action.request {
        case .none:
            break
        case .lease(let id, let request):
            // Unreachable failure while shell and machine agree; it fails the request rather than
            // leave it hanging.
            let leased: Result<PooledConnection<Connection>, any Error> =
                if let connection = entry.connections[id] {
                    .success(PooledConnection(route: route, id: id, connection: connection, reused: id != effects.justCreated))
                } else {
                    .failure(UpstreamPoolError(.connectFailed(LostConnectionError(id: id)), route: route))
                }
            if request == effects.immediateRequest {
                effects.leasedNow = leased
            } else if let waiter = entry.waiters.removeValue(forKey: request) {
                switch leased {
                case .success(let lease): effects.lease.append((waiter, lease))
                case .failure(let error): effects.fail.append((waiter, error))
                }
            }
        case .fail(let request, let failure):
            if let waiter = entry.waiters.removeValue(forKey: request) {
                effects.fail.append((waiter, UpstreamPoolError(failure, route: route)))
            }
        case .failAll(let requests, let failure):
            for request in requests {
                if let waiter = entry.waiters.removeValue(forKey: request) {
                    effects.fail.append((waiter, UpstreamPoolError(failure, route: route)))
                }
            }
        case .cancel(let request):
            if let waiter = entry.waiters.removeValue(forKey: request) {
                effects.fail.append((waiter, CancellationError()))
            }
        }

        /// The connection left the idle state: its timer stays pending (see `IdleTimer`).
        func markLeased(_ id: Int) {
            if let index = entry.idleTimers.index(forKey: id) { entry.idleTimers.values[index].idleSince = nil }
        }
        func close(_ id: Int) {
            if let timer = entry.idleTimers.removeValue(forKey: id), let scheduled = timer.scheduled {
                effects.cancelTimers.append(scheduled)
            }
            if let connection = entry.connections.removeValue(forKey: id) { effects.close.append(connection) }
        }
        switch action.connection {
        case .none:
            break
        case .create(let id):
            effects.create.append((route, id, effects.preferredLoop))
        case .close(let id):
            close(id)
        case .closeMany(let ids):
            ids.forEach(close)
        case .closeAndCreate(let closing, let creating):
            close(closing)
            effects.create.append((route, creating, effects.preferredLoop))
        case .scheduleIdleTimeout(let id):
            let now = NIODeadline.now()
            // By index: one look-up, and the timer changed in place.
            if let index = entry.idleTimers.index(forKey: id) {
                entry.idleTimers.values[index].idleSince = now
            } else {
                let token = nextTimerToken
                nextTimerToken += 1
                entry.idleTimers[id] = IdleTimer(token: token, scheduled: nil, idleSince: now)
                // On the connection's own loop: a release there (the usual case) schedules
                // without waking another thread.
                effects.schedule.append(
                    (route, id, token: token, loop: entry.connections[id].flatMap(self.eventLoopOf), deadline: now + self.idleTimeout)
                )
            }
        case .cancelIdleTimeout(let id):
            markLeased(id)
        case .cancelIdleTimeoutAndCreate(let id, let creating):
            markLeased(id)
            effects.create.append((route, creating, effects.preferredLoop))
        }

        let unused = entry.machine.isEmpty && entry.waiters.isEmpty && entry.connections.isEmpty
        return (unused: unused, nextConnectionID: entry.machine.nextConnectionID)
    }

    private static func finishShutdownIfDone(_ state: inout State, effects: inout Effects) {
        guard state.isShutdown, state.routes.isEmpty else { return }
        effects.shutdownDone += state.shutdownWaiters
        state.shutdownWaiters.removeAll()
    }

    private func run(_ effects: Effects) {
        for timer in effects.cancelTimers { timer.cancel() }
        for connection in effects.close { closeConnection(connection) }
        for (waiter, error) in effects.fail { waiter.resume(throwing: error) }
        for (waiter, lease) in effects.lease { waiter.resume(returning: lease) }
        for (route, id, loop) in effects.create {
            Task {
                do {
                    let connection = try await self.connect(route, id, loop)
                    self.connectionCreated(route, id: id, connection: connection)
                } catch {
                    self.connectionFailed(route, id: id, error: error)
                }
            }
        }
        for (route, id, token, loop, deadline) in effects.schedule {
            let scheduled = (loop ?? self.eventLoop).scheduleTask(deadline: deadline) {
                self.idleTimerFired(route, id: id, token: token)
            }
            timerScheduled(route, id: id, token: token, scheduled: scheduled)
        }
        for waiter in effects.shutdownDone { waiter.resume() }
    }
}

/// The state machine leased a connection the shell does not hold; never expected.
private struct LostConnectionError: Error, CustomStringConvertible {
    var id: Int
    var description: String { "internal error: connection \(id) was leased but is not held by the pool; please report this" }
}
