import AuthBrokerCore
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The few POSIX file operations the encrypted file store needs, each failing with a
/// `SecretStoreError` that names the path and the step.
enum FileIO {
    static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }

    /// Creates `directory` (and missing parents) with mode 0700, or checks the existing one: a
    /// real directory of the user's that nobody else can write, and 0700 under the `/tmp`
    /// fallback, where another user could have made it first.
    static func makeDirectory(_ directory: String) throws(SecretStoreError) {
        let fallbackRoot = BrokerPaths.fallbackDirectory(uid: geteuid(), environment: ProcessInfo.processInfo.environment)
        do {
            try PrivateFiles.ensureDirectory(directory, what: "the directory", fallbackRoot: fallbackRoot)
        } catch {
            throw SecretStoreError(error.kind == .io ? .io : .permission, error.description)
        }
    }

    /// The whole content of the file at `path`, or nil when it does not exist.
    ///
    /// Refuses a symlink, something that is not a regular file, a file owned by someone else,
    /// or one that group or others may read (secrets or a key must stay private).
    /// `requirePrivate: false` skips the owner and mode checks (a systemd credential belongs to
    /// the service manager's choice of owner).
    static func readPrivateFile(_ path: String, what: String, maxBytes: Int, requirePrivate: Bool = true) throws(SecretStoreError) -> [UInt8]? {
        do {
            return try PrivateFiles.readOwnedFile(
                path, what: "the \(what)", maxBytes: maxBytes, forbiddenModeBits: 0o077, requireOwnership: requirePrivate
            )
        } catch {
            switch error.kind {
            case .untrusted: throw SecretStoreError(.permission, error.description)
            case .io: throw SecretStoreError(.io, error.description)
            case .tooLarge: throw SecretStoreError(.corrupt, error.description)
            }
        }
    }

    /// Writes `bytes` to `path` atomically (`AtomicFile.write`). With `exclusive`, an existing
    /// `path` is kept and false is returned.
    @discardableResult
    static func writeAtomically(_ bytes: [UInt8], to path: String, what: String, exclusive: Bool = false) throws(SecretStoreError) -> Bool {
        do {
            return try AtomicFile.write(bytes, to: path, exclusive: exclusive)
        } catch {
            throw SecretStoreError(
                .io,
                "Cannot save the \(what) \(path) (\(error.description)). Check the permissions and free space of \(AtomicFile.directory(of: path)); the old file was not changed."
            )
        }
    }

    /// Runs `body` under an exclusive `flock` on `path` (created 0600). The kernel releases the
    /// lock when the holder's file is closed or its process dies, so a lock file left behind by
    /// a crashed writer never blocks anyone.
    static func withExclusiveLock<Result>(
        path: String,
        timeout: Duration,
        _ body: () throws(SecretStoreError) -> Result
    ) throws(SecretStoreError) -> Result {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else {
            let code = errno
            throw SecretStoreError(.io, "Cannot open the lock file \(path): \(errorText(code)). Check the permissions of its directory.")
        }
        defer { close(fd) }  // closing releases the lock
        let clock = ContinuousClock()
        let deadline = clock.now.advanced(by: timeout)
        var pause: UInt32 = 1_000
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            let code = errno
            if code == EINTR { continue }
            guard code == EWOULDBLOCK else {
                throw SecretStoreError(.io, "Cannot lock \(path): \(errorText(code)).")
            }
            guard clock.now < deadline else {
                throw SecretStoreError(
                    .busy,
                    "Another writer has held the lock \(path) for longer than \(timeout). Check for a stuck authbrokerd or authbrokerctl (fuser '\(path)'), stop it, and try again."
                )
            }
            usleep(pause)
            pause = min(pause * 2, 50_000)
        }
        return try body()
    }
}
