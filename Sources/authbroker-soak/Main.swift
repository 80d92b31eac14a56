import ArgumentParser
import Foundation
import NIOCore
import NIOConcurrencyHelpers
import TestSupport

/// The soak run of `make soak`: the real daemon under mixed traffic from many clients for
/// minutes, every response checked, its memory and descriptors sampled, then a report.
///
/// Reuses the integration tests' fixtures (TestSupport): in-process origins (plain, TLS, mTLS,
/// Basic/Digest), certificates made at run time, the daemon launcher and the byte-exact client.
@main
struct AuthBrokerSoak: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "authbroker-soak",
        abstract: "Run authbrokerd under mixed traffic for a while; check every response; report memory and descriptors.",
        discussion: """
            Example: authbroker-soak --seconds 300 --clients 16 --report bench-results/SOAK.md
            The daemon binary is found like the tests find it: $AUTHBROKER_BIN_DIR, else beside this tool.
            """)

    @Option(help: "Seconds of traffic.")
    var seconds = 300

    @Option(help: "Concurrent clients (threads, each with its own connection).")
    var clients = 16

    @Option(help: "Seconds at the start that the memory comparison leaves out (caches and pools fill).")
    var warmup = 30

    @Option(help: "Where to write the Markdown report.")
    var report = "bench-results/SOAK.md"

    func run() async throws {
        let setup = try await SoakSetup.start()
        let daemon = setup.daemon
        print("soak: daemon pid \(daemon.pid) on \(daemon.socketPath); \(self.clients) clients for \(self.seconds) s")
        let tally = Tally()
        let samples = Samples()
        let agent = SoakAgent(socketPath: daemon.socketPath, user: SoakSetup.agentUser, password: SoakSetup.password, tally: tally)
        agent.start()
        do {
            try await agent.waitUntilAttached()
        } catch {
            await daemon.stop()
            await setup.stop()
            throw error
        }
        let before = (fds: daemon.countedFileDescriptors, residentKiB: daemon.residentKiB ?? 0)

        let started = ContinuousClock.now
        let deadline = started + .seconds(self.seconds)
        let monitor = Thread {
            while ContinuousClock.now < deadline {
                samples.add(Sample(
                    seconds: (ContinuousClock.now - started).inSeconds, residentKiB: daemon.residentKiB ?? 0,
                    fds: daemon.countedFileDescriptors, completed: tally.completedCounts()
                ))
                Thread.sleep(forTimeInterval: 1)
            }
        }
        monitor.start()
        let group = DispatchGroup()
        for index in 0..<self.clients {
            group.enter()
            let client = SoakClient(index: index, setup: setup, deadline: deadline, tally: tally)
            Thread {
                client.run()
                group.leave()
            }.start()
        }
        await withCheckedContinuation { continuation in
            group.notify(queue: .global()) { continuation.resume() }
        }
        agent.stop()
        // Idle pooled connections expire after pool_idle_timeout_ms; then every descriptor the
        // traffic opened should be gone.
        try await Task.sleep(for: .seconds(3))
        let after = (fds: daemon.countedFileDescriptors, residentKiB: daemon.residentKiB ?? 0)
        let exitStatus = await daemon.stop()
        let summary = SoakReport(
            seconds: self.seconds, clients: self.clients, warmup: self.warmup, tally: tally.snapshot(),
            samples: samples.snapshot(), before: before, after: after, daemonExit: exitStatus, machine: SoakReport.machineLine()
        )
        let text = summary.markdown()
        await setup.stop()
        daemon.cleanUp()
        print(text)
        try text.write(toFile: self.report, atomically: true, encoding: .utf8)
        try summary.samplesCSV().write(toFile: Self.samplesPath(report: self.report), atomically: true, encoding: .utf8)
        if !summary.passed { throw ExitCode(1) }
    }
}

extension AuthBrokerSoak {
    /// The per-second samples go beside the report: `SOAK.md` → `SOAK-samples.csv`.
    static func samplesPath(report: String) -> String {
        let url = URL(fileURLWithPath: report)
        return url.deletingPathExtension().path + "-samples.csv"
    }
}

extension Duration {
    var inSeconds: Double { Double(self.components.seconds) + Double(self.components.attoseconds) / 1e18 }
}

/// The origins, the PKI and the daemon the soak drives, with anchors, an identity and passwords set up.
struct SoakSetup: Sendable {
    static let user = "alice"
    static let agentUser = "bob"
    static let password = "Soak-Secret-2718"

    let daemon: DaemonProcess
    let plain: TestOrigin
    let tls: TestOrigin
    let mtls: TestOrigin
    let auth: TestAuthOrigin
    let agentOrigin: TestAuthOrigin

