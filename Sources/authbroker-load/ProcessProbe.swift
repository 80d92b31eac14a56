#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// Reads another process's CPU time and resident memory from `/proc` (Linux, proc(5)).
enum ProcessProbe {
    /// Clock ticks per second, the unit of `utime` and `stime`.
    static let ticksPerSecond: Double = {
        let ticks = sysconf(Int32(_SC_CLK_TCK))
        return ticks > 0 ? Double(ticks) : 100
    }()

    /// User plus system CPU time of `pid`, in milliseconds; `nil` when it cannot be read.
    static func cpuMilliseconds(pid: Int32) -> Double? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let closing = stat.lastIndex(of: ")")
        else { return nil }
        // Fields after "(comm)" start at field 3 (state); utime is field 14, stime 15.
        let fields = stat[stat.index(after: closing)...].split(separator: " ")
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else {
            return nil
        }
        return (user + system) * 1000 / ticksPerSecond
    }

    /// Sum of `cpuMilliseconds` over `pids`; `nil` when any cannot be read.
    static func cpuMilliseconds(pids: [Int32]) -> Double? {
        var total = 0.0
        for pid in pids {
            guard let value = cpuMilliseconds(pid: pid) else { return nil }
            total += value
        }
        return total
    }

    /// `VmRSS` of `pid`, in KiB; `nil` when it cannot be read.
    static func residentKiB(pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else {
            return nil
        }
        for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return line.split(separator: " ").dropFirst().first.flatMap { Int($0) }
        }
        return nil
    }
}

/// Samples a process's RSS every `interval` until cancelled, keeping the first and the largest.
struct ResidentSampler: Sendable {
    struct Summary: Sendable, Codable {
        var beforeKiB: Int
        var maxKiB: Int
        var afterKiB: Int
        var samples: Int
    }

    let pid: Int32
    private let task: Task<(first: Int, max: Int, samples: Int), Never>

    init(pid: Int32, interval: Duration = .milliseconds(20)) {
        self.pid = pid
        let first = ProcessProbe.residentKiB(pid: pid) ?? 0
        task = Task.detached {
            var largest = first
            var samples = 1
            // Bounded by the caller: it cancels this task when the run ends.
            while !Task.isCancelled {
                if let value = ProcessProbe.residentKiB(pid: pid) {
                    largest = max(largest, value)
                    samples += 1
                }
                try? await Task.sleep(for: interval)
            }
            return (first, largest, samples)
        }
    }

    func finish() async -> Summary {
        task.cancel()
        let values = await task.value
        let after = ProcessProbe.residentKiB(pid: pid) ?? 0
        return Summary(
            beforeKiB: values.first, maxKiB: max(values.max, after), afterKiB: after, samples: values.samples)
    }
}
