import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// Writes one line per log event to stderr: `LEVEL message key=value ...`.
///
/// The per-request access line (`accessLineMessage` at info) is batched: written with the next
/// other line, or within `BatchedLogOutput.flushDelay`, so a busy daemon makes a few writes a
/// second instead of one per request. Every other line is written at once.
///
/// Under systemd (`JOURNAL_STREAM` set) each line starts with the syslog priority in angle
/// brackets, which journald turns into the entry's priority (sd-daemon(3)), and the timestamp
/// is left to the journal.
package struct BrokerLogHandler: LogHandler {
    package var metadata: Logger.Metadata = [:]
    package var logLevel: Logger.Level
    private let label: String
    private let forJournal: Bool

    /// The message of the one info line per request (`ClientConnectionServer`).
    package static let accessLineMessage: Logger.Message = "request"

    package init(label: String, level: Logger.Level, forJournal: Bool) {
        self.label = label
        self.logLevel = level
        self.forJournal = forJournal
    }

    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    /// Whether `logAccess` writes what `log` would: this handler's own metadata is at most the
    /// request id (always, in the daemon), which the access line carries itself.
    package var logsAccessDirectly: Bool {
        self.metadata.isEmpty || (self.metadata.count == 1 && self.metadata["request_id"] != nil)
    }

    /// Writes one access line straight from its fields (when `logsAccessDirectly`): the general
    /// path's metadata dictionaries, merge and sort were a twentieth of the daemon's CPU per
    /// relayed request.
    package func logAccess(_ access: AccessLine) {
        let timestamp = self.forJournal ? nil : Self.utcTimestamp()
        // Formatted straight into the batch: a buffer of its own per line was an allocation and
        // a copy per request.
        BatchedLogOutput.standardError.writeBatched { batch in
            if let timestamp {
                batch.append(contentsOf: timestamp.utf8)
                batch.append(UInt8(ascii: " "))
            } else {
                batch.append(contentsOf: Self.journalInfoPrefix.utf8)
            }
            access.append(to: &batch)
        }
    }

    private static let journalInfoPrefix = "<\(syslogPriority(.info))>"

    package func log(event: LogEvent) {
        var merged = self.metadata
        if let extra = event.metadata {
            merged.merge(extra) { _, new in new }
        }
        let line = Self.line(
            level: event.level, message: event.message, metadata: merged,
            prefix: self.forJournal ? "<\(Self.syslogPriority(event.level))>" : Self.utcTimestamp() + " "
        )
        if event.level == .info && event.message == Self.accessLineMessage {
            BatchedLogOutput.standardError.writeBatched(line)
        } else {
            BatchedLogOutput.standardError.write(line)
        }
    }

    /// One line: `prefix LEVEL message key=value ...` with the keys sorted, values quoted when
    /// they hold a space, tab, quote, `=` or line break (and `\`, `"` and newline then escaped).
    package static func line(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata, prefix: String) -> String {
        var line = prefix
        line += level.rawValue.uppercased()
        line += " "
        line += message.description
        for key in metadata.keys.sorted() {
            line += " "
            line += key
            line += "="
            line += Self.quoted(metadata[key].map { "\($0)" } ?? "")
        }
        line += "\n"
        return line
    }

    /// RFC 3339 UTC to the second, formatted by hand: the ISO-8601 formatter this replaced cost
    /// a fifth of the daemon's CPU under load (bench-results/PROFILE.md).
    static func utcTimestamp() -> String {
        var now = time(nil)
        let cache: TimestampCache
        if let existing = Self.timestampCache.currentValue {
            cache = existing
        } else {
            cache = TimestampCache()
            Self.timestampCache.currentValue = cache
        }
        if cache.second == now { return cache.text }
        cache.second = now
        cache.text = Self.format(&now)
        return cache.text
    }

    /// The last timestamp each thread formatted: a busy daemon logs many lines a second.
    private static let timestampCache = ThreadSpecificVariable<TimestampCache>()

    private static func format(_ now: inout time_t) -> String {
        var parts = tm()
        gmtime_r(&now, &parts)
        func pad(_ value: Int32) -> String { value < 10 ? "0\(value)" : String(value) }
        return "\(parts.tm_year + 1900)-\(pad(parts.tm_mon + 1))-\(pad(parts.tm_mday))T"
            + "\(pad(parts.tm_hour)):\(pad(parts.tm_min)):\(pad(parts.tm_sec))Z"
    }

    package static func quoted(_ value: String) -> String {
        Self.needsQuotes(value) ? Self.escapedInQuotes(value) : value
    }

    /// `value` in quotes, with `\\`, `"` and newline escaped.
    private static func escapedInQuotes(_ value: String) -> String {
        let escaped = value.replacingOccurrences(of: "\\", with: "\\\\")
            .replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
        return "\"\(escaped)\""
    }

    /// Whether `value` is written quoted: empty, or holding a space, quote, `=`, tab or line break.
    static func needsQuotes(_ value: String) -> Bool {
        // Bytes, not Characters: grapheme breaking on every value of every line was measurable.
        // Tab and the newlines: ASCII LF, VT, FF, CR, NEL (U+0085, C2 85) and U+2028/2029 (E2 80 A8/A9).
        func needsQuotes(_ byte: UInt8) -> Bool {
            byte == UInt8(ascii: " ") || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "=")
                || (0x09...0x0D).contains(byte) || byte == 0x85 || byte == 0xA8 || byte == 0xA9
        }
        if value.isEmpty { return true }
        // In place where the string has its bytes contiguous (native and small strings do).
        let inPlace = value.utf8.withContiguousStorageIfAvailable { bytes in
            for byte in bytes where needsQuotes(byte) { return true }
            return false
        }
        return inPlace ?? value.utf8.contains(where: needsQuotes)
    }

    /// `quoted(value)`, appended as bytes.
    static func appendQuoted(_ value: String, to line: inout [UInt8]) {
        if Self.needsQuotes(value) {
            line.append(contentsOf: Self.escapedInQuotes(value).utf8)
        } else {
            line.append(contentsOf: value.utf8)
        }
    }

    private static func syslogPriority(_ level: Logger.Level) -> Int {
        switch level {
        case .trace, .debug: 7
        case .info: 6
        case .notice: 5
        case .warning: 4
        case .error: 3
        case .critical: 2
        }
    }
}

