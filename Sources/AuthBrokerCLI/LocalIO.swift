import CAuthBrokerSystem
import Foundation
import NIOPosix

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Blocking file-descriptor I/O moved off the cooperative thread pool onto NIO's thread pool,
/// so a slow pipe on stdin or stdout stalls only this request, and memory stays one chunk.
package enum LocalFile {
    /// Why a local file could not be used, in the CLI's words.
    package struct Failure: Error, Sendable, Equatable {
        package var message: String
        /// The reader of our stdout went away (`authbrokerctl fetch URL | head`): not worth a message.
        package var isBrokenPipe = false
    }

    /// Opens `path` (or stdin for `-`) for reading; `length` is the byte count of a regular
    /// file, nil for pipes and terminals (their body is sent chunked).
    package static func openForReading(_ path: String) throws -> (descriptor: CInt, length: Int64?) {
        let descriptor: CInt = path == "-" ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else { throw failure("cannot read \(path)") }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { throw failure("cannot read \(path)") }
        if (info.st_mode & S_IFMT) == S_IFDIR {
            if descriptor != STDIN_FILENO { close(descriptor) }
            throw Failure(message: "cannot read \(path): it is a directory")
        }
        let isRegular = (info.st_mode & S_IFMT) == S_IFREG
        return (descriptor, isRegular && path != "-" ? Int64(info.st_size) : nil)
    }

    /// Creates `path` for writing with `mode`, never over an existing file (an export must not
    /// replace what is there, nor write through a link someone planted).
    package static func createNew(_ path: String, mode: mode_t) throws -> CInt {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode)
        guard descriptor >= 0 else {
            let code = errno
            let why =
                code == EEXIST
                ? "it exists already; remove it or choose another name"
                : "\(String(cString: strerror(code))); check that its directory exists and that you may write there"
            throw CLIError.plain(.failure, "cannot write \(path): \(why)")
        }
        return descriptor
    }

    /// Creates or truncates `path` for writing (mode 0666 less the umask, as curl -o does).
    package static func openForWriting(_ path: String) throws -> CInt {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o666)
        guard descriptor >= 0 else { throw failure("cannot write \(path)") }
        return descriptor
    }

    /// Reads a whole small file (or stdin for `-`), refusing more than `limit` bytes; `what`
    /// names what the file should be, for the message when it is larger.
    package static func readAll(_ path: String, limit: Int, what: String = "a PEM certificate file") throws -> Data {
        let (descriptor, _) = try openForReading(path)
        defer { if descriptor != STDIN_FILENO { close(descriptor) } }
        return try Self.readAll(descriptor, path: path, limit: limit, what: what)
    }

    /// Reads a whole small regular file, refusing more than `limit` bytes, and refusing without
    /// reading a byte anything else `path` names: a FIFO or a terminal could block, a device
    /// never end. `-` is a file of that name here, not stdin. `what` names what the file should
    /// be, for the messages.
    package static func readRegularFile(_ path: String, limit: Int, what: String) throws -> Data {
        // O_NONBLOCK: opening a FIFO without a writer would otherwise wait for one.
        let descriptor = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard descriptor >= 0 else { throw failure("cannot read \(path)") }
        defer { close(descriptor) }
        var info = stat()
        guard fstat(descriptor, &info) == 0 else { throw failure("cannot read \(path)") }
        let kind: String? =
            switch info.st_mode & S_IFMT {
            case S_IFREG: nil
            case S_IFDIR: "a directory"
            case S_IFIFO: "a FIFO (named pipe)"
            case S_IFCHR, S_IFBLK: "a device"
            case S_IFSOCK: "a socket"
            default: "not a regular file"
            }
        if let kind {
            throw Failure(message: "\(path) is \(kind), not \(what); it was not read")
        }
        return try Self.readAll(descriptor, path: path, limit: limit, what: what)
    }

    /// The rest of `descriptor`, at most `limit` bytes.
    private static func readAll(_ descriptor: CInt, path: String, limit: Int, what: String) throws -> Data {
        var data = Data()
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { posixRead(descriptor, $0.baseAddress, $0.count) }
            if count < 0 {
                if errno == EINTR { continue }
                throw failure("cannot read \(path)")
            }
            if count == 0 { return data }
            data.append(contentsOf: chunk[..<count])
            guard data.count <= limit else {
                throw Failure(message: "\(path) is larger than \(limit / 1024) KiB; is it really \(what)?")
            }
        }
    }

    /// Up to `maxBytes` from `descriptor`, or nil at end of file.
    package static func read(_ descriptor: CInt, upTo maxBytes: Int) async throws -> [UInt8]? {
        try await NIOThreadPool.singleton.runIfActive {
            var buffer = [UInt8](repeating: 0, count: maxBytes)
            while true {
                let count = buffer.withUnsafeMutableBytes { posixRead(descriptor, $0.baseAddress, maxBytes) }
                if count < 0 {
                    if errno == EINTR { continue }
                    throw Failure(message: "cannot send the request body: \(String(cString: strerror(errno)))")
                }
                if count == 0 { return nil }
                buffer.removeSubrange(count...)
                return buffer
            }
        }
    }

    /// A request body read from an open descriptor in chunks as it is sent: with `length`,
    /// exactly that many bytes (a file that shrinks meanwhile fails the upload), otherwise
    /// until end of file. The caller closes the descriptor.
    package struct Chunks: AsyncSequence, Sendable {
        package typealias Element = [UInt8]
        /// Size of each read.
        static let chunkBytes = 64 * 1024

        let descriptor: CInt
        let length: Int64?

        package init(descriptor: CInt, length: Int64?) {
            self.descriptor = descriptor
            self.length = length
        }

        package func makeAsyncIterator() -> Iterator { Iterator(descriptor: descriptor, length: length) }

        package struct Iterator: AsyncIteratorProtocol {
            let descriptor: CInt
            let length: Int64?
            var sent: Int64 = 0

            package mutating func next() async throws -> [UInt8]? {
                let want = length.map { Int(Swift.min(Int64(Chunks.chunkBytes), $0 - sent)) } ?? Chunks.chunkBytes
                if want == 0 { return nil }
                guard let chunk = try await LocalFile.read(descriptor, upTo: want) else {
                    if let length, sent != length {
                        throw LocalFile.Failure(message: "cannot send the request body: the file shrank while it was sent (\(sent) of \(length) bytes)")
                    }
                    return nil
                }
                sent += Int64(chunk.count)
                return chunk
            }
        }
    }

    /// Writes all of `bytes` to `descriptor`.
    package static func write(_ bytes: [UInt8], to descriptor: CInt) async throws {
        try await NIOThreadPool.singleton.runIfActive {
            try writeAll(bytes, to: descriptor)
        }
    }

    /// Writes all of `bytes` to `descriptor` on the calling thread.
    package static func writeAll(_ data: some ContiguousBytes, to descriptor: CInt) throws {
        try data.withUnsafeBytes { bytes in
            var offset = 0
            while offset < bytes.count {
                let written = posixWrite(descriptor, bytes.baseAddress.map { $0 + offset }, bytes.count - offset)
                if written < 0 {
                    let code = errno
                    if code == EINTR { continue }
                    throw Failure(
                        message: "cannot write the output: \(String(cString: strerror(code)))", isBrokenPipe: code == EPIPE
                    )
                }
                offset += written
            }
        }
    }

    private static func failure(_ what: String) -> Failure {
        Failure(message: "\(what): \(String(cString: strerror(errno)))")
    }
}

