import AuthBrokerCore
import Foundation
import Logging
import NIOConcurrencyHelpers

/// What names one stored password: its origin, realm (nil: any realm there) and user.
package struct PasswordKey: Hashable, Sendable {
    package var origin: CanonicalOrigin
    package var realm: String?
    package var user: String

    package init(origin: CanonicalOrigin, realm: String?, user: String) {
        self.origin = origin
        self.realm = realm
        self.user = user
    }
}

/// One set of password marks (refused, or Digest-only) and the file that keeps it across
/// restarts (nil: memory only).
///
/// The set changes in memory, under a short lock that readers take too. The file is rewritten
/// by a `BackgroundWriter`, never on the thread that changed the set (an event loop, when a
/// server refuses a password): through `AtomicFile` (a 0600 temporary file, `fsync`, `rename`:
/// never half a file), one write at a time, each with the whole set as it was when the write
/// began, so the file always ends up holding the latest set (no change lost to a write that
/// finished late). Read with `PrivateFiles` (never through a symlink, only a file of the user's
/// that nobody else may write); a file that cannot be read starts an empty set, which the next
/// change writes over.
package final class MarkFile: Sendable {
    /// Largest file read at start-up: some hundred thousand marks.
    static let maxFileBytes = 16 << 20

    /// A mark as kept on disk.
    private struct Record: Codable {
        var url: String
        var realm: String?
        var user: String
    }

    package let path: String?
    private let keys: NIOLockedValueBox<Set<PasswordKey>>
    private let writer: BackgroundWriter<Set<PasswordKey>>?

    /// Reads the marks at `path` (`what` names them in messages); a missing or unreadable file
    /// starts empty, and `logger` says why it could not be read, and when a write fails.
    package init(path: String?, what: String, logger: Logger?) {
        self.path = path
        guard let path else {
            self.keys = NIOLockedValueBox([])
            self.writer = nil
            return
        }
        self.keys = NIOLockedValueBox(Self.read(path: path, what: what, logger: logger))
        self.writer = BackgroundWriter(
            label: "authbrokerd.marks", initial: [], take: { $0 },
            write: { keys in
                // Plain strings always encode; were one not to, the file is left as it is.
                guard let bytes = Self.encode(keys) else { return }
                do throws(AtomicFile.Failure) {
                    try AtomicFile.write(bytes, to: path)
                } catch {
                    logger?.warning(
                        "cannot save \(what); the change holds until the daemon stops",
                        metadata: ["path": "\(path)", "error": "\(error.description)"]
                    )
                }
            }
        )
    }

    package func contains(_ key: PasswordKey) -> Bool { self.keys.withLockedValue { $0.contains(key) } }

    package var all: Set<PasswordKey> { self.keys.withLockedValue { $0 } }

    /// Changes the marks and, when they changed, has the file rewritten (soon, off this thread).
    package func update(_ change: (inout Set<PasswordKey>) -> Void) {
        self.keys.withLockedValue { keys in
            let before = keys
            change(&keys)
            guard keys != before, let writer = self.writer else { return }
            // Handed over under the lock, so that the writer gets the sets in the order they were made.
            writer.submit { pending in
                pending = keys
                return .soon
            }
        }
    }

    /// Writes the latest set before it returns, when it is not written yet (the daemon calls it
    /// when it stops).
    package func flush() {
        self.writer?.flush()
    }

    /// The file's contents, as the broker has always written them: a JSON array of
    /// `{url, realm, user}`, sorted.
    static func encode(_ keys: Set<PasswordKey>) -> [UInt8]? {
        let records = keys.map { Record(url: $0.origin.description, realm: $0.realm, user: $0.user) }
            .sorted { ($0.url, $0.user, $0.realm ?? "") < ($1.url, $1.user, $1.realm ?? "") }
        return (try? JSONEncoder().encode(records)).map { [UInt8]($0) }
    }

    /// The marks in `bytes`; nil when they are not a list of marks. A mark whose URL is no
    /// longer a valid origin is left out.
    static func decode(_ bytes: [UInt8]) -> Set<PasswordKey>? {
        guard let records = try? JSONDecoder().decode([Record].self, from: Data(bytes)) else { return nil }
        return Set(
            records.compactMap { record -> PasswordKey? in
                guard let origin = try? CanonicalOrigin(parsing: record.url) else { return nil }
                return PasswordKey(origin: origin, realm: record.realm, user: record.user)
            }
        )
    }

    private static func read(path: String, what: String, logger: Logger?) -> Set<PasswordKey> {
        let bytes: [UInt8]
        do {
            guard let read = try PrivateFiles.readOwnedFile(path, what: what, maxBytes: Self.maxFileBytes) else { return [] }
            bytes = read
        } catch {
            logger?.warning("cannot read \(what); starting without them", metadata: ["error": "\(error.description)"])
            return []
        }
        guard let keys = Self.decode(bytes) else {
            logger?.warning("cannot read \(what): the file is not a list of marks; starting without them", metadata: ["path": "\(path)"])
            return []
        }
        return keys
    }
}
