import Foundation

/// The soak's figures and its verdict, as Markdown for bench-results/SOAK.md.
struct SoakReport {
    var seconds: Int
    var clients: Int
    var warmup: Int
    var tally: Tally.Snapshot
    var samples: [Sample]
    var before: (fds: Int, residentKiB: Int)
    var after: (fds: Int, residentKiB: Int)
    var daemonExit: Int32
    var machine: String

    /// The last window's mean and minimum resident memory may be at most this much above the first
    /// window's (allocator slack, not growth per request). Peaks are shown but not judged: one
    /// sample during a burst of large bodies says nothing about a leak.
    static let residentSlackKiB = 16 * 1024
    /// The last window's mean and minimum descriptor counts may be at most this many above the first's.
    static let fdSlack = 8

    struct Window {
        var from: Double
        var to: Double
        var samples: [Sample]
        var rss: (min: Int, mean: Int, max: Int)
        var fds: (min: Int, mean: Int, max: Int)
    }

    /// The first window after the warm-up and the last one, each a minute (shorter for short runs).
    var windows: (first: Window, last: Window)? {
        let end = Double(self.seconds)
        let length = min(60, max(1, (end - Double(self.warmup)) / 2))
        func window(_ from: Double, _ to: Double) -> Window? {
            let inside = self.samples.filter { $0.seconds >= from && $0.seconds < to }
            guard !inside.isEmpty else { return nil }
            func stats(_ values: [Int]) -> (Int, Int, Int) {
                (values.min() ?? 0, values.reduce(0, +) / values.count, values.max() ?? 0)
            }
            return Window(from: from, to: to, samples: inside, rss: stats(inside.map(\.residentKiB)), fds: stats(inside.map(\.fds)))
        }
        guard let first = window(Double(self.warmup), Double(self.warmup) + length), let last = window(end - length, end + 1)
        else { return nil }
        return (first, last)
    }

    var failureCount: Int { self.tally.failures.values.map(\.count).reduce(0, +) }

    var memoryFlat: Bool {
        guard let windows else { return false }
        return windows.last.rss.mean <= windows.first.rss.mean + Self.residentSlackKiB
            && windows.last.rss.min <= windows.first.rss.min + Self.residentSlackKiB
    }

    var descriptorsFlat: Bool {
        guard let windows else { return false }
        return windows.last.fds.mean <= windows.first.fds.mean + Self.fdSlack
            && windows.last.fds.min <= windows.first.fds.min + Self.fdSlack && self.after.fds <= self.before.fds
    }

    var passed: Bool {
        self.failureCount == 0 && self.tally.agentErrors.isEmpty && self.memoryFlat && self.descriptorsFlat && self.daemonExit == 0
    }

    static func machineLine() -> String {
        let cores = ProcessInfo.processInfo.activeProcessorCount
        let memory = ProcessInfo.processInfo.physicalMemory >> 30
        return "\(cores) cores, \(memory) GiB, \(ProcessInfo.processInfo.operatingSystemVersionString)"
    }

    /// Every sample: seconds, RSS (KiB), descriptors, then requests completed so far by kind.
    func samplesCSV() -> String {
        var lines = ["seconds,rss_kib,fds," + Kind.allCases.map(\.rawValue).joined(separator: ",")]
        for sample in self.samples {
            let counts = Kind.allCases.map { String(sample.completed[$0] ?? 0) }.joined(separator: ",")
            lines.append(String(format: "%.1f", sample.seconds) + ",\(sample.residentKiB),\(sample.fds),\(counts)")
        }
        return lines.joined(separator: "\n") + "\n"
    }

