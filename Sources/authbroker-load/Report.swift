import Foundation
import Histogram

/// What a run measured, printed for people or as JSON for `scripts/bench`.
struct LoadReport: Codable, Sendable {
    struct Latency: Codable, Sendable {
        var p50Ms: Double
        var p90Ms: Double
        var p99Ms: Double
        var maxMs: Double
        var meanMs: Double

        init(_ histogram: Histogram<UInt64>) {
            func ms(_ nanos: UInt64) -> Double { Double(nanos) / 1_000_000 }
            p50Ms = ms(histogram.valueAtPercentile(50))
            p90Ms = ms(histogram.valueAtPercentile(90))
            p99Ms = ms(histogram.valueAtPercentile(99))
            maxMs = ms(histogram.max)
            meanMs = histogram.mean / 1_000_000
        }
    }

    struct CPU: Codable, Sendable {
        var pids: [Int32]
        var totalMs: Double
        /// CPU time of those processes per 1000 counted requests.
        var msPer1000Requests: Double
    }

    struct Stream: Codable, Sendable {
        var bytes: Int
        var seconds: Double
        var mibPerSecond: Double
        var firstByteMs: Double?
    }

    var mode: String
    var target: String
    var address: String
    var connections: Int
    var seconds: Double
    var requests: Int
    var requestsPerSecond: Double
    var bytes: Int
    var errors: ErrorCounts
    var reconnects: Int
    var latency: Latency?
    var cpu: CPU?
    var rss: ResidentSampler.Summary?
    var stream: Stream?
    /// Hold-idle mode: connections open when memory was measured.
    var heldConnections: Int?

    func json() throws -> String {
        let encoder = JSONEncoder()
        encoder.keyEncodingStrategy = .convertToSnakeCase
        encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
        return String(decoding: try encoder.encode(self), as: UTF8.self)
    }

    func text() -> String {
        var lines = [
            "\(mode) \(target) via \(address), \(connections) connection(s), \(fmt(seconds)) s",
            "requests: \(requests)  (\(fmt(requestsPerSecond)) req/s)  bytes: \(bytes)  reconnects: \(reconnects)",
            "errors: \(errors.total) (status \(errors.status), length \(errors.length), connect \(errors.connect), "
                + "io \(errors.io), timeout \(errors.timeout))",
        ]
        if let latency {
            lines.append(
                "latency ms: p50 \(fmt(latency.p50Ms, 3))  p90 \(fmt(latency.p90Ms, 3))  "
                    + "p99 \(fmt(latency.p99Ms, 3))  max \(fmt(latency.maxMs, 3))")
        }
        if let stream {
            lines.append(
                "stream: \(stream.bytes) bytes in \(fmt(stream.seconds, 3)) s = \(fmt(stream.mibPerSecond)) MiB/s"
                    + (stream.firstByteMs.map { ", first byte \(fmt($0, 3)) ms" } ?? ""))
        }
        if let cpu {
            lines.append("cpu of \(cpu.pids): \(fmt(cpu.totalMs)) ms, \(fmt(cpu.msPer1000Requests)) ms per 1000 requests")
        }
        if let rss {
            lines.append("rss KiB: before \(rss.beforeKiB)  max \(rss.maxKiB)  after \(rss.afterKiB)")
        }
        if let heldConnections {
            lines.append("held idle connections: \(heldConnections)")
        }
        return lines.joined(separator: "\n")
    }

    private func fmt(_ value: Double, _ digits: Int = 1) -> String {
        String(format: "%.\(digits)f", value)
    }
}
