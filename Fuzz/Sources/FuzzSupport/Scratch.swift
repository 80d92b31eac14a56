import Foundation

/// A private directory for one fuzzing process's files (a trust store per input), removed
/// and made again empty on `reset()` so that every input starts from the same state and a
/// crash reproduces from its input alone.
package final class ScratchDirectory: Sendable {
    package let path: String

    package init(label: String) {
        self.path = NSTemporaryDirectory() + "/authbroker-\(label)-\(getpid())"
        self.reset()
    }

    package func reset() {
        try? FileManager.default.removeItem(atPath: self.path)
        try? FileManager.default.createDirectory(atPath: self.path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    package func file(_ name: String) -> String { self.path + "/" + name }
}
