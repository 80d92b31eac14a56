import Foundation
import Testing
import TestSupport

/// TRACE echoes the request the origin received (RFC 9110 §9.3.8). A stored password the
/// broker added to one would come back in the body to an app that can only use the socket, which
/// must not read secrets without the user's password (PAM).
@Suite("TRACE and stored credentials")
struct TraceTests {
    /// Basic realm "r" on every path but TRACE, which it echoes.
    static func echoingOrigin() async throws -> RawOrigin {
        try await RawOrigin.start { received in
            guard let end = RawOrigin.headEnd(in: received) else { return nil }
            let head = String(decoding: received[..<end], as: UTF8.self)
            if head.hasPrefix("TRACE ") || head.hasPrefix("TRACK ") {
                let echo = head + "\r\n\r\n"
                return RawOrigin.Reply(
                    "HTTP/1.1 200 OK\r\nContent-Type: message/http\r\nContent-Length: \(echo.utf8.count)\r\nConnection: close\r\n\r\n\(echo)",
                    close: true
                )
            }
            let authorized = head.lowercased().contains("\r\nauthorization: basic ")
            let reply =
                authorized
                ? "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                : "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"r\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            return RawOrigin.Reply(reply, close: true)
        }
    }

    @Test("a TRACE under a space the broker answers goes without the stored password")
    func traceCarriesNoStoredCredential() async throws {
        let origin = try await Self.echoingOrigin()
        defer { Task { await origin.stop() } }
        let base = "http://trace.internal.test:\(origin.port)"
        let config = "[upstream]\nresolve = [\"trace.internal.test:\(origin.port):127.0.0.1\"]\n"
        try await withDaemon(config: config) { daemon in
            let added = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", base, "--user", "alice", "--password-stdin", "--persistence", "session"], stdin: "Trace-Secret-1\n"
            )
            #expect(added.status == 0, "\(added.stderr)")
            // The space is learnt: later requests under /dir get the password up front.
            #expect(try fetch(daemon, base + "/dir/a").status == 200)
            #expect(try fetch(daemon, base + "/dir/b").status == 200)
            let secret = Data("alice:Trace-Secret-1".utf8).base64EncodedString()
            #expect(origin.received.contains { String(decoding: $0, as: UTF8.self).contains(secret) }, "the password was used")

            for method in ["TRACE"] {
                let trace = try UnixSocketConnection(path: daemon.socketPath).request(method, base + "/dir/c")
                #expect(trace.status == 200, "\(trace.status) \(trace.text)")
                #expect(trace.text.hasPrefix("\(method) /dir/c"), "\(trace.text)")
                #expect(!trace.text.lowercased().contains("authorization"), "echoed: \(trace.text)")
                #expect(!trace.text.contains(secret))
            }
        }
    }
}
