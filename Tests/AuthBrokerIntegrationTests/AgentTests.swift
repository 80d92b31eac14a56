import Foundation
import Testing
import TestSupport

/// Agents answer what the store cannot: `GET /v1/agent` streams challenges, answers come back
/// on `POST /v1/agent/{id}/answer`; requests opt in with `Authbroker-Interactive`.
@Suite("Agents")
struct AgentTests {
    static let password = "Wonderland-Secret-42"

    /// Python that attaches to `GET /v1/agent` at `path` and defines `lines()`, the event lines
    /// of its chunked stream: the start of every test agent.
    static let attachPrelude = #"""
        import json, socket, sys, time
        path = sys.argv[1]
        s = socket.socket(socket.AF_UNIX); s.connect(path)
        s.sendall(b"GET /v1/agent HTTP/1.1\r\nHost: x\r\n\r\n")
        f = s.makefile("rb")
        while f.readline() not in (b"\r\n", b""):
            pass
        def lines():
            while True:
                size_line = f.readline()
                if not size_line:
                    return
                size = int(size_line.strip(), 16)
                if size == 0:
                    return
                data = f.read(size); f.readline()
                for line in data.splitlines():
                    yield line

        """#

    /// A minimal agent speaking the wire protocol: answer (once or always), ignore, or disconnect.
    static let script = attachPrelude + #"""
        mode, password = sys.argv[2], sys.argv[3]
        agent = None
        for raw in lines():
            event = json.loads(raw)
            print("EVENT " + json.dumps(event), flush=True)
            if event["event"] == "attached":
                agent = event["agent"]
            elif event["event"] == "challenge":
                if mode == "disconnect":
                    s.close(); sys.exit(0)
                if mode == "ignore":
                    continue
                body = json.dumps({"challenge": event["challenge"]["id"], "user": "alice", "password": password, "persistence": "session"}).encode()
                c = socket.socket(socket.AF_UNIX); c.connect(path)
                c.sendall(b"POST /v1/agent/%s/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (agent.encode(), len(body)) + body)
                print("ANSWER " + c.recv(4096).split(b"\r\n")[0].decode(), flush=True)
                c.close()
        """#

    /// Starts the agent (its transcript goes to a file) and waits until the daemon says it attached.
    static func startAgent(_ daemon: DaemonProcess, mode: String) async throws -> (Process, String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", Self.script, daemon.socketPath, mode, Self.password]
        let output = daemon.directory + "/agent-\(mode).log"
        guard FileManager.default.createFile(atPath: output, contents: nil) else { throw TestSupportError("cannot create \(output)") }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: output))
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        for _ in 0..<200 where !daemon.log.contains("agent attached") {
            try await Task.sleep(for: .milliseconds(25))
        }
        #expect(daemon.log.contains("agent attached"))
        return (process, output)
    }

    /// Waits (up to 5 s) until the agent's transcript mentions `text`.
    static func waitFor(_ text: String, in agent: (Process, String)) async throws {
        for _ in 0..<200 {
            if let transcript = try? String(contentsOfFile: agent.1, encoding: .utf8), transcript.contains(text) { return }
            try await Task.sleep(for: .milliseconds(25))
        }
    }

    static func stop(_ agent: (Process, String)) -> String {
        // SIGKILL: children of the test runner inherit its blocked SIGTERM.
        if agent.0.isRunning { kill(agent.0.processIdentifier, SIGKILL) }
        agent.0.waitUntilExit()
        return (try? String(contentsOfFile: agent.1, encoding: .utf8)) ?? ""
    }

    static func config(_ origin: TestAuthOrigin) -> String {
        "[upstream]\nresolve = [\"auth.internal.test:\(origin.port):127.0.0.1\"]\n"
    }

    @Test("an interactive request waits for the agent's answer; kept for the session, the next one needs no agent")
    func agentAnswers() async throws {
        let origin = try await TestAuthOrigin.start(name: "agent", user: "alice", password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "answer")
            let url = "http://auth.internal.test:\(origin.port)/digest/SHA-256/auth/x"
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let answered = try connection.request("GET", url, headers: [("Authbroker-Interactive", "30")])
            #expect(answered.status == 200, "\(answered.text)")
            let again = try connection.request("GET", url)
            #expect(again.status == 200)
            try await Self.waitFor("ANSWER", in: agent)
            let transcript = Self.stop(agent)
            #expect(transcript.contains(#""realm": "digest@test""#) || transcript.contains(#""realm":"digest@test""#))
            #expect(transcript.contains("executable"))
            #expect(transcript.contains("ANSWER HTTP/1.1 200"))
            let passwords = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            #expect((passwords.json["passwords"] as? [[String: Any]])?.first?["persistence"] as? String == "session")
        }
    }

    @Test("an agent that never answers: the request gets the 401 at its deadline, and nothing stays pending")
    func deadline() async throws {
        let origin = try await TestAuthOrigin.start(name: "silent", user: "alice", password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "ignore")
            let response = try fetch(
                daemon, "http://auth.internal.test:\(origin.port)/basic/x", headers: [("Authbroker-Interactive", "1")]
            )
            #expect(response.status == 401)
            let pending = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/challenges")
            #expect((pending.json["challenges"] as? [Any])?.isEmpty == true)
            try await Self.waitFor("withdrawn", in: agent)
            let transcript = Self.stop(agent)
            #expect(transcript.contains(#""event": "withdrawn""#) || transcript.contains(#""event":"withdrawn""#))
        }
    }

    @Test("an agent that disconnects mid-challenge: the request goes on with the 401 at once; no descriptor stays open")
    func agentDisconnects() async throws {
        let origin = try await TestAuthOrigin.start(name: "gone", user: "alice", password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin) + "pool_idle_timeout_ms = 200\n") { daemon in
            let descriptors = await daemon.settledFileDescriptorCount()
            let agent = try await Self.startAgent(daemon, mode: "disconnect")
            let started = ContinuousClock.now
            let response = try fetch(
                daemon, "http://auth.internal.test:\(origin.port)/basic/x", headers: [("Authbroker-Interactive", "60")]
            )
            #expect(response.status == 401)
            #expect(ContinuousClock.now - started < .seconds(30))  // not the 60 s deadline
            _ = Self.stop(agent)
            try await Task.sleep(for: .milliseconds(100))
            #expect(daemon.log.contains("agent detached"))
            let after = await daemon.waitForFileDescriptors(atMost: descriptors)
            #expect(after <= descriptors, "open descriptors: \(descriptors) before the agent, \(after) after")
        }
    }

    @Test("a client that disconnects while its challenge waits: the challenge is withdrawn from the agent")
    func clientDisconnects() async throws {
        let origin = try await TestAuthOrigin.start(name: "impatient", user: "alice", password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "ignore")
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            try connection.send(
                "GET http://auth.internal.test:\(origin.port)/basic/x HTTP/1.1\r\nHost: x\r\nAuthbroker-Interactive: 60\r\n\r\n"
            )
            var waited = 0
            while waited < 200 {
                let pending = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/challenges")
                if let list = pending.json["challenges"] as? [[String: Any]], let first = list.first {
                    #expect(first["realm"] as? String == "basic@test")
                    #expect((first["requester"] as? [String: Any])?["pid"] != nil)
                    break
                }
                waited += 1
                try await Task.sleep(for: .milliseconds(25))
            }
            connection.close()
            var withdrawn = false
            for _ in 0..<200 {
                let pending = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/challenges")
                if (pending.json["challenges"] as? [Any])?.isEmpty == true { withdrawn = true; break }
                try await Task.sleep(for: .milliseconds(25))
            }
            #expect(withdrawn)
            try await Self.waitFor("withdrawn", in: agent)
            let transcript = Self.stop(agent)
            #expect(transcript.contains("withdrawn"))
        }
    }
}
