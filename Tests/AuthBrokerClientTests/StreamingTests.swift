import AuthBrokerClient
import Foundation
import Testing
import TestSupport

/// Bodies stream both ways through the real daemon, in bounded memory, and cancelling the
/// reader stops the transfer upstream.
@Suite("BrokerClient streaming")
struct StreamingTests {
    @Test("a 64 MiB download streams with bounded client memory and intact bytes")
    func largeDownload() async throws {
        let origin = try await TestOrigin.start(name: "big")
        defer { Task { await origin.stop() } }
        let size = 64 * 1024 * 1024
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { _, client in
            let baseline = ownResidentKiB()
            var peak = baseline
            let response = try await client.send(BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/bytes/\(size)")))
            #expect(response.status == 200)
            #expect(response.headers["Content-Length"] == String(size))
            var received = 0
            var mismatches = 0
            var chunks = 0
            for try await chunk in response.body {
                if !BytePattern.matches(chunk[...], offset: received) { mismatches += 1 }
                received += chunk.count
                chunks += 1
                if chunks % 64 == 0 { peak = max(peak, ownResidentKiB()) }
            }
            peak = max(peak, ownResidentKiB())
            #expect(received == size)
            #expect(mismatches == 0)
            print("64 MiB download via BrokerClient: client RSS \(baseline) KiB before, peak \(peak) KiB, growth \(peak - baseline) KiB, \(chunks) chunks")
            #expect(peak - baseline < 64 * 1024)
        }
    }

    @Test("an upload from an async sequence goes chunked and echoes back intact")
    func streamedUpload() async throws {
        let origin = try await TestOrigin.start(name: "echo")
        defer { Task { await origin.stop() } }
        let size = 3 * 1024 * 1024 + 17
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { _, client in
            let request = BrokerRequest(
                url: try url("http://origin.internal.test:\(origin.port)/echo"), method: "POST",
                body: .stream(PatternChunks(total: size, chunkSize: 10_000))
            )
            let response = try await client.send(request)
            #expect(response.status == 200)
            var received = 0
            var mismatches = 0
            for try await chunk in response.body {
                if !BytePattern.matches(chunk[...], offset: received) { mismatches += 1 }
                received += chunk.count
            }
            #expect(received == size)
            #expect(mismatches == 0)

            // With a declared length: Content-Length framing instead.
            let (data, head) = try await client.data(
                for: BrokerRequest(
                    url: try url("http://origin.internal.test:\(origin.port)/echo"), method: "PUT",
                    body: .stream(PatternChunks(total: 100_000, chunkSize: 4096), length: 100_000)
                )
            )
            #expect(head.status == 200)
            #expect(head.headers["Content-Length"] == "100000")
            #expect(BytePattern.matches(Array(data)[...], offset: 0) && data.count == 100_000)
        }
    }

    @Test("data(for:) collects a small body and refuses one over maxBytes")
    func collectSmall() async throws {
        let origin = try await TestOrigin.start(name: "small")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { _, client in
            let (data, head) = try await client.data(for: BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/hello")))
            #expect(head.status == 200)
            #expect(String(decoding: data, as: UTF8.self) == "hello from small")
            #expect(head.requestID?.count == 15)
            #expect(head.headers["Via"]?.contains("authbrokerd") == true)
            await #expect(throws: BrokerClientError.responseTooLarge(limit: 1000)) {
                _ = try await client.data(for: BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/bytes/100000")), maxBytes: 1000)
            }
        }
    }

    @Test("cancelling the reading task mid-body closes the connection; the daemon drops the upstream request")
    func cancelMidBody() async throws {
        let origin = try await TestOrigin.start(name: "huge")
        defer { Task { await origin.stop() } }
        let huge = 64 * 1024 * 1024 * 1024  // 64 GiB: never finishes on its own
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { daemon, client in
            let started = AsyncStream<Int>.makeStream()
            let reader = Task {
                let response = try await client.send(BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/bytes/\(huge)")))
                var received = 0
                for try await chunk in response.body {
                    received += chunk.count
                    if received >= 4 * 1024 * 1024 { started.continuation.yield(received) }
                }
                return received
            }
            var iterator = started.stream.makeAsyncIterator()
            let soFar = await iterator.next() ?? 0
            #expect(soFar >= 4 * 1024 * 1024)
            reader.cancel()
            let outcome = await reader.result
            var cancelled = false
            if case .failure(let error) = outcome { cancelled = error is CancellationError }
            #expect(cancelled, "the reader ends with CancellationError, got \(outcome)")

            // The daemon logs the request as finished, far short of the body, and holds no
            // upstream connection any more (the origin's connection was closed, not pooled).
            let logged = await eventually {
                daemon.log.split(separator: "\n").contains {
                    $0.contains(" request ") && $0.contains("error=aborted") && $0.contains("target=http://origin.internal.test:\(origin.port)")
                }
            }
            #expect(logged, "the daemon logged the aborted request")
            let released = try await eventually {
                let counters = try await client.status().counters
                return counters["upstream_connections_open"] == 0 && counters["requests_in_flight"] == 1
            }
            #expect(released, "no upstream connection remains open")
            let line = daemon.log.split(separator: "\n").last { $0.contains("target=http://origin.internal.test:\(origin.port)") }
            print("daemon log for the cancelled request: \(line ?? "none")")
            let total = try await client.status().counters["bytes_from_upstream"] ?? 0
            #expect(total < 1024 * 1024 * 1024, "the daemon stopped pulling from the origin (\(total) bytes)")
        }
    }

    @Test("cancelling while waiting for the head ends the call at once with CancellationError")
    func cancelBeforeHead() async throws {
        let origin = try await TestOrigin.start(name: "slow")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { daemon, client in
            let started = ContinuousClock.now
            let waiting = Task {
                try await client.send(BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/slow-head/3000")))
            }
            try await Task.sleep(for: .milliseconds(300))
            waiting.cancel()
            let outcome = await waiting.result
            var cancelled = false
            if case .failure(let error) = outcome { cancelled = error is CancellationError }
            #expect(cancelled, "got \(outcome)")
            #expect(ContinuousClock.now - started < .seconds(2))
            // What the daemon does with the upstream request whose client left before the head.
            _ = await eventually(seconds: 5) { daemon.log.contains("target=http://origin.internal.test:\(origin.port)") }
            let line = daemon.log.split(separator: "\n").last { $0.contains("target=http://origin.internal.test:\(origin.port)") }
            print("daemon log for the request cancelled before its head: \(line ?? "none yet")")
        }
    }

    @Test("a response dropped unread closes its connection")
    func droppedResponse() async throws {
        let origin = try await TestOrigin.start(name: "dropped")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { _, client in
            do {
                let response = try await client.send(BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/bytes/\(64 * 1024 * 1024 * 1024)")))
                #expect(response.status == 200)
            }
            let released = try await eventually {
                let counters = try await client.status().counters
                return counters["upstream_connections_open"] == 0 && counters["requests_in_flight"] == 1
            }
            #expect(released, "the daemon let go of the upstream request")
        }
    }
}
