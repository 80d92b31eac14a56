import Foundation
import NIOConcurrencyHelpers
import Testing
import TestSupport

/// Collapsed misses answered from the first request's response while it is being stored, through
/// the real daemon, against an origin that sends its body in pieces and holds its last part until
/// the test lets it go (so a test can see followers get bytes before the origin finished).
@Suite("HTTP cache: following a fill", .serialized)
struct CacheFollowingTests {
    /// An origin on 127.0.0.1 (blocking sockets, a thread per connection), answering by path:
    /// - `/big`: 12 MiB (`Content-Length`), all but the last MiB at once, the rest once released.
    /// - `/chunked`: 3 MiB chunked, the last chunk once released.
    /// - `/broken`: the first request gets a head of 4 MiB and 1 MiB of it, then (once released)
    ///   a close: a body broken off. Later ones get the whole body.
    /// - `/vary`: after 500 ms, `Vary: Accept-Language`, a body naming the language.
    /// Every response may be stored (`max-age=600`). "Released" is `release(path)`, or 20 s.
    final class TricklingOrigin: Sendable {
        private let listener: CInt
        let port: Int
        private let state = NIOLockedValueBox(State())

        private struct State {
            var requests: [String] = []
            var released: Set<String> = []
            var timedOut: Set<String> = []
        }

        init() throws {
            let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let bound = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard fd >= 0, bound == 0, listen(fd, 64) == 0 else { throw TestSupportError("cannot listen") }
            var length = socklen_t(MemoryLayout<sockaddr_in>.size)
            _ = withUnsafeMutablePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
            self.listener = fd
            self.port = Int(UInt16(bigEndian: address.sin_port))
            Thread.detachNewThread { [self] in self.acceptLoop() }
        }

        func stop() {
            shutdown(self.listener, Int32(SHUT_RDWR))
            close(self.listener)
        }

        /// The body of `path` (a pattern that differs in every byte position mod 251).
        static func body(_ path: String) -> [UInt8] {
            let size = path == "/big" ? 12 << 20 : path == "/chunked" ? 3 << 20 : 4 << 20
            return (0..<size).map { UInt8(truncatingIfNeeded: $0 % 251) }
        }

        func requests(_ path: String) -> Int { self.state.withLockedValue { $0.requests.filter { $0 == path }.count } }
        func release(_ path: String) { _ = self.state.withLockedValue { $0.released.insert(path) } }
        /// Whether the origin gave up waiting for `release(path)`.
        func timedOut(_ path: String) -> Bool { self.state.withLockedValue { $0.timedOut.contains(path) } }

        private func acceptLoop() {
            while true {
                let connection = accept(self.listener, nil, nil)
                guard connection >= 0 else { return }
                Thread.detachNewThread { [self] in
                    self.serve(connection)
                    close(connection)
                }
            }
        }

        private func waitForRelease(_ path: String) {
            let deadline = Date().addingTimeInterval(20)
            while !self.state.withLockedValue({ $0.released.contains(path) }) {
                if Date() > deadline {
                    _ = self.state.withLockedValue { $0.timedOut.insert(path) }
                    return
                }
                usleep(10_000)
            }
        }