    static func start() async throws -> SoakSetup {
        let serverCA = try TestPKI.makeCA(commonName: "Soak Server CA")
        let clientCA = try TestPKI.makeCA(commonName: "Soak Client CA")
        let client = try TestPKI.makeClient(commonName: "soak-client", issuer: clientCA)
        let plain = try await TestOrigin.start(name: "plain")
        let tls = try await TestOrigin.start(name: "tls", identity: try TestPKI.makeLeaf(dnsNames: ["tls.soak.test"], issuer: serverCA))
        let mtls = try await TestOrigin.start(
            name: "mtls", identity: try TestPKI.makeLeaf(dnsNames: ["mtls.soak.test"], issuer: serverCA), clientCA: clientCA
        )
        // The strict kind of Digest server: `nc` must rise per nonce, so the counts of concurrent
        // requests sharing a nonce over several connections are refused when they arrive out of
        // order, and the daemon must answer afresh without ever marking the password refused.
        let auth = try await TestAuthOrigin.start(
            name: "auth", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(strictCountOrder: true)
        )
        let agentOrigin = try await TestAuthOrigin.start(name: "agent", user: Self.agentUser, password: Self.password)
        let resolve = [("plain", plain.port), ("tls", tls.port), ("mtls", mtls.port), ("auth", auth.port), ("agent", agentOrigin.port)]
            .map { "\"\($0.0).soak.test:\($0.1):127.0.0.1\"" }.joined(separator: ", ")
        let config = """
            [upstream]
            resolve = [\(resolve)]
            pool_idle_timeout_ms = 1000
            max_connections_per_origin = 32
            max_idle_connections_per_origin = 16
            """
        let daemon = try await DaemonProcess.start(config: config, extraArguments: ["--log-level", "warning"])
        do {
            try Self.configure(daemon, serverCA: serverCA, clientCA: clientCA, client: client, authPort: auth.port)
        } catch {
            await daemon.stop()
            print("authbrokerd log:\n\(daemon.log)")
            daemon.cleanUp()
            throw error
        }
        return SoakSetup(daemon: daemon, plain: plain, tls: tls, mtls: mtls, auth: auth, agentOrigin: agentOrigin)
    }

    /// The anchor, the client identity and the stored password the traffic needs.
    static func configure(
        _ daemon: DaemonProcess, serverCA: TestIdentity, clientCA: TestIdentity, client: TestIdentity, authPort: Int
    ) throws {
        let control = { (method: String, path: String, body: [String: Any]) throws in
            let data = try JSONSerialization.data(withJSONObject: body)
            let response = try UnixSocketConnection(path: daemon.socketPath).request(
                method, path, headers: [("Content-Type", "application/json")], body: Array(data)
            )
            guard (200..<300).contains(response.status) else {
                throw TestSupportError("\(method) \(path): \(response.status) \(response.text)")
            }
        }
        try control("POST", "/v1/anchors", ["pem": serverCA.pem, "hosts": ["*.soak.test"]])
        try control("POST", "/v1/identities", [
            "name": "soak-client", "hosts": ["mtls.soak.test"], "cert_pem": client.pem + "\n" + clientCA.pem, "key_pem": client.privateKeyPEM,
        ])
        try control("POST", "/v1/passwords", [
            "url": "http://auth.soak.test:\(authPort)", "user": Self.user, "password": Self.password, "persistence": "session",
        ])
    }

    func stop() async {
        await self.plain.stop()
        await self.tls.stop()
        await self.mtls.stop()
        await self.auth.stop()
        await self.agentOrigin.stop()
    }
}

/// The kinds of request the clients mix, with their weights.
enum Kind: String, CaseIterable, Sendable {
    case plain, tls, mtls, basic, digest, upload, download, cancel, agent

    var weight: Int {
        switch self {
        case .plain: 30
        case .tls: 15
        case .mtls: 10
        case .basic: 10
        case .digest: 10
        case .upload: 4
        case .download: 3
        case .cancel: 4
        case .agent: 3
        }
    }

    var meaning: String {
        switch self {
        case .plain: "GET 16 KiB over HTTP"
        case .tls: "GET over HTTPS (private CA anchor)"
        case .mtls: "GET over HTTPS with a client certificate (imported identity)"
        case .basic: "GET answered with Basic from a stored password"
        case .digest: "GET answered with Digest SHA-256 from a stored password (nonce reuse, stale nonces)"
        case .upload: "POST 4 MiB, echoed back and compared"
        case .download: "GET 32 MiB, every byte compared"
        case .cancel: "GET 256 MiB, the client closes after 1 MiB"
        case .agent: "GET whose 401 waits for the agent's answer"
        }
    }
}

