import AuthBrokerClient
import Foundation
import NIOCore
import TestSupport

/// A config file whose `[upstream] resolve` sends test host names to local ports.
func configText(resolving names: [(String, Int)]) -> String {
    let entries = names.map { "\"\($0.0):\($0.1):127.0.0.1\"" }.joined(separator: ", ")
    return "[upstream]\nresolve = [\(entries)]\n"
}

/// Runs `body` with a started daemon and a client of it; always stops the daemon and removes
/// its directory, printing its log when the body failed.
func withDaemon<T>(
    config: String = "", challengeHandler: BrokerChallengeHandler? = nil,
    _ body: (DaemonProcess, BrokerClient) async throws -> T
) async throws -> T {
    let daemon = try await DaemonProcess.start(config: config)
    let client = BrokerClient(socketPath: daemon.socketPath, challengeHandler: challengeHandler)
    do {
        let result = try await body(daemon, client)
        await daemon.stop()
        daemon.cleanUp()
        return result
    } catch {
        await daemon.stop()
        print("authbrokerd log for the failed test:\n\(daemon.log)")
        daemon.cleanUp()
        throw error
    }
}

/// This process's resident set size in KiB, from /proc.
func ownResidentKiB() -> Int {
    guard let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") ?? 0
    }
    return 0
}

/// Waits up to `seconds` for `condition`, polling without blocking a thread.
func eventually(seconds: Double = 10, _ condition: () async throws -> Bool) async rethrows -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return try await condition()
}

/// A URL from a string the test wrote itself.
func url(_ text: String) throws -> URL {
    guard let url = URL(string: text) else { throw TestSupportError("bad URL \(text)") }
    return url
}

/// Chunks of `BytePattern` as an async sequence: a streamed upload of `total` bytes.
struct PatternChunks: AsyncSequence, Sendable {
    typealias Element = [UInt8]
    let total: Int
    let chunkSize: Int

    struct AsyncIterator: AsyncIteratorProtocol {
        let total: Int
        let chunkSize: Int
        var offset = 0

        mutating func next() async throws -> [UInt8]? {
            guard offset < total else { return nil }
            let count = Swift.min(chunkSize, total - offset)
            var buffer = BytePattern.chunk(offset: offset, count: count)
            offset += count
            await Task.yield()
            return buffer.readBytes(length: buffer.readableBytes)
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(total: total, chunkSize: chunkSize) }
}
