#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Why a directory or file the broker keeps its state in cannot be trusted or used; the message
/// says what was found and what to do.
package struct PrivateFileError: Error, Sendable, CustomStringConvertible {
    package enum Kind: Sendable, Equatable {
        /// Not what it must be (a symlink, another user's, writable by others): possibly planted.
        case untrusted
        /// The system refused (permissions, disk, ...).
        case io
        /// Larger than the caller accepts.
        case tooLarge
    }

    package var kind: Kind
    package var description: String

    package init(_ kind: Kind, _ description: String) {
        self.kind = kind
        self.description = description
    }
}

/// The checks that keep another local user from planting or redirecting the broker's state.
///
/// Another user can create names in `/tmp` (the fallback when the XDG directories are missing),
/// so nothing the broker reads or writes may be taken on trust from its name alone: directories
/// are examined with `lstat` (a symlink is refused, never followed) and must belong to the user;
/// files are opened with `O_NOFOLLOW` and examined through the open descriptor (no window
/// between the check and the use).
package enum PrivateFiles {
    /// What a directory must be beyond "a real directory owned by the user".
    package enum DirectoryRule: Sendable {
        /// Mode 0700: nobody else may even list it (the `/tmp/authbroker-<uid>` fallback and
        /// everything under it).
        case privateToUser
        /// Nobody else may write in it (a directory the user chose, like `$HOME/.local/state`).
        case notWritableByOthers
    }

    /// Makes sure `path` is a real directory that belongs to the user, creating it (mode 0700,
    /// with missing parents) when absent. An existing directory is checked, never changed.
    ///
    /// When `path` is `fallbackRoot` or below it, the root is checked first with the
    /// `privateToUser` rule: a symlink or another user's directory planted at
    /// `/tmp/authbroker-<uid>` stops everything under it.
    package static func ensureDirectory(_ path: String, what: String, fallbackRoot: String?) throws(PrivateFileError) {
        var rule = DirectoryRule.notWritableByOthers
        if let fallbackRoot, path == fallbackRoot || path.hasPrefix(fallbackRoot.hasSuffix("/") ? fallbackRoot : fallbackRoot + "/") {
            rule = .privateToUser
            if path != fallbackRoot {
                try ensureDirectory(fallbackRoot, what: "the broker's private directory", rule: .privateToUser)
            }
        }
        try ensureDirectory(path, what: what, rule: rule)
    }

    /// `ensureDirectory` for one directory and rule.
    package static func ensureDirectory(_ path: String, what: String, rule: DirectoryRule) throws(PrivateFileError) {
        var info = stat()
        if lstat(path, &info) != 0 {
            guard errno == ENOENT else {
                let code = errno
                throw PrivateFileError(.io, "Cannot examine \(what) \(path): \(errorText(code)).")
            }
            try makeDirectories(path, what: what)
            guard lstat(path, &info) == 0 else {
                let code = errno
                throw PrivateFileError(.io, "Cannot examine \(what) \(path) after creating it: \(errorText(code)).")
            }
        }
        try check(info, path: path, what: what, rule: rule)
    }

    /// The whole content of `path`, or nil when there is no such file.
    ///
    /// Opened with `O_NOFOLLOW`, then checked through the descriptor: a regular file, owned by
    /// the user, with none of the `forbiddenModeBits` (0o022: nobody else may have written it;
    /// 0o077: nobody else may read it either). `requireOwnership: false` keeps only the
    /// symlink and regular-file checks (for a file whose owner another program chose).
    package static func readOwnedFile(
        _ path: String, what: String, maxBytes: Int, forbiddenModeBits: UInt32 = 0o022, requireOwnership: Bool = true
    ) throws(PrivateFileError) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK)
        if fd < 0 {
            let code = errno
            if code == ENOENT { return nil }
            if code == ELOOP {
                throw PrivateFileError(
                    .untrusted,
                    "\(capitalized(what)) \(path) is a symbolic link; the broker reads only a regular file there. Replace the link with the file itself (or move it aside if you did not make it)."
                )
            }
            throw PrivateFileError(.io, "Cannot open \(what) \(path): \(errorText(code)). Check that it is readable by you.")
        }
        defer { close(fd) }
        let info = try checkOpenFile(fd, path: path, what: what, forbiddenModeBits: forbiddenModeBits, requireOwnership: requireOwnership)
        let size = Int(info.st_size)
        guard size <= maxBytes else {
            throw PrivateFileError(.tooLarge, "\(capitalized(what)) \(path) is \(size) bytes, more than it can be (\(maxBytes)). Move it aside (mv '\(path)' '\(path).bad').")
        }
        var bytes = [UInt8](repeating: 0, count: size)
        var done = 0
        while done < size {
            let n = bytes.withUnsafeMutableBytes { read(fd, $0.baseAddress! + done, size - done) }  // baseAddress: size > 0 here
            if n < 0 {
                if errno == EINTR { continue }
                let code = errno
                bytes.withUnsafeMutableBytes { _ = memset($0.baseAddress!, 0, size) }  // baseAddress: size > 0 here
                throw PrivateFileError(.io, "Cannot read \(what) \(path): \(errorText(code)).")
            }
            if n == 0 { break }
            done += n
        }
        if done < size { bytes.removeLast(size - done) }
        return bytes
    }

    /// A descriptor open for appending to `path` (created 0600 when missing), never through a
    /// symbolic link, on a regular file that belongs to the user and nobody else may write
    /// (with `secret`: nor read).
    package static func openForAppending(_ path: String, what: String, secret: Bool = false) throws(PrivateFileError) -> CInt {
        let fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0o600)
        if fd < 0 {
            let code = errno
            if code == ELOOP {
                throw PrivateFileError(
                    .untrusted,
                    "\(capitalized(what)) \(path) is a symbolic link; the broker writes only to a regular file there. Move the link aside (if you did not make it, someone else tried to redirect the file)."
                )
            }
            throw PrivateFileError(.io, "Cannot open \(what) \(path): \(errorText(code)). Check the permissions of its directory.")
        }
        do {
            _ = try checkOpenFile(fd, path: path, what: what, forbiddenModeBits: secret ? 0o077 : 0o022)
        } catch {
            close(fd)
            throw error
        }
        return fd
    }

    /// Opens the configuration file for reading, or nil when there is none (symlinks are followed:
    /// dotfile managers link it): a regular file owned by the user or root that nobody else may
    /// change, because it names the anchors file, the upstream proxy and the socket. A FIFO
    /// planted there fails the check instead of blocking the open.
    package static func openConfigurationFile(_ path: String) throws(PrivateFileError) -> CInt? {
        let what = "the configuration file"
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK)
        if fd < 0 {
            let code = errno
            if code == ENOENT { return nil }
            throw PrivateFileError(.io, "Cannot open \(what) \(path): \(errorText(code)). Check that it is a regular file readable by you.")
        }
        do {
            _ = try checkOpenFile(fd, path: path, what: what, forbiddenModeBits: 0o022, allowRoot: true)
        } catch {
            close(fd)
            throw error
        }
        return fd
    }

    /// Checks an open descriptor: a regular file owned by the user without `forbiddenModeBits`.
    /// (`O_NONBLOCK` at open keeps a planted FIFO from blocking the open; it is cleared here.)
    private static func checkOpenFile(
        _ fd: CInt, path: String, what: String, forbiddenModeBits: UInt32, requireOwnership: Bool = true, allowRoot: Bool = false
    ) throws(PrivateFileError) -> stat {
        var info = stat()
        guard fstat(fd, &info) == 0 else {
            let code = errno
            throw PrivateFileError(.io, "Cannot examine \(what) \(path): \(errorText(code)).")
        }
        guard (info.st_mode & S_IFMT) == S_IFREG else {
            throw PrivateFileError(.untrusted, "\(capitalized(what)) \(path) is not a regular file. Move it aside.")
        }
        guard !requireOwnership || info.st_uid == geteuid() || (allowRoot && info.st_uid == 0) else {
            throw PrivateFileError(
                .untrusted,
                "\(capitalized(what)) \(path) belongs to uid \(info.st_uid), not to you (uid \(geteuid())), so the broker does not use it: someone else may have planted it. Move it aside."
            )
        }
        guard !requireOwnership || UInt32(info.st_mode) & forbiddenModeBits == 0 else {
            let mode = String(UInt32(info.st_mode) & 0o777, radix: 8)
            let wanted = forbiddenModeBits & 0o044 != 0 ? "600" : "go-w"
            throw PrivateFileError(
                .untrusted,
                "\(capitalized(what)) \(path) has mode \(mode), so other users could \(forbiddenModeBits & 0o044 != 0 ? "read or change" : "change") it. Run: chmod \(wanted) '\(path)'."
            )
        }
        let flags = fcntl(fd, F_GETFL)
        if flags >= 0 { _ = fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) }
        return info
    }

    private static func check(_ info: stat, path: String, what: String, rule: DirectoryRule) throws(PrivateFileError) {
        let type = info.st_mode & S_IFMT
        if type == S_IFLNK {
            throw PrivateFileError(
                .untrusted,
                "\(capitalized(what)) \(path) is a symbolic link, and the broker does not follow one there: another user could point it anywhere. Remove the link (rm '\(path)'); the broker creates the directory itself."
            )
        }
        guard type == S_IFDIR else {
            throw PrivateFileError(.untrusted, "\(capitalized(what)) \(path) is not a directory. Move it aside; the broker creates the directory itself.")
        }
        guard info.st_uid == geteuid() else {
            throw PrivateFileError(
                .untrusted,
                "\(capitalized(what)) \(path) belongs to uid \(info.st_uid), not to you (uid \(geteuid())): another user may have made it to take the broker's place. Have it removed, or set XDG_RUNTIME_DIR (and HOME) so the broker uses directories of your own."
            )
        }
        let mode = UInt32(info.st_mode) & 0o777
        switch rule {
        case .privateToUser where mode & 0o077 != 0:
            throw PrivateFileError(
                .untrusted,
                "\(capitalized(what)) \(path) has mode \(String(mode, radix: 8)); it must be 0700 so that no other user can reach what is in it. Run: chmod 700 '\(path)'."
            )
        case .notWritableByOthers where mode & 0o022 != 0:
            throw PrivateFileError(
                .untrusted,
                "\(capitalized(what)) \(path) has mode \(String(mode, radix: 8)), so other users could replace the files in it. Run: chmod go-w '\(path)'."
            )
        default:
            return
        }
    }

    /// `mkdir -p` with mode 0700 for every directory it creates.
    private static func makeDirectories(_ path: String, what: String) throws(PrivateFileError) {
        let parent = AtomicFile.directory(of: path)
        if parent != path && parent != "." && parent != "/" {
            var info = stat()
            if stat(parent, &info) != 0 {
                try makeDirectories(parent, what: "the directory")
            }
        }
        if mkdir(path, 0o700) != 0 && errno != EEXIST {
            let code = errno
            throw PrivateFileError(.io, "Cannot create \(what) \(path): \(errorText(code)). Check the permissions of \(parent).")
        }
    }

    private static func errorText(_ code: Int32) -> String {
        String(cString: strerror(code))
    }

    private static func capitalized(_ what: String) -> String {
        what.prefix(1).uppercased() + what.dropFirst()
    }
}