/// One client: a thread with a keep-alive connection, picking a kind per request.
struct SoakClient: Sendable {
    static let uploadBytes = 4 << 20
    static let downloadBytes = 32 << 20
    static let cancelBytes = 256 << 20
    static let uploadBody: [UInt8] = Array(BytePattern.chunk(offset: 0, count: uploadBytes).readableBytesView)

    let index: Int
    let setup: SoakSetup
    let deadline: ContinuousClock.Instant
    let tally: Tally

    func run() {
        var generator = SystemRandomNumberGenerator()
        var connection: UnixSocketConnection?
        let totalWeight = Kind.allCases.map(\.weight).reduce(0, +)
        while ContinuousClock.now < self.deadline {
            var pick = Int.random(in: 0..<totalWeight, using: &generator)
            let kind = Kind.allCases.first { kind in
                pick -= kind.weight
                return pick < 0
            } ?? .plain
            let started = ContinuousClock.now
            do {
                let current = try connection ?? UnixSocketConnection(path: self.setup.daemon.socketPath, timeoutSeconds: 120)
                connection = current
                let keep = try self.perform(kind, on: current)
                self.tally.record(kind, seconds: (ContinuousClock.now - started).inSeconds, failure: nil)
                // Now and then a new connection, so connection setup is part of the mix too.
                if !keep || Int.random(in: 0..<10, using: &generator) == 0 {
                    current.close()
                    connection = nil
                }
            } catch {
                self.tally.record(kind, seconds: (ContinuousClock.now - started).inSeconds, failure: "\(error)")
                connection?.close()
                connection = nil
            }
        }
        connection?.close()
    }

    /// Sends one request of `kind` and checks the response; returns whether the connection may be kept.
    private func perform(_ kind: Kind, on connection: UnixSocketConnection) throws -> Bool {
        let setup = self.setup
        switch kind {
        case .plain:
            try self.get(connection, "http://plain.soak.test:\(setup.plain.port)/bytes/16384", bytes: 16384)
        case .tls:
            try self.get(connection, "https://tls.soak.test:\(setup.tls.port)/hello", text: "hello from tls")
        case .mtls:
            try self.get(connection, "https://mtls.soak.test:\(setup.mtls.port)/hello", text: "hello from mtls")
        case .basic:
            try self.get(connection, "http://auth.soak.test:\(setup.auth.port)/basic/soak", text: "hello \(SoakSetup.user)")
        case .digest:
            try self.get(connection, "http://auth.soak.test:\(setup.auth.port)/digest/SHA-256/auth/soak", text: "hello \(SoakSetup.user)")
        case .agent:
            try self.get(
                connection, "http://agent.soak.test:\(setup.agentOrigin.port)/basic/soak", text: "hello \(SoakSetup.agentUser)",
                headers: [("Authbroker-Interactive", "60")]
            )
        case .upload:
            let response = try connection.request(
                "POST", "http://plain.soak.test:\(setup.plain.port)/echo", body: Self.uploadBody
            )
            guard response.status == 200, response.body == Self.uploadBody else {
                throw SoakFailure("upload: \(response.status), \(response.body.count) bytes echoed, content \(response.body == Self.uploadBody ? "equal" : "different")")
            }
        case .download:
            try connection.send("GET http://plain.soak.test:\(setup.plain.port)/bytes/\(Self.downloadBytes) HTTP/1.1\r\nHost: x\r\n\r\n")
            var offset = 0
            var intact = true
            let response = try connection.readResponse { slice in
                if intact && !BytePattern.matches(slice, offset: offset) { intact = false }
                offset += slice.count
            }
            guard response.status == 200, offset == Self.downloadBytes, intact else {
                throw SoakFailure("download: \(response.status), \(offset) bytes, \(intact ? "intact" : "corrupted")")
            }
        case .cancel:
            try connection.send("GET http://plain.soak.test:\(setup.plain.port)/bytes/\(Self.cancelBytes) HTTP/1.1\r\nHost: x\r\n\r\n")
            let status = try connection.readLine()
            guard status.hasPrefix("HTTP/1.1 200") else { throw SoakFailure("cancel: \(status)") }
            _ = try connection.discard(atLeast: 1 << 20)
            return false
        }
        return true
    }

    private func get(
        _ connection: UnixSocketConnection, _ url: String, bytes: Int? = nil, text: String? = nil, headers: [(String, String)] = []
    ) throws {
        let response = try connection.request("GET", url, headers: headers)
        let ok = response.status == 200 && (bytes.map { response.body.count == $0 } ?? true) && (text.map { response.text == $0 } ?? true)
        guard ok else {
            throw SoakFailure("GET \(url): \(response.status) \(response.header("Proxy-Status") ?? "") \(response.text.prefix(200))")
        }
    }
}

