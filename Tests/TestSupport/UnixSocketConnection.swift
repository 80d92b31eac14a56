import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A blocking HTTP/1.1 client over a Unix socket (or TCP), byte-exact, for tests: it sends exactly what
/// it is given (so hostile inputs reach the daemon unchanged) and parses responses itself.
package final class UnixSocketConnection: @unchecked Sendable {  // one test task uses a connection at a time
    private let fd: Int32
    private var buffer: [UInt8] = []
    private var isClosed = false

    /// Connects; every read gives up after `timeoutSeconds` so a broken daemon fails a test
    /// instead of hanging it.
    package init(path: String, timeoutSeconds: Int = 60) throws {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else {
            Glibc.close(fd)
            throw TestSupportError("socket path too long: \(path)")
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
        guard result == 0 else {
            let message = String(cString: strerror(errno))
            Glibc.close(fd)
            throw TestSupportError("connect \(path): \(message)")
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
    }

    /// Connects over TCP to `host` (an IPv4 literal) instead, for the origin fixtures.
    package init(tcpPort port: Int, host: String = "127.0.0.1", timeoutSeconds: Int = 60) throws {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw TestSupportError("socket: \(String(cString: strerror(errno)))") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(truncatingIfNeeded: port)).bigEndian
        guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else {
            Glibc.close(fd)
            throw TestSupportError("not an IPv4 address: \(host)")
        }
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard result == 0 else {
            let message = String(cString: strerror(errno))
            Glibc.close(fd)
            throw TestSupportError("connect \(host):\(port): \(message)")
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        self.fd = fd
    }

    deinit {
        self.close()
    }

    package func close() {
        guard !self.isClosed else { return }
        self.isClosed = true
        Glibc.close(self.fd)
    }

    package func send(_ text: String) throws {
        try self.send(Array(text.utf8))
    }

    package func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let written = bytes[offset...].withUnsafeBytes { raw in
                Glibc.send(self.fd, raw.baseAddress, raw.count, Int32(MSG_NOSIGNAL))
            }
            guard written > 0 else { throw TestSupportError("send: \(String(cString: strerror(errno)))") }
            offset += written
        }
    }

    /// Reads more bytes into the buffer; false at end of stream.
    private func fill() throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count = chunk.withUnsafeMutableBytes { recv(self.fd, $0.baseAddress, $0.count, 0) }
        if count < 0 {
            throw TestSupportError("recv: \(String(cString: strerror(errno)))")
        }
        if count == 0 { return false }
        self.buffer.append(contentsOf: chunk[0..<count])
        return true
    }

    /// One byte (for reading interim responses precisely).
    package func readByte() throws -> UInt8 {
        if self.buffer.isEmpty {
            guard try self.fill() else { throw TestSupportError("connection closed") }
        }
        return self.buffer.removeFirst()
    }

    /// Exactly `count` bytes.
    package func read(count: Int) throws -> [UInt8] {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count)
        try self.readExactly(count) { bytes.append(contentsOf: $0) }
        return bytes
    }

    /// Reads and drops at least `count` bytes (say, a body's start); returns how many it dropped.
    package func discard(atLeast count: Int) throws -> Int {
        var dropped = 0
        while dropped < count {
            if self.buffer.isEmpty {
                guard try self.fill() else { throw TestSupportError("connection closed after \(dropped) bytes") }
            }
            dropped += self.buffer.count
            self.buffer.removeAll(keepingCapacity: true)
        }
        return dropped
    }

    /// Everything until the daemon closes the connection.
    package func readToEnd() throws -> [UInt8] {
        while try self.fill() {}
        defer { self.buffer.removeAll() }
        return self.buffer
    }

    /// True when the peer closes the connection within `milliseconds` (bytes that arrive
    /// meanwhile are kept for later reads).
    package func peerClosedWithin(milliseconds: Int32) -> Bool {
        var poller = pollfd(fd: self.fd, events: Int16(POLLIN), revents: 0)
        let deadline = ContinuousClock.now + .milliseconds(Int(milliseconds))
        while ContinuousClock.now < deadline {
            let remaining = (deadline - ContinuousClock.now).components
            let left = Int32(max(1, remaining.seconds * 1000 + remaining.attoseconds / 1_000_000_000_000_000))
            guard poll(&poller, 1, left) > 0 else { continue }
            guard (try? self.fill()) == true else { return true }
        }
        return false
    }

    /// True when the peer has closed the connection (reads end of stream with nothing pending).
    package func peerClosed() -> Bool {
        guard self.buffer.isEmpty else { return false }
        return (try? self.fill()) == false
    }

    /// One line, without its CRLF.
    package func readLine() throws -> String {
        while true {
            if let index = self.buffer.firstIndex(of: 10) {
                var line = Array(self.buffer[0..<index])
                self.buffer.removeFirst(index + 1)
                if line.last == 13 { line.removeLast() }
                return String(decoding: line, as: UTF8.self)
            }
            guard try self.fill() else { throw TestSupportError("connection closed while reading a line") }
        }
    }

    private func readExactly(_ count: Int, into sink: (ArraySlice<UInt8>) -> Void) throws {
        var remaining = count
        while remaining > 0 {
            if self.buffer.isEmpty {
                guard try self.fill() else { throw TestSupportError("connection closed with \(remaining) body bytes missing") }
            }
            let take = min(remaining, self.buffer.count)
            sink(self.buffer[0..<take])
            self.buffer.removeFirst(take)
            remaining -= take
        }
    }

    /// Reads one final response (collecting any 1xx heads before it).
    /// - Parameters:
    ///   - method: the request's method (a HEAD response has no body).
    ///   - sink: receives body bytes; if nil, they are collected into `body`.
    package func readResponse(method: String = "GET", sink: ((ArraySlice<UInt8>) -> Void)? = nil) throws -> TestResponse {
        var informational: [Int] = []
        while true {
            let statusLine = try self.readLine()
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
                throw TestSupportError("not a status line: \(statusLine)")
            }
            var headers: [(String, String)] = []
            while true {
                let line = try self.readLine()
                if line.isEmpty { break }
                guard let colon = line.firstIndex(of: ":") else { throw TestSupportError("bad header line: \(line)") }
                headers.append((String(line[..<colon]), line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
            }
            if (100..<200).contains(status) {
                informational.append(status)
                continue
            }
            var response = TestResponse(status: status, headers: headers, body: [], informational: informational)
            var collected: [UInt8] = []
            let deliver: (ArraySlice<UInt8>) -> Void = sink ?? { collected.append(contentsOf: $0) }
            if method == "HEAD" || status == 204 || status == 304 {
                return response
            }
            if let length = response.header("content-length").flatMap({ Int($0) }) {
                try self.readExactly(length, into: deliver)
            } else if response.header("transfer-encoding")?.lowercased().contains("chunked") == true {
                while true {
                    let sizeLine = try self.readLine()
                    guard let size = Int(sizeLine.split(separator: ";").first ?? "", radix: 16) else {
                        throw TestSupportError("bad chunk size line: \(sizeLine)")
                    }
                    if size == 0 {
                        while try !self.readLine().isEmpty {}
                        break
                    }
                    try self.readExactly(size, into: deliver)
                    _ = try self.readLine()
                }
            } else {
                while try self.fill() {}
                deliver(self.buffer[...])
                self.buffer.removeAll()
            }
            response.body = collected
            return response
        }
    }

    /// Sends a request and reads its response.
    package func request(
        _ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8]? = nil
    ) throws -> TestResponse {
        var text = "\(method) \(target) HTTP/1.1\r\nHost: localhost\r\n"
        for (name, value) in headers { text += "\(name): \(value)\r\n" }
        if let body { text += "Content-Length: \(body.count)\r\n" }
        text += "\r\n"
        try self.send(Array(text.utf8) + (body ?? []))
        return try self.readResponse(method: method)
    }
}

/// A response as the test client read it.
package struct TestResponse: Sendable {
    package var status: Int
    package var headers: [(String, String)]
    package var body: [UInt8]
    package var informational: [Int]

    package func header(_ name: String) -> String? {
        self.headers.first { $0.0.lowercased() == name.lowercased() }?.1
    }

    package var text: String { String(decoding: self.body, as: UTF8.self) }

    /// The body parsed as a JSON object.
    package var json: [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(self.body))) as? [String: Any] ?? [:]
    }
}
