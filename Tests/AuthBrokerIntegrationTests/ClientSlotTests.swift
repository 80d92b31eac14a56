import Foundation
import Testing
import TestSupport

/// A local program that opens connections and never finishes its requests must not lock the
/// user out of the daemon: heads have a deadline, idle connections close, and a few slots stay
/// for the control API.
@Suite("Client connection slots")
struct ClientSlotTests {
    @Test("half-sent requests fill every slot: status still answers, a data request gets 503, the half-sent get 408")
    func halfSentRequestsDoNotLockOut() async throws {
        let config = """
            [limits]
            max_client_connections = 4
            reserved_control_connections = 2
            request_head_timeout_ms = 1500
            """
        let daemon = try await DaemonProcess.start(config: config)
        defer { daemon.cleanUp() }
        var stalled: [UnixSocketConnection] = []
        for _ in 0..<4 {
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            try connection.send("GET http://stalled.test/ HTTP/1.1\r\nHost: stalled.test\r\nX-Half: ")
            stalled.append(connection)
        }
        // Let the daemon accept the four before the next arrives (checked again below).
        try await Task.sleep(for: .milliseconds(200))

        let status = try CLIAndClientsTests.ctl(daemon, ["status", "--json"])
        #expect(status.status == 0, "\(status.stderr)")

        // On a slow machine a stalled connection may not be registered yet: then this request
        // got an ordinary slot (and a 502 for the unknown host); ask again until it is refused.
        var refused: TestResponse?
        for _ in 0..<100 {
            let extra = try UnixSocketConnection(path: daemon.socketPath)
            let response = try extra.request("GET", "http://stalled.test/")
            if response.status == 503 {
                #expect(extra.peerClosed())
                refused = response
                break
            }
            extra.close()
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(refused?.header("Authbroker-Error") == "client_connections_full")

        for connection in stalled {
            let answer = try connection.readResponse()
            #expect(answer.status == 408)
            #expect(answer.header("Authbroker-Error") == "request_head_timeout")
            #expect(connection.peerClosed())
        }
        // The slots are free again: a control request on an ordinary slot.
        let again = try UnixSocketConnection(path: daemon.socketPath)
        #expect(try again.request("GET", "/v1/status").status == 200)
        await daemon.stop()
        #expect(daemon.log.contains("request head not complete in time"))
    }

    @Test("an idle connection is closed, an agent's open event stream is not")
    func idleTimeout() async throws {
        let daemon = try await DaemonProcess.start(config: "[limits]\nclient_idle_timeout_ms = 300\n")
        defer { daemon.cleanUp() }
        let idle = try UnixSocketConnection(path: daemon.socketPath)
        let agent = try UnixSocketConnection(path: daemon.socketPath)
        try agent.send("GET /v1/agent HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(try agent.readLine().hasPrefix("HTTP/1.1 200"))

        #expect(try idle.readToEnd().isEmpty, "closed without a word")
        // Well past the idle timeout: the stream, a request in progress, is still open.
        try await Task.sleep(for: .milliseconds(1200))
        #expect(!agent.peerClosedWithin(milliseconds: 100))

        // A connection between two requests: closed only after the idle time, not mid-request.
        let keepAlive = try UnixSocketConnection(path: daemon.socketPath)
        #expect(try keepAlive.request("GET", "/v1/status").status == 200)
        #expect(try keepAlive.readToEnd().isEmpty)
        await daemon.stop()
    }
}