        private func serve(_ fd: CInt) {
            var received: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while RawOrigin.headEnd(in: received) == nil {
                let count = read(fd, &chunk, chunk.count)
                guard count > 0 else { return }
                received += chunk[0..<count]
            }
            let head = String(decoding: received, as: UTF8.self)
            let target = String(head.split(separator: " ")[1])
            let path = target.hasPrefix("http") ? "/" + target.split(separator: "/", maxSplits: 3).dropFirst(2).dropFirst().joined() : target
            let count = self.state.withLockedValue { state in
                state.requests.append(path)
                return state.requests.filter { $0 == path }.count
            }
            func send(_ bytes: some Collection<UInt8>) {
                var bytes = Array(bytes)[...]
                while !bytes.isEmpty {
                    let sent = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
                    guard sent > 0 else { return }
                    bytes = bytes.dropFirst(sent)
                }
            }
            func sendHead(_ fields: [String]) {
                send(Array((["HTTP/1.1 200 OK", "Cache-Control: max-age=600", "Connection: close"] + fields).joined(separator: "\r\n").utf8) + Array("\r\n\r\n".utf8))
            }
            /// Sends `body` in 64 KiB pieces.
            func trickle(_ body: ArraySlice<UInt8>, chunked: Bool = false) {
                var rest = body
                while !rest.isEmpty {
                    let piece = rest.prefix(64 << 10)
                    rest = rest.dropFirst(piece.count)
                    if chunked { send(Array((String(piece.count, radix: 16) + "\r\n").utf8) + piece + Array("\r\n".utf8)) } else { send(piece) }
                    usleep(1000)
                }
            }
            switch path {
            case "/big":
                let body = Self.body(path)
                sendHead(["Content-Length: \(body.count)"])
                trickle(body.dropLast(1 << 20))
                self.waitForRelease(path)
                trickle(body.suffix(1 << 20))
            case "/chunked":
                let body = Self.body(path)
                sendHead(["Transfer-Encoding: chunked"])
                trickle(body.dropLast(256 << 10), chunked: true)
                self.waitForRelease(path)
                trickle(body.suffix(256 << 10), chunked: true)
                send(Array("0\r\n\r\n".utf8))
            case "/broken":
                let body = Self.body(path)
                sendHead(["Content-Length: \(body.count)"])
                guard count == 1 else { return trickle(body[...]) }
                trickle(body.prefix(1 << 20))
                self.waitForRelease(path)
            case "/vary":
                usleep(500_000)
                let language = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("accept-language:") }
                    .map { $0.dropFirst("accept-language:".count).trimmingCharacters(in: .whitespaces) } ?? "-"
                let body = Array("lang=\(language) #\(count)".utf8)
                sendHead(["Vary: Accept-Language", "Content-Length: \(body.count)"])
                send(body)
            default:
                send(Array("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".utf8))
            }
        }
    }

    /// What one client got: the response (nil when it was cut, with the error), and when its
    /// first body bytes came.
    struct ClientResult: Sendable {
        var response: TestResponse?
        var error: String?
        var gotBytes = false
    }

    /// `clients` concurrent GETs of `path` (one every 50 ms, so the first claims the fill);
    /// `firstBytes` is called (from the client's thread) when a client gets its first body bytes.
    static func concurrentGets(
        _ daemon: DaemonProcess, _ url: String, clients: Int, headers: @escaping @Sendable (Int) -> [(String, String)] = { _ in [] },
        firstBytes: @escaping @Sendable () -> Void
    ) async -> [ClientResult] {
        let results = NIOLockedValueBox([Int: ClientResult]())
        let socketPath = daemon.socketPath
        await withTaskGroup(of: Void.self) { group in
            for index in 0..<clients {
                group.addTask {
                    try? await Task.sleep(for: .milliseconds(50 * index))
                    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                        // Threads, not tasks: the socket client blocks, and the requests must overlap.
                        Thread.detachNewThread {
                            var result = ClientResult()
                            var body: [UInt8] = []
                            do {
                                let connection = try UnixSocketConnection(path: socketPath, timeoutSeconds: 30)
                                defer { connection.close() }
                                var text = "GET \(url) HTTP/1.1\r\nHost: localhost\r\n"
                                for (name, value) in headers(index) { text += "\(name): \(value)\r\n" }
                                try connection.send(text + "\r\n")
                                var response = try connection.readResponse { bytes in
                                    if !result.gotBytes, !bytes.isEmpty {
                                        result.gotBytes = true
                                        firstBytes()
                                    }
                                    body += bytes
                                }
                                response.body = body
                                result.response = response
                            } catch {
                                result.error = "\(error)"
                            }
                            results.withLockedValue { $0[index] = result }
                            continuation.resume()
                        }
                    }
                }
            }
        }
        return results.withLockedValue { results in (0..<clients).map { results[$0] ?? ClientResult() } }
    }

    static func withFollowingDaemon(_ body: (DaemonProcess, TricklingOrigin, String) async throws -> Void) async throws {
        let origin = try TricklingOrigin()
        defer { origin.stop() }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let config = """
            [upstream]
            resolve = ["follow.test:\(origin.port):127.0.0.1"]

            [cache]
            enabled = true
            directory = "\(directory)/cache"
            """
        try await withDaemon(config: config) { daemon in
            try await body(daemon, origin, "http://follow.test:\(origin.port)")
        }
    }

    @Test("concurrent misses for a large response, trickled: asked once, followed as it is stored, every client gets all of it")
    func followsLargeFill() async throws {
        try await Self.withFollowingDaemon { daemon, origin, base in
            let clients = 4
            let started = NIOLockedValueBox(0)
            // The origin holds its last MiB until every client has had body bytes: only clients
            // answered as the body is written get any before it ends.
            let results = await Self.concurrentGets(daemon, base + "/big", clients: clients) {
                if started.withLockedValue({ $0 += 1; return $0 }) == clients { origin.release("/big") }
            }
            #expect(origin.requests("/big") == 1)
            #expect(!origin.timedOut("/big"), "the origin waited in vain for every client to get body bytes")
            let expected = TricklingOrigin.body("/big")
            for result in results {
                #expect(result.response?.status == 200, "\(result.error ?? "")")
                #expect(result.response?.body == expected)
                #expect(result.response?.header("Content-Length") == String(expected.count))
            }
            let collapsed = results.filter { $0.response?.header("Cache-Status") == "authbrokerd; fwd=miss; collapsed" }
            #expect(collapsed.count == clients - 1)
            // Stored whole: a later request is a hit.
            let hit = try UnixSocketConnection(path: daemon.socketPath).request("GET", base + "/big")
            #expect(hit.body == expected && hit.header("Cache-Status") == "authbrokerd; hit")
            #expect(origin.requests("/big") == 1)
        }
    }

    @Test("concurrent misses for a chunked response (length unknown) are followed, chunked, and every client gets all of it")
    func followsChunkedFill() async throws {
        try await Self.withFollowingDaemon { daemon, origin, base in
            let clients = 3
            let started = NIOLockedValueBox(0)
            let results = await Self.concurrentGets(daemon, base + "/chunked", clients: clients) {
                if started.withLockedValue({ $0 += 1; return $0 }) == clients { origin.release("/chunked") }
            }
            #expect(origin.requests("/chunked") == 1)
            #expect(!origin.timedOut("/chunked"), "the origin waited in vain for every client to get body bytes")
            let expected = TricklingOrigin.body("/chunked")
            for result in results {
                #expect(result.response?.status == 200, "\(result.error ?? "")")
                #expect(result.response?.body == expected)
            }
            let followers = results.filter { $0.response?.header("Cache-Status") == "authbrokerd; fwd=miss; collapsed" }
            #expect(followers.count == clients - 1)
            for follower in followers {
                #expect(follower.response?.header("Content-Length") == nil)
                #expect(follower.response?.header("Transfer-Encoding")?.lowercased() == "chunked")
            }
        }
    }

    @Test("a body broken off mid-way cuts the filler's and the followers' responses; nothing is stored; the next request asks the origin")
    func brokenFillCutsFollowers() async throws {
        try await Self.withFollowingDaemon { daemon, origin, base in
            let clients = 3
            let started = NIOLockedValueBox(0)
            let results = await Self.concurrentGets(daemon, base + "/broken", clients: clients) {
                if started.withLockedValue({ $0 += 1; return $0 }) == clients { origin.release("/broken") }
            }
            #expect(origin.requests("/broken") == 1)
            #expect(!origin.timedOut("/broken"), "the origin waited in vain for every client to get body bytes")
            for result in results {
                // Cut: never a response that looks complete.
                #expect(result.response == nil && result.gotBytes, "\(String(describing: result.response?.status)) \(result.error ?? "")")
            }
            let next = try UnixSocketConnection(path: daemon.socketPath).request("GET", base + "/broken")
            #expect(next.status == 200 && next.body == TricklingOrigin.body("/broken"))
            #expect(next.header("Cache-Status") != "authbrokerd; hit")
            #expect(origin.requests("/broken") == 2)
        }
    }

    @Test("a collapsed miss for another variant (Vary) is not answered from the fill: it asks the origin")
    func otherVariantDoesNotFollow() async throws {
        try await Self.withFollowingDaemon { daemon, origin, base in
            let languages = ["de", "fr", "de"]
            let results = await Self.concurrentGets(
                daemon, base + "/vary", clients: languages.count, headers: { [("Accept-Language", languages[$0])] }, firstBytes: {}
            )
            // The second reached the origin second (the origin numbers each path's requests).
            #expect(results.map { $0.response?.text } == ["lang=de #1", "lang=fr #2", "lang=de #1"])
            // The same variant: followed, or (the body being tiny) already stored when it looked.
            #expect(["authbrokerd; fwd=miss; collapsed", "authbrokerd; hit"].contains(results[2].response?.header("Cache-Status")))
            #expect(origin.requests("/vary") == 2)
        }
    }
}
