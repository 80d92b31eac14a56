import AuthBrokerCore
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

    /// Creates `directory` (and missing parents) with mode 0700.
    static func makeDirectory(_ directory: String) throws(SecretStoreError) {
        var info = stat()
        if stat(directory, &info) == 0 {
            guard (info.st_mode & S_IFMT) == S_IFDIR else {
                throw SecretStoreError(.io, "\(directory) is not a directory. Move it aside so the broker can create its directory there.")
            }
            return
        }
        let parent = AtomicFile.directory(of: directory)
        if parent != directory && parent != "." && parent != "/" {
            try makeDirectory(parent)
        }
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            let code = errno
            throw SecretStoreError(
                .io,
                "Cannot create the directory \(directory): \(errorText(code)). Check the permissions of \(parent)."
            )
        }
    }

    /// The whole content of the file at `path`, or nil when it does not exist.
    ///
    /// Refuses a symlink, something that is not a regular file, a file owned by someone else,
    /// or one that group or others may read (secrets or a key must stay private).
    /// `requirePrivate: false` skips the owner and mode checks (a systemd credential belongs to
    /// the service manager's choice of owner).
    static func readPrivateFile(_ path: String, what: String, maxBytes: Int, requirePrivate: Bool = true) throws(SecretStoreError) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        if fd < 0 {
            let code = errno
            if code == ENOENT { return nil }
            if code == ELOOP {
                throw SecretStoreError(.permission, "The \(what) \(path) is a symbolic link; the broker reads only a regular file there. Replace the link with the file itself.")
            }
            throw SecretStoreError(.io, "Cannot open the \(what) \(path): \(errorText(code)). Check that it is readable by you.")
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            throw SecretStoreError(.io, "Cannot examine the \(what) \(path): \(errorText(code)).")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            throw SecretStoreError(.permission, "The \(what) \(path) is not a regular file. Move it aside.")
        }
        guard !requirePrivate || info.st_uid == geteuid() else {
            throw SecretStoreError(
                .permission,
                "The \(what) \(path) belongs to uid \(info.st_uid), not to you (uid \(geteuid())). Move it aside; the broker uses only files you own."
            )
        }
        guard !requirePrivate || (info.st_mode & 0o077) == 0 else {
            throw SecretStoreError(
                .permission,
                "The \(what) \(path) has mode \(String(info.st_mode & 0o777, radix: 8)), so others may read it. Run: chmod 600 '\(path)' (and consider the secrets exposed if others did read it)."
            )
        }
        let size = Int(info.st_size)
        guard size <= maxBytes else {
            throw SecretStoreError(.corrupt, "The \(what) \(path) is \(size) bytes, more than it can be (\(maxBytes)). Move it aside (mv '\(path)' '\(path).bad').")
        }
        var bytes = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let n = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + done, size - done) }  // baseAddress: size > 0 here
            if n < 0 {
                if errno == EINTR { continue }
                let code = errno
                SecretValue.wipe(&bytes)
                throw SecretStoreError(.io, "Cannot read the \(what) \(path): \(errorText(code)).")
            }
            if n == 0 { break }
            done += n
        }
        if done < size { bytes.removeLast(size - done) }
        return bytes
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
