import NIOCore

/// Runs a task's jobs on one NIO event loop (a Swift `TaskExecutor`; NIO 2.101 has none).
///
/// A client connection's task prefers the executor of its channel's event loop, and its
/// upstream connection is placed on the same loop, so a request's socket I/O, its async
/// sequences and its task all run on one thread instead of hopping between the event loops and
/// Swift's cooperative pool several times per request (bench-results/PROFILE.md: the hops were
/// ~14% of the daemon's CPU). Work that may block (control API requests: files, the keyring)
/// is moved off the loop with `withTaskExecutorPreference(globalConcurrentExecutor)`.
package final class EventLoopTaskExecutor: TaskExecutor {
    package let eventLoop: any EventLoop

    private init(_ eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        self.eventLoop.execute {
            job.runSynchronously(on: self.asUnownedTaskExecutor())
        }
    }

    /// One executor per loop of `group`, made once and kept for the process's life: a task
    /// refers to its preferred executor unowned, so executors must outlive every task.
    package static func executors(for group: any EventLoopGroup) -> [EventLoopTaskExecutor] {
        group.makeIterator().map { EventLoopTaskExecutor($0) }
    }
}

extension [EventLoopTaskExecutor] {
    /// The executor that runs on `eventLoop`, if it belongs to these.
    package func executor(for eventLoop: any EventLoop) -> EventLoopTaskExecutor? {
        self.first { $0.eventLoop === eventLoop }
    }
}
