#if canImport(Glibc)
import Glibc
#endif

/// Writing a whole file so that a crash leaves either the old or the new one: the secret file and
/// the trust store both save this way.
package enum AtomicFile {
    /// The step that failed and its `errno`; each caller words the message for its own file.
    package struct Failure: Error, Sendable, Equatable {
        package var step: String
        package var code: Int32

        /// `step: strerror(code)`, for a message.
        package var description: String { "\(self.step): \(String(cString: strerror(self.code)))" }
    }

    /// Writes `bytes` to `path`: a 0600 temporary file in the same directory (never through a
    /// symbolic link), `fsync`, `rename` over `path`, then `fsync` of the directory. With
    /// `exclusive`, an existing `path` is kept (a hard link instead of the rename) and false is
    /// returned. On failure the temporary file is removed and `path` is unchanged.
    @discardableResult
    package static func write(_ bytes: [UInt8], to path: String, exclusive: Bool = false) throws(Failure) -> Bool {
        let temporary = "\(path).tmp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw Failure(step: "create \(temporary)", code: errno) }
        func abandon(_ step: String, _ code: Int32) -> Failure {
            close(fd)
            unlink(temporary)
            return Failure(step: step, code: code)
        }
        var written = 0
        while written < bytes.count {
            let n = bytes[written...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw abandon("write", errno)
            }
            written += n
        }
        if fsync(fd) != 0 { throw abandon("fsync", errno) }
        close(fd)
        if exclusive {
            if link(temporary, path) != 0 {
                let code = errno
                unlink(temporary)
                if code == EEXIST { return false }
                throw Failure(step: "link", code: code)
            }
            unlink(temporary)
        } else if rename(temporary, path) != 0 {
            let code = errno
            unlink(temporary)
            throw Failure(step: "rename", code: code)
        }
        // Make the rename (or link) itself durable.
        let directoryFD = open(Self.directory(of: path), O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if directoryFD >= 0 {
            _ = fsync(directoryFD)
            close(directoryFD)
        }
        return true
    }

    /// The directory holding `path` ("." for a bare name, "/" for a file at the root).
    package static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let parent = String(path[..<slash])
        return parent.isEmpty ? "/" : parent
    }
}
