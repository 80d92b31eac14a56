import Foundation

/// One client process, as the daemon tells it apart from others: its uid, its pid, the time it
/// started, and its executable, so that a pid reused by a later process, or a process that
/// has exec'd another program, is a different peer (and has no grant of the first).
package struct PeerIdentity: Hashable, Sendable, CustomStringConvertible {
    package var uid: UInt32
    package var pid: Int32
    /// When the process started, in clock ticks since boot (`/proc/<pid>/stat` field 22).
    package var startTime: UInt64
    /// `/proc/<pid>/exe` (nil when it cannot be read, e.g. a kernel thread or a gone process).
    package var executable: String?

    package init(uid: UInt32, pid: Int32, startTime: UInt64, executable: String? = nil) {
        self.uid = uid
        self.pid = pid
        self.startTime = startTime
        self.executable = executable
    }

    /// The peer with this uid and pid, its start time read from `/proc/<pid>/stat` and its
    /// executable from `/proc/<pid>/exe`; nil when the process is gone or the file cannot be
    /// parsed.
    /// - Warning: read it right after taking uid and pid from `SO_PEERCRED` (at accept), so the
    ///   pid still names the peer.
    package static func read(uid: UInt32, pid: Int32) -> PeerIdentity? {
        guard pid > 0, let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let startTime = Self.startTime(statLine: stat)
        else { return nil }
        let executable = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/exe")
        return PeerIdentity(uid: uid, pid: pid, startTime: startTime, executable: executable)
    }

    /// Field 22 (`starttime`) of a `/proc/<pid>/stat` line (proc(5)). The command name in
    /// field 2 may hold spaces and parentheses, so fields are counted after its last ')'.
    package static func startTime(statLine: String) -> UInt64? {
        guard let close = statLine.lastIndex(of: ")") else { return nil }
        let fields = statLine[statLine.index(after: close)...].split(separator: " ", omittingEmptySubsequences: true)
        // After ')', fields[0] is field 3 (state), so field 22 is fields[19].
        guard fields.count > 19 else { return nil }
        return UInt64(fields[19].trimmingCharacters(in: .whitespacesAndNewlines))
    }

    package var description: String {
        "uid \(self.uid) pid \(self.pid) started \(self.startTime) executable \(self.executable ?? "-")"
    }
}
