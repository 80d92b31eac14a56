#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// What a file is on disk right now, to tell whether someone changed it since it was read or
/// written: device, inode (an editor's or our own atomic rename makes a new one), size and
/// modification time to the nanosecond. nil from `of(path:)`: there is no such file.
package struct FileStamp: Hashable, Sendable {
    package var device: UInt64
    package var inode: UInt64
    package var size: Int64
    package var modifiedSeconds: Int64
    package var modifiedNanoseconds: Int64

    /// `lstat` of `path`: a symlink is stamped as itself, never followed.
    package static func of(path: String) -> FileStamp? {
        var info = stat()
        guard lstat(path, &info) == 0 else { return nil }
        #if canImport(Darwin)
        let modified = info.st_mtimespec
        #else
        let modified = info.st_mtim
        #endif
        return FileStamp(
            device: UInt64(info.st_dev), inode: UInt64(info.st_ino), size: Int64(info.st_size),
            modifiedSeconds: Int64(modified.tv_sec), modifiedNanoseconds: Int64(modified.tv_nsec)
        )
    }
}
