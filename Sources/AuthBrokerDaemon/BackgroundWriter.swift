import Dispatch
import NIOConcurrencyHelpers

/// File writes handed off by many threads and made by one writer at a time, off the callers'
/// threads: the log outputs (`BatchedLogOutput`: the access and diagnostic log, the audit log)
/// and the password marks (`MarkFile`) all write this way.
///
/// What waits to be written (`Pending`: bytes to append, the latest contents of a whole file)
/// changes under a short lock that no write ever holds. A write takes everything pending at
/// once and writes it under a second lock that only writes take, so writes never overlap and
/// are made in the order their contents were taken: lines stay whole and in order, and the
/// last write of a file holds its latest contents.
package final class BackgroundWriter<Pending: Sendable>: Sendable {
    /// When a change must be written.
    package enum When: Sendable, Equatable {
        /// Within `delay`, with whatever else comes meanwhile (a batch of log lines).
        case within(DispatchTimeInterval)
        /// As soon as the background writer gets to it.
        case soon
        /// Before `submit` returns, by the caller (an unbatched log line; a batch the output
        /// has fallen far behind on: the caller then waits rather than memory grow without bound).
        case now
    }

    private struct State: Sendable {
        var pending: Pending
        var hasPending = false
        /// A delayed write is scheduled: true only while a timer is on its way.
        var timerArmed = false
        /// A write is queued that has not taken what is pending yet.
        var writeQueued = false
    }

    private enum Action {
        case none
        case writeNow
        case queue
        case arm(DispatchTimeInterval)
    }

    private let state: NIOLockedValueBox<State>
    /// Held across each write, by writes only: callers that submit never wait for it (except `.now`).
    private let writing = NIOLock()
    private let queue: DispatchQueue
    private let take: @Sendable (inout Pending) -> Pending
    private let write: @Sendable (Pending) -> Void

    /// - Parameters:
    ///   - initial: what is pending before anything is submitted.
    ///   - take: what a write takes from what is pending, leaving what the next change starts
    ///     from (bytes: all of them, leaving none; a file's contents: a copy).
    ///   - write: makes one write, on the writer's queue or (`.now`, `flush`) the caller's
    ///     thread; it must not submit to this writer.
    package init(
        label: String, initial: Pending, take: @escaping @Sendable (inout Pending) -> Pending,
        write: @escaping @Sendable (Pending) -> Void
    ) {
        self.state = NIOLockedValueBox(State(pending: initial))
        self.queue = DispatchQueue(label: label)
        self.take = take
        self.write = write
    }

    /// Changes what is pending, under the lock; `change` returns when it must be written, or
    /// nil when it changed nothing.
    package func submit(_ change: (inout Pending) -> When?) {
        let action = self.state.withLockedValue { state -> Action in
            guard let when = change(&state.pending) else { return .none }
            state.hasPending = true
            switch when {
            case .now:
                return .writeNow
            case .soon:
                if state.writeQueued { return .none }
                state.writeQueued = true
                return .queue
            case .within(let delay):
                if state.timerArmed || state.writeQueued { return .none }
                state.timerArmed = true
                return .arm(delay)
            }
        }
        switch action {
        case .none:
            return
        case .writeNow:
            self.flush()
        case .queue:
            self.queue.async { self.flush() }
        case .arm(let delay):
            self.queue.asyncAfter(deadline: .now() + delay) {
                self.state.withLockedValue { $0.timerArmed = false }
                self.flush()
            }
        }
    }

    /// Writes what is pending before it returns, after any write in progress: at shutdown,
    /// and wherever everything submitted so far must be on disk.
    package func flush() {
        self.writing.withLock {
            let taken = self.state.withLockedValue { state -> Pending? in
                // Whatever a queued write was for is taken now: the next change queues another.
                state.writeQueued = false
                guard state.hasPending else { return nil }
                state.hasPending = false
                return self.take(&state.pending)
            }
            if let taken { self.write(taken) }
        }
    }
}
