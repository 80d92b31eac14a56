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
            line += ISO8601DateFormatter.string(from: Date(), timeZone: .current, formatOptions: [.withInternetDateTime])
            line += " "
        }
        line += "\(event.level.rawValue.uppercased()) \(event.message)"
        for key in merged.keys.sorted() {
            line += " \(key)=\(Self.quoted("\(merged[key] ?? "")"))"
        }
        line += "\n"
        FileHandle.standardError.write(Data(line.utf8))
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