// `read`/`write` are shadowed inside `LocalFile` by its own static methods.
private func posixRead(_ fd: CInt, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int {
    read(fd, buffer, count)
}

private func posixWrite(_ fd: CInt, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    write(fd, buffer, count)
}

/// Text to stdout and stderr, unbuffered with respect to each other.
package enum Console {
    package static func out(_ text: String) {
        try? LocalFile.writeAll(Array((text + "\n").utf8), to: STDOUT_FILENO)
    }

    package static func error(_ text: String) {
        try? LocalFile.writeAll(Array((text + "\n").utf8), to: STDERR_FILENO)
    }

    /// Raw bytes to stdout (the daemon's JSON for `--json`), newline-terminated.
    package static func out(_ bytes: Data) {
        var data = bytes
        if data.last != UInt8(ascii: "\n") { data.append(UInt8(ascii: "\n")) }
        try? LocalFile.writeAll(data, to: STDOUT_FILENO)
    }
}

/// Questions asked on the controlling terminal, never on stdin (which may carry data).
package enum Terminal {
    /// Whether there is a controlling terminal to ask on.
    package static var isAvailable: Bool {
        let descriptor = open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY)
        guard descriptor >= 0 else { return false }
        close(descriptor)
        return true
    }

    /// Asks a yes/no question on `/dev/tty`; nil when there is no terminal to ask on.
    package static func confirm(_ question: String) -> Bool? {
        let descriptor = open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        guard (try? LocalFile.writeAll(Array((question + " [y/N] ").utf8), to: descriptor)) != nil else {
            return nil
        }
        var answer: [UInt8] = []
        var byte: UInt8 = 0
        while answer.count < 256 {
            let count = posixRead(descriptor, &byte, 1)
            if count < 0, errno == EINTR { continue }
            if count <= 0 || byte == UInt8(ascii: "\n") { break }
            answer.append(byte)
        }
        let text = String(decoding: answer, as: UTF8.self).trimmingCharacters(in: .whitespaces).lowercased()
        return text == "y" || text == "yes"
    }

    /// Asks for a line on `/dev/tty` (echoed); nil when there is no terminal to ask on.
    package static func ask(_ prompt: String) -> String? {
        let descriptor = open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        guard (try? LocalFile.writeAll(Array(prompt.utf8), to: descriptor)) != nil else { return nil }
        return String(decoding: readLine(descriptor), as: UTF8.self)
    }

    /// Reads a secret on `/dev/tty` with echo off; nil when there is no terminal to ask on.
    package static func readSecret(_ prompt: String) -> [UInt8]? {
        let descriptor = open("/dev/tty", O_RDWR | O_CLOEXEC | O_NOCTTY)
        guard descriptor >= 0 else { return nil }
        defer { close(descriptor) }
        // Echo comes back however the prompt ends, Ctrl-C included (the C side's signal handler).
        guard cab_tty_echo_off(descriptor) == 0 else { return nil }
        defer {
            cab_tty_echo_restore()
            _ = try? LocalFile.writeAll(Array("\n".utf8), to: descriptor)
        }
        guard (try? LocalFile.writeAll(Array(prompt.utf8), to: descriptor)) != nil else { return nil }
        return readLine(descriptor)
    }
}

/// Reads one line (without its newline) from `descriptor`, at most 64 KiB.
package func readLine(_ descriptor: CInt) -> [UInt8] {
    var line: [UInt8] = []
    var byte: UInt8 = 0
    while line.count < 65536 {
        let count = posixRead(descriptor, &byte, 1)
        if count < 0, errno == EINTR { continue }
        if count <= 0 || byte == UInt8(ascii: "\n") { break }
        line.append(byte)
    }
    if line.last == UInt8(ascii: "\r") { line.removeLast() }
    return line
}