    func markdown() -> String {
        let total = Kind.allCases.map { self.tally.latencies[$0]?.count ?? 0 }.reduce(0, +)
        var text = """
            # Soak run

            `make soak` (`scripts/soak`, `SOAK_SECONDS` to change the length): the release `authbrokerd`
            under mixed traffic from \(self.clients) concurrent clients for \(self.seconds) s, every response
            checked (status, length, content). Machine: \(self.machine); shared with other work while it ran.
            Written \(ISO8601DateFormatter().string(from: Date())).

            **Verdict: \(self.passed ? "PASS" : "FAIL")**: \(self.failureCount) failed requests that should have
            succeeded (must be 0), \(self.tally.agentErrors.count) agent errors; memory \(self.memoryFlat ? "flat" : "NOT flat"),
            descriptors \(self.descriptorsFlat ? "flat" : "NOT flat"); the daemon exited with \(self.daemonExit) on SIGTERM.

            ## Requests

            \(total) requests completed (\(String(format: "%.0f", Double(total) / Double(max(1, self.seconds)))) per second);
            each client keeps its connection alive and opens a new one for about one request in ten.

            | kind | what | completed | failed | p50 ms | p99 ms |
            |---|---|---:|---:|---:|---:|

            """
        for kind in Kind.allCases {
            let latencies = (self.tally.latencies[kind] ?? []).sorted()
            func percentile(_ p: Double) -> String {
                guard !latencies.isEmpty else { return "-" }
                let index = min(latencies.count - 1, Int(Double(latencies.count) * p))
                return String(format: "%.1f", latencies[index] * 1000)
            }
            let failed = self.tally.failures[kind]?.count ?? 0
            text += "| \(kind.rawValue) | \(kind.meaning) | \(latencies.count) | \(failed) | \(percentile(0.5)) | \(percentile(0.99)) |\n"
        }
        text += "\nThe agent answered \(self.tally.agentAnswers) challenges (each can release several coalesced requests).\n"
        text += """

            The Digest origin is the strict kind: `nc` must rise per nonce. Concurrent requests share the
            daemon's nonce over several connections, so some counts arrive out of order and are refused;
            the server accepting the same password from other requests meanwhile tells the daemon the
            refusal is not about the password, so it answers afresh and never marks it refused
            (`AuthAttemptPolicy`). An earlier daemon marked it refused and failed about 40% of such a run.

            """
        let failures = Kind.allCases.flatMap { kind in (self.tally.failures[kind] ?? []).map { "\(kind.rawValue): \($0)" } }
            + self.tally.agentErrors.map { "agent: \($0)" }
        if !failures.isEmpty {
            text += "\nFirst failures:\n\n" + failures.prefix(20).map { "- `\($0)`" }.joined(separator: "\n") + "\n"
        }
        text += """

            ## Daemon memory and descriptors

            Sampled from `/proc/PID/status` (VmRSS) and `/proc/PID/fd` every second (descriptors other than
            timer descriptors, which libdispatch makes once per clock on first use). Flat means: the last
            window's mean and minimum are at most \(Self.residentSlackKiB / 1024) MiB (memory) or \(Self.fdSlack) descriptors above the
            first window's, and once the traffic stopped and idle pooled connections expired, no more
            descriptors are open than before the traffic started. Peaks are shown, not judged: a single
            sample during a burst of concurrent large bodies is not growth.

            | | RSS min / mean / max (MiB) | open fds min / mean / max |
            |---|---|---|

            """
        func mib(_ kib: Int) -> String { String(format: "%.1f", Double(kib) / 1024) }
        if let windows = self.windows {
            for (name, window) in [("first window after warm-up", windows.first), ("last window", windows.last)] {
                text += "| \(name) (\(Int(window.from))–\(Int(window.to)) s) | \(mib(window.rss.min)) / \(mib(window.rss.mean)) / \(mib(window.rss.max)) | \(window.fds.min) / \(window.fds.mean) / \(window.fds.max) |\n"
            }
        }
        text += "| before the traffic | \(mib(self.before.residentKiB)) | \(self.before.fds) |\n"
        text += "| after the traffic, idle connections expired | \(mib(self.after.residentKiB)) | \(self.after.fds) |\n"
        if let peak = self.samples.max(by: { $0.residentKiB < $1.residentKiB }) {
            let above = self.samples.filter { $0.residentKiB > peak.residentKiB * 3 / 4 }.count
            text += "\nThe highest RSS sample: \(mib(peak.residentKiB)) MiB at \(Int(peak.seconds)) s; \(above) of \(self.samples.count) samples were above three quarters of it.\n"
        }
        let perMinute = stride(from: 0, to: self.samples.count, by: 30).map { self.samples[$0] }
        text += "\nEvery second's sample, with the requests completed by then: `SOAK-samples.csv` beside this file.\n"
        text += "\nEvery 30 s: " + perMinute.map { "\(Int($0.seconds)) s \(mib($0.residentKiB)) MiB/\($0.fds) fds" }.joined(separator: "; ") + ".\n"
        return text
    }
}
