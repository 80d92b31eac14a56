import Foundation
import Testing
import TestSupport

/// Server-trust challenges through the real daemon: a TLS origin whose certificate does not
/// verify, interactive requests, and an agent on the real socket (the wire protocol, and
/// `authbrokerctl agent` in a pseudo-terminal).
@Suite("Server-trust challenges, end to end")
struct ServerTrustAgentTests {
    /// An agent speaking the wire protocol: answers server-trust challenges with `mode`
    /// (once, always, anchor, reject), after `delay` seconds; or ignores them, or disconnects.
    static let script = AgentTests.attachPrelude + #"""
        mode, delay = sys.argv[2], float(sys.argv[3])
        answers = {"once": {"trust": "once"}, "always": {"trust": "always", "scope": "exception"},
                   "anchor": {"trust": "always", "scope": "anchor"}, "reject": {"trust": "reject"}}
        agent = None
        for raw in lines():
            event = json.loads(raw)
            print("EVENT " + json.dumps(event, sort_keys=True), flush=True)
            if event["event"] == "attached":
                agent = event["agent"]
            elif event["event"] == "challenge":
                if mode == "disconnect":
                    s.close(); sys.exit(0)
                if mode == "ignore":
                    continue
                time.sleep(delay)
                answer = dict(answers[mode]); answer["challenge"] = event["challenge"]["id"]
                body = json.dumps(answer).encode()
                c = socket.socket(socket.AF_UNIX); c.connect(path)
                c.sendall(b"POST /v1/agent/%s/answer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (agent.encode(), len(body)) + body)
                print("ANSWER " + c.recv(4096).split(b"\r\n")[0].decode(), flush=True)
                c.close()
        """#

    struct Agent {
        var process: Process
        var transcriptPath: String

        var transcript: String { (try? String(contentsOfFile: self.transcriptPath, encoding: .utf8)) ?? "" }

        /// The server-trust offers it received.
        var trustOffers: Int {
            self.transcript.split(separator: "\n").filter { $0.hasPrefix("EVENT ") && $0.contains(#""kind": "server_trust""#) }.count
        }

        /// Waits (up to 5 s) until the transcript mentions `text`.
        func waitFor(_ text: String) async throws {
            for _ in 0..<200 where !self.transcript.contains(text) {
                try await Task.sleep(for: .milliseconds(25))
            }
        }

        func stop() -> String {
            // SIGKILL: children of the test runner inherit its blocked SIGTERM.
            if self.process.isRunning { kill(self.process.processIdentifier, SIGKILL) }
            self.process.waitUntilExit()
            return self.transcript
        }
    }

    static func startAgent(_ daemon: DaemonProcess, mode: String, delay: Double = 0) async throws -> Agent {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = ["-c", Self.script, daemon.socketPath, mode, String(delay)]
        let output = daemon.directory + "/trust-agent-\(mode)-\(UUID().uuidString.prefix(8)).log"
        guard FileManager.default.createFile(atPath: output, contents: nil) else { throw TestSupportError("cannot create \(output)") }
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: output))
        process.standardOutput = handle
        process.standardError = handle
        try process.run()
        let agent = Agent(process: process, transcriptPath: output)
        try await agent.waitFor(#""event": "attached""#)
        #expect(agent.transcript.contains(#""event": "attached""#))
        return agent
    }

    static let interactive = [("Authbroker-Interactive", "30")]

    /// One self-signed origin named nas.internal.test (and alias.internal.test: same server, same certificate).
    struct SelfSignedOrigin {
        var leaf: TestIdentity
        var origin: TestOrigin
        var config: String
        var url: String { "https://nas.internal.test:\(self.origin.port)/hello" }
        var aliasURL: String { "https://alias.internal.test:\(self.origin.port)/hello" }

        static func start(name: String) async throws -> SelfSignedOrigin {
            let leaf = try TestPKI.makeLeaf(dnsNames: ["nas.internal.test", "alias.internal.test"], issuer: nil)
            let origin = try await TestOrigin.start(name: name, identity: leaf)
            let config = configText(resolving: [("nas.internal.test", origin), ("alias.internal.test", origin)])
            return SelfSignedOrigin(leaf: leaf, origin: origin, config: config)
        }
    }

    static func exceptions(_ daemon: DaemonProcess) throws -> [[String: Any]] {
        let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/exceptions")
        return response.json["exceptions"] as? [[String: Any]] ?? []
    }

    static func expectUntrusted(_ response: TestResponse, _ comment: Comment? = nil) {
        #expect(response.status == 502, comment)
        #expect(response.header("Proxy-Status")?.contains("error=tls_certificate_error") == true, comment)
        #expect(response.json["code"] as? String == "untrusted_server", comment)
    }

    @Test("once: the request proceeds, the next needs no agent, and after a restart it asks again")
    func once() async throws {
        let server = try await SelfSignedOrigin.start(name: "once")
        defer { Task { await server.origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withDaemon(config: server.config, directory: directory, keepDirectory: true) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "once")
            let answered = try fetch(daemon, server.url, headers: Self.interactive)
            #expect(answered.status == 200, "\(answered.text)")
            #expect(answered.text == "hello from once")
            let again = try fetch(daemon, server.url)
            #expect(again.status == 200)
            let transcript = agent.stop()
            #expect(agent.trustOffers == 1, "\(transcript)")
            #expect(transcript.contains(#""host": "nas.internal.test""#))
            #expect(transcript.contains(#""failures": ["self_signed"]"#))
            #expect(transcript.contains(server.leaf.sha256Fingerprint))
            #expect(transcript.contains(#""executable""#) && transcript.contains(#""pid""#))
            #expect(transcript.contains("ANSWER HTTP/1.1 200"))
            let listed = try Self.exceptions(daemon)
            #expect(listed.count == 1)
            #expect(listed.first?["persistent"] as? Bool == false)
            #expect(listed.first?["port"] as? Int == server.origin.port)
            // The exception is for this host only, though the same server presents the same certificate.
            Self.expectUntrusted(try fetch(daemon, server.aliasURL), "another host name")
        }
        try await withDaemon(config: server.config, directory: directory, keepDirectory: true) { daemon in
            #expect(try Self.exceptions(daemon).isEmpty)
            Self.expectUntrusted(try fetch(daemon, server.url), "after a restart")
            let agent = try await Self.startAgent(daemon, mode: "once")
            #expect(try fetch(daemon, server.url, headers: Self.interactive).status == 200)
            _ = agent.stop()
            #expect(agent.trustOffers == 1)
        }
    }

    @Test("always (exception): persisted, listed, survives a restart; not for another host or another certificate")
    func alwaysException() async throws {
        let server = try await SelfSignedOrigin.start(name: "always")
        let impostorLeaf = try TestPKI.makeLeaf(dnsNames: ["nas.internal.test"], issuer: nil)
        let impostor = try await TestOrigin.start(name: "impostor", identity: impostorLeaf)
        defer { Task { await server.origin.stop(); await impostor.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withDaemon(config: server.config, directory: directory, keepDirectory: true) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "always")
            #expect(try fetch(daemon, server.url, headers: Self.interactive).status == 200)
            _ = agent.stop()
            let listed = try Self.exceptions(daemon)
            #expect(listed.first?["persistent"] as? Bool == true)
            #expect(listed.first?["sha256"] as? String == server.leaf.sha256Fingerprint)
            let cli = try CLIAndClientsTests.ctl(daemon, ["exceptions", "list"])
            #expect(cli.status == 0)
            #expect(cli.stdout.contains("nas.internal.test:\(server.origin.port)"))
            #expect(cli.stdout.contains(server.leaf.sha256Fingerprint))
            #expect(cli.stdout.contains("always"))
            Self.expectUntrusted(try fetch(daemon, server.aliasURL), "another host name")
        }
        let config = configText(resolving: [("nas.internal.test", server.origin), ("nas.internal.test", impostor)])
        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            #expect(try fetch(daemon, server.url).status == 200)
            // A host-wide exception (any port) for the first certificate does not cover another one.
            let added = try CLIAndClientsTests.ctl(daemon, ["exceptions", "add", "nas.internal.test", server.leaf.sha256Fingerprint])
            #expect(added.status == 0, "\(added.stderr)")
            #expect(try fetch(daemon, server.url).status == 200)
            Self.expectUntrusted(try fetch(daemon, "https://nas.internal.test:\(impostor.port)/hello"), "another certificate")
            let removed = try CLIAndClientsTests.ctl(
                daemon, ["exceptions", "remove", "nas.internal.test:\(server.origin.port)", server.leaf.sha256Fingerprint]
            )
            #expect(removed.status == 0, "\(removed.stderr)")
            let missing = try CLIAndClientsTests.ctl(
                daemon, ["exceptions", "remove", "nas.internal.test:\(server.origin.port)", server.leaf.sha256Fingerprint]
            )
            #expect(missing.status == 8)
            let bad = try CLIAndClientsTests.ctl(daemon, ["exceptions", "add", "nas.internal.test", "12:34"])
            #expect(bad.status == 64)
        }
    }

    @Test("always (anchor): the self-signed certificate becomes an anchor scoped to the host")
    func alwaysAnchor() async throws {
        let server = try await SelfSignedOrigin.start(name: "anchor")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "anchor")
            #expect(try fetch(daemon, server.url, headers: Self.interactive).status == 200)
            _ = agent.stop()
            let anchors = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/anchors").json["anchors"] as? [[String: Any]]
            #expect(anchors?.count == 1)
            #expect(anchors?.first?["hosts"] as? [String] == ["nas.internal.test"])
            #expect((anchors?.first?["certificate"] as? [String: Any])?["sha256"] as? String == server.leaf.sha256Fingerprint)
            #expect(try Self.exceptions(daemon).isEmpty)
            #expect(try fetch(daemon, server.url).status == 200)
        }
    }

    @Test("reject: the request fails with the untrusted-server 502, and nothing is trusted")
    func reject() async throws {
        let server = try await SelfSignedOrigin.start(name: "reject")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "reject")
            Self.expectUntrusted(try fetch(daemon, server.url, headers: Self.interactive))
            _ = agent.stop()
            #expect(agent.trustOffers == 1)
            #expect(try Self.exceptions(daemon).isEmpty)
            Self.expectUntrusted(try fetch(daemon, server.url))
        }
    }

    @Test("a request that is not interactive gets the 502 at once, and no agent is asked")
    func notInteractive() async throws {
        let server = try await SelfSignedOrigin.start(name: "plain")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "once")
            Self.expectUntrusted(try fetch(daemon, server.url))
            try await Task.sleep(for: .milliseconds(200))
            _ = agent.stop()
            #expect(agent.trustOffers == 0)
        }
    }

    @Test("an agent that does not answer: 502 at the deadline, the challenge withdrawn, nothing pending")
    func deadline() async throws {
        let server = try await SelfSignedOrigin.start(name: "deadline")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "ignore")
            Self.expectUntrusted(try fetch(daemon, server.url, headers: [("Authbroker-Interactive", "1")]))
            let pending = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/challenges")
            #expect((pending.json["challenges"] as? [Any])?.isEmpty == true)
            try await agent.waitFor(#""event": "withdrawn""#)
            #expect(agent.stop().contains(#""event": "withdrawn""#))
        }
    }

    @Test("an answer naming an agent that is not attached, or that does not hold the challenge, is refused and saves nothing")
    func answerFromAnAgentThatDoesNotHoldTheChallenge() async throws {
        let server = try await SelfSignedOrigin.start(name: "rogue")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "ignore")
            let (socketPath, url) = (daemon.socketPath, server.url)
            // The interactive request waits for the agent (which never answers) on a thread of its own.
            let request = Task.detached {
                try UnixSocketConnection(path: socketPath).request("GET", url, headers: [("Authbroker-Interactive", "3")])
            }
            var challengeID: String?
            for _ in 0..<200 where challengeID == nil {
                let pending = try UnixSocketConnection(path: socketPath).request("GET", "/v1/challenges")
                challengeID = (pending.json["challenges"] as? [[String: Any]])?.first?["id"] as? String
                if challengeID == nil { try await Task.sleep(for: .milliseconds(10)) }
            }
            let challenge = try #require(challengeID)
            let attachedAgent = try #require(
                agent.transcript.split(separator: "\n").compactMap { line -> String? in
                    guard line.hasPrefix("EVENT "), let data = line.dropFirst(6).data(using: .utf8),
                        let event = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
                    else { return nil }
                    return event["agent"] as? String
                }.first
            )
            // A process of the user's that is no agent answers "always" for an agent id nobody holds.
            let answer = #"{"challenge": "\#(challenge)", "trust": "always", "scope": "exception"}"#
            for rogueAgent in ["999999", String((UInt64(attachedAgent) ?? 0) + 1)] {
                let response = try UnixSocketConnection(path: socketPath).request(
                    "POST", "/v1/agent/\(rogueAgent)/answer", headers: [("Content-Type", "application/json")], body: Array(answer.utf8)
                )
                #expect(response.status == 404, "\(response.text)")
                #expect(response.json["code"] as? String == "challenge_not_found")
                #expect(try Self.exceptions(daemon).isEmpty, "an answer from agent \(rogueAgent) saved an exception")
            }
            // The challenge still waits for its real agent: the request ends at its deadline, untrusted.
            Self.expectUntrusted(try await request.value)
            #expect(try Self.exceptions(daemon).isEmpty)
            // And once it is gone, even the real agent's late answer saves nothing.
            let late = try UnixSocketConnection(path: socketPath).request(
                "POST", "/v1/agent/\(attachedAgent)/answer", headers: [("Content-Type", "application/json")], body: Array(answer.utf8)
            )
            #expect(late.status == 404)
            #expect(try Self.exceptions(daemon).isEmpty)
            _ = agent.stop()
        }
    }

    @Test("an agent that disconnects mid-challenge: the request gets the 502 at once, not at its deadline")
    func agentDisconnects() async throws {
        let server = try await SelfSignedOrigin.start(name: "gone")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "disconnect")
            let started = ContinuousClock.now
            Self.expectUntrusted(try fetch(daemon, server.url, headers: [("Authbroker-Interactive", "60")]))
            #expect(ContinuousClock.now - started < .seconds(30))
            _ = agent.stop()
            #expect(agent.trustOffers == 1)
            let pending = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/challenges")
            #expect((pending.json["challenges"] as? [Any])?.isEmpty == true)
        }
    }

    @Test("20 concurrent interactive requests to one untrusted server: one offer, one answer, 20 responses")
    func twentyConcurrent() async throws {
        let server = try await SelfSignedOrigin.start(name: "many")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let agent = try await Self.startAgent(daemon, mode: "once", delay: 1.5)
            let statuses = NSLock()
            nonisolated(unsafe) var results: [Int] = []  // guarded by `statuses`
            let done = DispatchGroup()
            let (socketPath, url) = (daemon.socketPath, server.url)
            for _ in 0..<20 {
                done.enter()
                // Threads, not tasks: the socket client blocks, and all 20 must wait at once.
                Thread.detachNewThread {
                    let status = (try? UnixSocketConnection(path: socketPath).request("GET", url, headers: Self.interactive).status) ?? -1
                    statuses.lock()
                    results.append(status)
                    statuses.unlock()
                    done.leave()
                }
            }
            var waiting = 0
            for _ in 0..<200 {
                let pending = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/challenges")
                let list = pending.json["challenges"] as? [[String: Any]] ?? []
                waiting = list.first?["waiting"] as? Int ?? 0
                if waiting == 20 {
                    #expect(list.count == 1)
                    #expect(list.first?["kind"] as? String == "server_trust")
                    break
                }
                try await Task.sleep(for: .milliseconds(10))
            }
            #expect(waiting == 20)
            await withCheckedContinuation { continuation in
                DispatchQueue.global().async {
                    done.wait()
                    continuation.resume()
                }
            }
            let collected = statuses.withLock { results }
            #expect(collected == Array(repeating: 200, count: 20))
            _ = agent.stop()
            #expect(agent.trustOffers == 1)
        }
    }

    /// Drives `authbrokerctl agent` in a pseudo-terminal: answers the trust question with
    /// `answers` in turn, then prints everything the agent wrote.
    static let ptyDriver = #"""
        import os, pty, sys, time, select
        ctl, socket_path = sys.argv[1], sys.argv[2]
        answers = sys.argv[3:]
        pid, fd = pty.fork()
        if pid == 0:
            os.execv(ctl, [ctl, "agent", "--socket", socket_path])
        out = b""
        prompts = [b"[r]eject: ", b"[e]: "]
        deadline = time.time() + 30
        step, search_from = 0, 0
        while time.time() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    break
                if not chunk:
                    break
                out += chunk
            if step < len(answers):
                at = out.find(prompts[step], search_from)
                if at >= 0:
                    os.write(fd, (answers[step] + "\n").encode())
                    search_from = at + len(prompts[step])
                    step += 1
            if b"Answered." in out or b"Rejected." in out:
                break
        if b"Attached as agent" in out:
            sys.stdout.write("ATTACHED\n")
        sys.stdout.write(out.decode(errors="replace"))
        sys.stdout.flush()
        os.kill(pid, 9)
        """#

    @Test(
        "authbrokerctl agent shows the certificate and the requester, and answers once, always (exception or anchor) or reject",
        arguments: [(["o"], "once"), (["a", "e"], "exception"), (["a", "a"], "anchor"), (["r"], "reject")]
    )
    func cliAgent(answers: [String], outcome: String) async throws {
        let server = try await SelfSignedOrigin.start(name: "cli-\(outcome)")
        defer { Task { await server.origin.stop() } }
        try await withDaemon(config: server.config) { daemon in
            let driver = Process()
            driver.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            driver.arguments = ["-c", Self.ptyDriver, DaemonProcess.binDirectory + "/authbrokerctl", daemon.socketPath] + answers
            let output = daemon.directory + "/cli-agent.log"
            guard FileManager.default.createFile(atPath: output, contents: nil) else { throw TestSupportError("cannot create \(output)") }
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: output))
            driver.standardOutput = handle
            driver.standardError = handle
            driver.standardInput = FileHandle.nullDevice
            try driver.run()
            for _ in 0..<200 where !daemon.log.contains("agent attached") {
                try await Task.sleep(for: .milliseconds(25))
            }
            let response = try fetch(daemon, server.url, headers: Self.interactive)
            for _ in 0..<200 where driver.isRunning {
                try await Task.sleep(for: .milliseconds(25))
            }
            if driver.isRunning { kill(driver.processIdentifier, SIGKILL) }
            driver.waitUntilExit()
            let transcript = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
            #expect(transcript.contains("wants to reach https://nas.internal.test:\(server.origin.port)"), "\(transcript)")
            #expect(transcript.contains("certificate is NOT trusted"))
            #expect(transcript.contains("self-signed"))
            #expect(transcript.contains("subject:  O=AuthBroker Test PKI,CN=nas.internal.test") || transcript.contains("CN=nas.internal.test"))
            #expect(transcript.contains("issuer:"))
            #expect(transcript.contains("valid:"))
            #expect(transcript.contains("SHA-256:  \(server.leaf.sha256Fingerprint)"))
            #expect(transcript.contains("key pin:  sha256//\(server.leaf.spkiSHA256)"))
            #expect(transcript.contains("pid "))
            let exceptions = try Self.exceptions(daemon)
            let anchors = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/anchors").json["anchors"] as? [Any] ?? []
            switch outcome {
            case "reject":
                Self.expectUntrusted(response)
                #expect(transcript.contains("Rejected."))
                #expect(exceptions.isEmpty && anchors.isEmpty)
            default:
                #expect(response.status == 200, "\(transcript)")
                #expect(transcript.contains("Answered."))
                #expect(exceptions.count == (outcome == "anchor" ? 0 : 1))
                #expect(anchors.count == (outcome == "anchor" ? 1 : 0))
                if outcome != "anchor" {
                    #expect(exceptions.first?["persistent"] as? Bool == (outcome == "exception"))
                }
            }
        }
    }
}