struct SoakFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// An agent on the socket that answers every challenge (for this request only: persistence none,
/// so every agent request needs it again).
final class SoakAgent: Sendable {
    private let socketPath: String
    private let user: String
    private let password: String
    private let tally: Tally
    private let state = NIOLockedValueBox<(attached: Bool, stopping: Bool, connection: UnixSocketConnection?)>((false, false, nil))

    init(socketPath: String, user: String, password: String, tally: Tally) {
        self.socketPath = socketPath
        self.user = user
        self.password = password
        self.tally = tally
    }

    func start() {
        Thread { self.run() }.start()
    }

    func waitUntilAttached() async throws {
        for _ in 0..<200 {
            if self.state.withLockedValue({ $0.attached }) { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw SoakFailure("the agent did not attach")
    }

    func stop() {
        let connection = self.state.withLockedValue {
            $0.stopping = true
            return $0.connection
        }
        connection?.close()
    }

    private func run() {
        do {
            let connection = try UnixSocketConnection(path: self.socketPath, timeoutSeconds: 3600)
            self.state.withLockedValue { $0.connection = connection }
            try connection.send("GET /v1/agent HTTP/1.1\r\nHost: x\r\n\r\n")
            while try !connection.readLine().isEmpty {}
            var pending: [UInt8] = []
            var agentID = ""
            while true {
                guard let size = Int(try connection.readLine().split(separator: ";").first ?? "", radix: 16), size > 0 else { break }
                pending += try connection.read(count: size)
                _ = try connection.readLine()
                while let newline = pending.firstIndex(of: 10) {
                    let line = Array(pending[..<newline])
                    pending.removeFirst(newline + 1)
                    guard let event = try JSONSerialization.jsonObject(with: Data(line)) as? [String: Any] else { continue }
                    switch event["event"] as? String {
                    case "attached":
                        agentID = event["agent"] as? String ?? ""
                        self.state.withLockedValue { $0.attached = true }
                    case "challenge":
                        guard let id = (event["challenge"] as? [String: Any])?["id"] as? String else { continue }
                        self.answer(agent: agentID, challenge: id)
                    default:
                        break
                    }
                }
            }
        } catch {
            if !self.state.withLockedValue({ $0.stopping }) { self.tally.agentError("\(error)") }
        }
    }

    private func answer(agent: String, challenge: String) {
        do {
            let body = try JSONSerialization.data(withJSONObject: [
                "challenge": challenge, "user": self.user, "password": self.password, "persistence": "none",
            ])
            let response = try UnixSocketConnection(path: self.socketPath).request(
                "POST", "/v1/agent/\(agent)/answer", headers: [("Content-Type", "application/json")], body: Array(body)
            )
            if response.status == 200 {
                self.tally.agentAnswered()
            } else {
                self.tally.agentError("answer: \(response.status) \(response.text)")
            }
        } catch {
            self.tally.agentError("answer: \(error)")
        }
    }
}

/// Counts and latencies per kind, shared by the client threads.
final class Tally: Sendable {
    struct Snapshot: Sendable {
        var latencies: [Kind: [Double]] = [:]
        var failures: [Kind: [String]] = [:]
        var agentAnswers = 0
        var agentErrors: [String] = []
    }
    private let state = NIOLockedValueBox(Snapshot())

    func record(_ kind: Kind, seconds: Double, failure: String?) {
        self.state.withLockedValue { state in
            if let failure {
                state.failures[kind, default: []].append(failure)
            } else {
                state.latencies[kind, default: []].append(seconds)
            }
        }
    }

    /// Requests completed so far, by kind.
    func completedCounts() -> [Kind: Int] { self.state.withLockedValue { $0.latencies.mapValues(\.count) } }

    func agentAnswered() { self.state.withLockedValue { $0.agentAnswers += 1 } }
    func agentError(_ text: String) { self.state.withLockedValue { $0.agentErrors.append(text) } }
    func snapshot() -> Snapshot { self.state.withLockedValue { $0 } }
}

struct Sample: Sendable {
    var seconds: Double
    var residentKiB: Int
    var fds: Int
    /// Requests completed by then, by kind.
    var completed: [Kind: Int]
}

final class Samples: Sendable {
    private let state = NIOLockedValueBox<[Sample]>([])
    func add(_ sample: Sample) { self.state.withLockedValue { $0.append(sample) } }
    func snapshot() -> [Sample] { self.state.withLockedValue { $0 } }
}
