import AuthBrokerDaemon
import Foundation
import Logging
import NIOConcurrencyHelpers
import TestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The log output behind `BrokerLogHandler`, on a real pipe.
@Suite("BatchedLogOutput")
struct BatchedLogOutputTests {
    /// Reads what is in the pipe now, without waiting.
    private func available(_ fd: CInt) -> String {
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            bytes += chunk[0..<count]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    @Test func batchedLinesWaitAndKeepTheirOrder() async throws {
        var fds: [CInt] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer {
            close(fds[0])
            close(fds[1])
        }
        _ = fcntl(fds[0], F_SETFL, O_NONBLOCK)
        let output = BatchedLogOutput(fileDescriptor: fds[1])

        output.writeBatched("access 1\n")
        output.writeBatched("access 2\n")
        #expect(available(fds[0]) == "", "batched lines are not written at once")
        output.write("warning\n")
        #expect(available(fds[0]) == "access 1\naccess 2\nwarning\n", "an unbatched line writes the batch first, in order")

        output.writeBatched("access 3\n")
        var seen = ""
        for _ in 0..<200 where seen.isEmpty {
            try await Task.sleep(for: .milliseconds(10))
            seen = available(fds[0])
        }
        #expect(seen == "access 3\n", "a batched line is written by the flush timer without another line")

        output.writeBatched("access 4\n")
        output.flush()
        #expect(available(fds[0]) == "access 4\n")
    }

    @Test("a write that fails is reported with the number of lines lost; the next batch is tried again")
    func failedWriteReported() throws {
        let readOnly = open("/dev/null", O_RDONLY)
        #expect(readOnly >= 0)
        defer { close(readOnly) }
        let failures = NIOLockedValueBox<[BatchedLogOutput.WriteFailure]>([])
        let output = BatchedLogOutput(fileDescriptor: readOnly) { failure in failures.withLockedValue { $0.append(failure) } }
        output.writeBatched("one\n")
        output.writeBatched("two\n")
        output.writeBatched("three\n")
        output.flush()
        output.write("four\n")
        let seen = failures.withLockedValue { $0 }
        #expect(seen.map(\.code) == [EBADF, EBADF])
        #expect(seen.map(\.lines) == [3, 1])
    }

    @Test("lines batched on many threads while others are written at once come out whole, each thread's in order")
    func concurrentLinesStayWhole() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let fd = open(directory + "/log", O_WRONLY | O_CREAT | O_APPEND, 0o600)
        #expect(fd >= 0)
        let output = BatchedLogOutput(fileDescriptor: fd, closesDescriptor: true)
        let perThread = 2000
        onThreads(4) { thread in
            for index in 0..<perThread {
                let line = "thread \(thread) line \(index) x" + String(repeating: "x", count: index % 97) + "\n"
                if index % 500 == 0 { output.write(line) } else { output.writeBatched(line) }
            }
        }
        output.flush()
        let text = try String(contentsOfFile: directory + "/log", encoding: .utf8)
        var next = [Int](repeating: 0, count: 4)
        for line in text.split(separator: "\n") {
            let words = line.split(separator: " ")
            let thread = try #require(Int(words[1]))
            #expect(words.count == 5 && Int(words[3]) == next[thread] && words[4].count == next[thread] % 97 + 1, "\(line)")
            next[thread] += 1
        }
        #expect(next == [Int](repeating: perThread, count: 4))
    }
}

@Suite("Log line format")
struct LogLineFormatTests {
    @Test func keysSortedAndValuesQuotedOnlyWhenNeeded() {
        let line = BrokerLogHandler.line(
            level: .info, message: "request",
            metadata: ["status": "200", "target": "https://a.test:443", "error": "two words", "note": "a=b"],
            prefix: "T "
        )
        #expect(line == "T INFO request error=\"two words\" note=\"a=b\" status=200 target=https://a.test:443\n")
    }

    /// The access line is formatted straight from its fields; it must read exactly as the
    /// general path would write the same fields as metadata.
    @Test(
        "an access line reads as the general path writes it",
        arguments: [
            AccessLine(bytes: 100, durationMilliseconds: 0, error: nil, method: "GET", requestID: "00ab", status: 200, target: "http://a.test:80"),
            AccessLine(bytes: 0, durationMilliseconds: 30_001, error: "http_response_timeout", method: "HEAD", requestID: "ff", status: 504, target: "https://[::1]:8443"),
            AccessLine(bytes: -1, durationMilliseconds: -5, error: "two words", method: "M=\"x\"\n", requestID: "", status: 0, target: "a\u{2028}b\\"),
            // Longer than a small string, with a byte to quote only at its end, and bridged-free.
            AccessLine(bytes: Int.max, durationMilliseconds: Int64.min, error: "e\u{85}", method: "PROPFIND", requestID: String(repeating: "a", count: 40), status: 999, target: "https://a-rather-long-host-name.example.test:8443 "),
        ]
    )
    func accessLineMatchesTheGeneralFormat(_ access: AccessLine) {
        var line = Array("T ".utf8)
        access.append(to: &line)
        #expect(String(decoding: line, as: UTF8.self) == BrokerLogHandler.line(level: .info, message: BrokerLogHandler.accessLineMessage, metadata: access.metadata, prefix: "T "))
    }

    @Test func hostileValuesStayOnOneLine() {
        let line = BrokerLogHandler.line(
            level: .warning, message: "x", metadata: ["v": "a\nb \"c\" \\d", "empty": ""], prefix: ""
        )
        #expect(line == "WARNING x empty=\"\" v=\"a\\nb \\\"c\\\" \\\\d\"\n")
        #expect(line.utf8.filter { $0 == UInt8(ascii: "\n") }.count == 1)
    }

    @Test func plainAndNonASCIIValues() {
        #expect(BrokerLogHandler.quoted("plain-value_1") == "plain-value_1")
        #expect(BrokerLogHandler.quoted("") == "\"\"")
        #expect(BrokerLogHandler.quoted("tab\there") == "\"tab\there\"")
        // A line or paragraph separator is quoted; so may be other non-ASCII text (harmless).
        #expect(BrokerLogHandler.quoted("a\u{2028}b").hasPrefix("\""))
    }
}