/// One thread's last formatted second, in `BrokerLogHandler.timestampCache`.
private final class TimestampCache: @unchecked Sendable {  // @unchecked: only its own thread uses it
    var second: time_t = -1
    var text = ""
}

/// The fields of one request's access line (`BrokerLogHandler.accessLineMessage`).
package struct AccessLine: Sendable {
    var bytes: Int
    var durationMilliseconds: Int64
    /// The broker's error code, when it answered with one.
    var error: String?
    var method: String
    var requestID: String
    var status: Int
    /// The origin only: paths and queries can carry tokens.
    var target: String

    package init(
        bytes: Int, durationMilliseconds: Int64, error: String?, method: String, requestID: String, status: Int,
        target: String
    ) {
        self.bytes = bytes
        self.durationMilliseconds = durationMilliseconds
        self.error = error
        self.method = method
        self.requestID = requestID
        self.status = status
        self.target = target
    }

    /// As swift-log metadata, for a handler that is not `BrokerLogHandler`.
    package var metadata: Logger.Metadata {
        var metadata: Logger.Metadata = [
            "bytes": "\(self.bytes)", "duration_ms": "\(self.durationMilliseconds)", "method": "\(self.method)",
            "request_id": "\(self.requestID)", "status": "\(self.status)", "target": "\(self.target)",
        ]
        if let error = self.error { metadata["error"] = "\(error)" }
        return metadata
    }

    /// `INFO request key=value ...` and a newline, as `BrokerLogHandler.line` writes `metadata`:
    /// keys in sorted order, values quoted by the same rule. Bytes, appended in place: growing a
    /// `String` piece by piece cost more than the rest of the line's work.
    package func append(to line: inout [UInt8]) {
        line.append(contentsOf: "INFO ".utf8)
        line.append(contentsOf: BrokerLogHandler.accessLineMessage.description.utf8)
        line.append(contentsOf: " bytes=".utf8)
        line.append(contentsOf: String(self.bytes).utf8)
        line.append(contentsOf: " duration_ms=".utf8)
        line.append(contentsOf: String(self.durationMilliseconds).utf8)
        if let error = self.error {
            line.append(contentsOf: " error=".utf8)
            BrokerLogHandler.appendQuoted(error, to: &line)
        }
        line.append(contentsOf: " method=".utf8)
        BrokerLogHandler.appendQuoted(self.method, to: &line)
        line.append(contentsOf: " request_id=".utf8)
        BrokerLogHandler.appendQuoted(self.requestID, to: &line)
        line.append(contentsOf: " status=".utf8)
        line.append(contentsOf: String(self.status).utf8)
        line.append(contentsOf: " target=".utf8)
        BrokerLogHandler.appendQuoted(self.target, to: &line)
        line.append(UInt8(ascii: "\n"))
    }
}

