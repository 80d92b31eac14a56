import CAuthBrokerSystem

/// Gives the memory glibc's allocator keeps in free chunks back to the kernel, once a second.
///
/// Serving a request leaves ~22 KiB of freed heap per connection scattered between live
/// objects, where trimming the top of the heap never reaches it: 1000 idle client connections
/// after one request each kept the daemon at ~72 MiB RSS, and `malloc_trim(0)` (which also
/// releases whole free pages inside the heap) brought it to ~40 MiB with the same connections
/// open. A trim of a small heap takes well under a millisecond; it runs off the event loops.
enum MemoryTrimmer {
    static let interval: Duration = .seconds(1)

    /// Trims every `interval` in which `activity` (a count of requests) changed, until the task
    /// is cancelled; an idle daemon has nothing new to give back.
    static func run(activity: @Sendable () -> Int) async {
        var trimmedAt = activity()
        while !Task.isCancelled {
            do {
                try await Task.sleep(for: interval)
            } catch {
                return
            }
            let now = activity()
            guard now != trimmedAt else { continue }
            trimmedAt = now
            _ = cab_malloc_trim()
        }
    }
}
