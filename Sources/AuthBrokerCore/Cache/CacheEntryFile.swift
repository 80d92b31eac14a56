#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The system calls behind the cache's entry files (`CacheEntryFormat`): opening one only if it
/// is a regular file of the user's (no symlink followed), and reading its head.
package enum CacheEntryFile {
    /// Opens `path` for reading if it is a regular file owned by the user of `expectedSize`
    /// bytes (when given); the descriptor, or nil.
    package static func openForReading(_ path: String, expectedSize: Int64? = nil) -> (fd: CInt, size: Int64, modified: Int)? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        var info = stat()
        guard fstat(fd, &info) == 0, info.st_mode & S_IFMT == S_IFREG, info.st_uid == getuid(),
            expectedSize.map({ $0 == Int64(info.st_size) }) ?? true
        else {
            close(fd)
            return nil
        }
        return (fd, Int64(info.st_size), Int(info.st_mtim.tv_sec))
    }

    /// Reads and checks the head of the entry file at `path` (and that the body's length
    /// matches the file's size).
    package static func readHead(
        _ path: String
    ) -> Result<(head: CacheEntryFormat.Head, bodyOffset: Int, modified: Int), CacheEntryFormat.Failure> {
        guard let (fd, size, modified) = Self.openForReading(path) else { return .failure(.notAnEntry) }
        defer { close(fd) }
        var prefix = [UInt8](repeating: 0, count: CacheEntryFormat.prefixBytes)
        guard Self.read(fd, into: &prefix, at: 0) else { return .failure(.notAnEntry) }
        let needed: Int
        switch CacheEntryFormat.headBytesNeeded(prefix: prefix) {
        case .success(let count): needed = count
        case .failure(let failure): return .failure(failure)
        }
        guard Int64(needed) <= size else { return .failure(.headTruncated) }
        var bytes = [UInt8](repeating: 0, count: needed)
        guard Self.read(fd, into: &bytes, at: 0) else { return .failure(.headTruncated) }
        return CacheEntryFormat.decodeHead(bytes, fileSize: size).map { ($0.head, $0.bodyOffset, modified) }
    }

    /// Copies `count` bytes from one descriptor to another at the given offsets, adding them to
    /// `checksum` as they pass (the copy reads every byte: it checks them for free).
    package static func copy(
        from input: CInt, at inputOffset: Int64, to output: CInt, at outputOffset: Int64, count: Int64, checksum: inout CRC32
    ) -> Bool {
        Self.read(input, at: inputOffset, count: count) { piece, done in
            checksum.update(piece)
            return Self.write(output, piece, at: outputOffset + done)
        }
    }

    /// Adds `count` bytes of `fd` from `offset` to `checksum`; false when the file ends first.
    package static func checksum(_ fd: CInt, at offset: Int64, count: Int64, into checksum: inout CRC32) -> Bool {
        Self.read(fd, at: offset, count: count) { piece, _ in
            checksum.update(piece)
            return true
        }
    }

    /// Reads `count` bytes of `fd` from `offset` in 64 KiB pieces, each handed to `take` with how
    /// many came before it; false when the file ends first or `take` says stop.
    private static func read(
        _ fd: CInt, at offset: Int64, count: Int64, _ take: (UnsafeRawBufferPointer, Int64) -> Bool
    ) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var done: Int64 = 0
        while done < count {
            let wanted = Int(min(Int64(buffer.count), count - done))
            let got = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress, wanted, off_t(offset + done)) }
            guard got > 0, buffer.withUnsafeBytes({ take(UnsafeRawBufferPointer(rebasing: $0[0..<got]), done) }) else { return false }
            done += Int64(got)
        }
        return true
    }

    /// Writes all of `bytes` at `offset`.
    package static func write(_ fd: CInt, _ bytes: [UInt8], at offset: Int64) -> Bool {
        bytes.withUnsafeBytes { Self.write(fd, $0, at: offset) }
    }

    /// Writes all of `bytes` at `offset`.
    package static func write(_ fd: CInt, _ bytes: UnsafeRawBufferPointer, at offset: Int64) -> Bool {
        var sent = 0
        while sent < bytes.count {
            let wrote = pwrite(fd, bytes.baseAddress.map { $0 + sent }, bytes.count - sent, off_t(offset) + off_t(sent))
            if wrote <= 0 { return false }
            sent += wrote
        }
        return true
    }

    /// Fills `buffer` from `offset`; false when the file ends first.
    private static func read(_ fd: CInt, into buffer: inout [UInt8], at offset: Int64) -> Bool {
        var got = 0
        while got < buffer.count {
            let count = buffer.count
            let read = buffer.withUnsafeMutableBytes { pread(fd, $0.baseAddress.map { $0 + got }, count - got, off_t(offset) + off_t(got)) }
            if read <= 0 { return false }
            got += read
        }
        return true
    }
}