/// A file descriptor that takes some lines at once and batches others (`writeBatched`), keeping
/// the order in which they were logged.
///
/// Batched lines are written by a `BackgroundWriter`, never on the thread that logs them (an
/// event loop, mostly): within `flushDelay`, at once when `maxPending` bytes wait, and by the
/// caller itself only when the output has fallen `maxQueued` bytes behind (then it waits, rather
/// than lose lines or let them grow without bound). `write` and `flush` write on the caller's
/// thread, after every line before them.
package final class BatchedLogOutput: Sendable {
    package static let standardError = BatchedLogOutput(fileDescriptor: 2, label: "authbrokerd.stderr")
    /// How long a batched line may wait to be written.
    static let flushDelay: DispatchTimeInterval = .milliseconds(100)
    /// Batched bytes written at once when reached, without waiting for the delay.
    static let maxPending = 32 * 1024
    /// Batched bytes beyond which the caller writes them itself.
    static let maxQueued = 1 << 20

    /// A write that failed: the `errno`, and how many lines were lost with it.
    package struct WriteFailure: Sendable {
        package var code: Int32
        package var lines: Int
    }

    private let writer: BackgroundWriter<[UInt8]>

    /// - Parameters:
    ///   - closesDescriptor: the output owns `fileDescriptor` and closes it once everything
    ///     batched has been written and the output is gone.
    ///   - onFailure: told (on the writing thread) when a write fails; its lines are lost,
    ///     later ones are tried again. It must not write to this output.
    package init(
        fileDescriptor: CInt, label: String = "authbrokerd.log", closesDescriptor: Bool = false,
        onFailure: (@Sendable (WriteFailure) -> Void)? = nil
    ) {
        let descriptor = Descriptor(fileDescriptor, closes: closesDescriptor)
        self.writer = BackgroundWriter(
            label: label, initial: [],
            take: { pending in
                defer { pending = [] }
                return pending
            },
            write: { bytes in
                if let failure = descriptor.writeAll(bytes) { onFailure?(failure) }
            }
        )
    }

    /// Writes `line` after every batched line.
    package func write(_ line: String) {
        self.writer.submit { pending in
            pending.append(contentsOf: line.utf8)
            return .now
        }
    }

    /// Adds `line` to the batch: written with the next `write`, when the batch is full, or after
    /// `flushDelay`.
    package func writeBatched(_ line: String) {
        self.writeBatched { $0.append(contentsOf: line.utf8) }
    }

    /// `writeBatched` for a line `format` appends to the batch itself (the access line), under
    /// the batch's lock; it must append one whole line and nothing else.
    package func writeBatched(_ format: (inout [UInt8]) -> Void) {
        self.writer.submit { pending in
            if pending.isEmpty { pending.reserveCapacity(Self.maxPending) }
            format(&pending)
            if pending.count >= Self.maxQueued { return .now }
            return pending.count >= Self.maxPending ? .soon : .within(Self.flushDelay)
        }
    }

    /// Writes every batched line before it returns.
    package func flush() {
        self.writer.flush()
    }
}

/// The descriptor a `BatchedLogOutput` writes to, closed with the last reference to it when
/// the output owns it (the writer's queued work holds one until it has run).
private final class Descriptor: Sendable {
    let fd: CInt
    let closes: Bool

    init(_ fd: CInt, closes: Bool) {
        self.fd = fd
        self.closes = closes
    }

    deinit {
        if self.closes { _ = close(self.fd) }
    }

    /// Writes all of `bytes`; on failure, what failed and how many lines were not written whole.
    func writeAll(_ bytes: [UInt8]) -> BatchedLogOutput.WriteFailure? {
        guard !bytes.isEmpty else { return nil }
        return bytes.withUnsafeBytes { buffer -> BatchedLogOutput.WriteFailure? in
            var offset = 0
            while offset < buffer.count {
                let written = Glibc.write(self.fd, buffer.baseAddress! + offset, buffer.count - offset)  // non-empty: checked above
                if written > 0 {
                    offset += written
                } else if written < 0 && errno == EINTR {
                    continue
                } else {
                    let code = written < 0 ? errno : EIO
                    // The lines not written whole: one per newline not yet written.
                    let lost = buffer[offset...].reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
                    return BatchedLogOutput.WriteFailure(code: code, lines: lost)
                }
            }
            return nil
        }
    }
}
