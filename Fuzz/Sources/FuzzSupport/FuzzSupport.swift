import Dispatch
import Foundation

/// Helpers every libFuzzer harness shares: reading the input, checking invariants, and running
/// the async production paths (the control API) to completion for one input.
package enum Fuzz {
    /// Stops the process when an invariant fails. libFuzzer sees the trap, writes the input as
    /// `crash-<sha1>` and exits non-zero; `message` says which invariant broke.
    package static func check(
        _ condition: @autoclosure () -> Bool, _ message: @autoclosure () -> String,
        file: StaticString = #fileID, line: UInt = #line
    ) {
        if !condition() { fatalError("fuzz invariant failed: \(message())", file: file, line: line) }
    }

    /// The input as text the way the daemon receives header and body text: invalid UTF-8
    /// repaired (NIOHTTP1 and `String(decoding:)` do the same).
    package static func text(_ bytes: UnsafeRawBufferPointer) -> String {
        String(decoding: bytes, as: UTF8.self)
    }

    /// Splits `bytes` at the first newline: a header line (without the newline) and the rest.
    package static func splitFirstLine(_ bytes: UnsafeRawBufferPointer) -> (first: String, rest: [UInt8]) {
        guard let newline = bytes.firstIndex(of: 0x0A) else { return (text(bytes), []) }
        let first = String(decoding: bytes[..<newline], as: UTF8.self)
        return (first, Array(bytes[(newline + 1)...]))
    }

    /// Runs `body` to completion and returns its result; the harness entry point is synchronous.
    ///
    /// libFuzzer calls the harness on the main thread, and the daemon's `ChallengeBroker` is
    /// `@MainActor`: so the main thread runs its run loop (which drains the main queue) until
    /// the result arrives, rather than blocking on a semaphore, which would deadlock.
    package static func runBlocking<T: Sendable>(_ body: @escaping @Sendable () async -> T) -> T {
        let slot = MainThreadSlot<T>()
        Task {
            let value = await body()
            DispatchQueue.main.async { slot.value = value }
        }
        while slot.value == nil {
            _ = RunLoop.main.run(mode: .default, before: Date(timeIntervalSinceNow: 1))
        }
        // The loop above ends only once the value is set.
        return slot.value!
    }
}

/// Written and read on the main thread only (by `runBlocking`), so no lock is needed.
private final class MainThreadSlot<T>: @unchecked Sendable {
    var value: T?
}
