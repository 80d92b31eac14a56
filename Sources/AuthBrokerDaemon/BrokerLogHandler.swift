import Foundation
import Logging

/// Writes one line per log event to stderr: `LEVEL message key=value ...`.
///
/// Under systemd (`JOURNAL_STREAM` set) each line starts with the syslog priority in angle
/// brackets, which journald turns into the entry's priority (sd-daemon(3)), and the timestamp
/// is left to the journal.
package struct BrokerLogHandler: LogHandler {
    package var metadata: Logger.Metadata = [:]
    package var logLevel: Logger.Level
    private let label: String
    private let forJournal: Bool

    package init(label: String, level: Logger.Level, forJournal: Bool) {
        self.label = label
        self.logLevel = level
        self.forJournal = forJournal
    }

    package subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { self.metadata[key] }
        set { self.metadata[key] = newValue }
    }

    package func log(event: LogEvent) {
        var merged = self.metadata
        if let extra = event.metadata {
            merged.merge(extra) { _, new in new }
        }
        var line = ""
        if self.forJournal {
            line += "<\(Self.syslogPriority(event.level))>"
        } else {
            line += Self.utcTimestamp()
            line += " "
        }
        line += "\(event.level.rawValue.uppercased()) \(event.message)"
        for key in merged.keys.sorted() {
            line += " \(key)=\(Self.quoted("\(merged[key] ?? "")"))"
        }
        line += "\n"
        FileHandle.standardError.write(Data(line.utf8))
    }

    /// RFC 3339 UTC to the second, formatted by hand: the ISO-8601 formatter this replaced cost
    /// a fifth of the daemon's CPU under load (bench-results/PROFILE.md).
    static func utcTimestamp() -> String {
        var now = time(nil)
        var parts = tm()
        gmtime_r(&now, &parts)
        func pad(_ value: Int32) -> String { value < 10 ? "0\(value)" : String(value) }
        return "\(parts.tm_year + 1900)-\(pad(parts.tm_mon + 1))-\(pad(parts.tm_mday))T"
            + "\(pad(parts.tm_hour)):\(pad(parts.tm_min)):\(pad(parts.tm_sec))Z"
    }

    private static func quoted(_ value: String) -> String {
        if !value.isEmpty, !value.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" || $0.isNewline }) {
            return value
        }
        let escaped = value.replacingOccurrences(of: "\\", with: "\\\\")
            .replacingOccurrences(of: "\"", with: "\\\"")
            .replacingOccurrences(of: "\n", with: "\\n")
        return "\"\(escaped)\""
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
