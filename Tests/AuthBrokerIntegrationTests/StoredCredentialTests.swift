import Foundation
import Synchronization
import Testing
import TestSupport

/// The daemon answers Basic and Digest challenges from stored passwords: the app never sees the
/// 401, the origin verifies every answer itself, and a wrong password is never sent twice.
@Suite("Stored credentials answer challenges")
struct StoredCredentialTests {
    static let user = "alice"
    static let password = "Wonderland-Secret-42"

    static func config(_ origin: TestAuthOrigin) -> String {
        "[upstream]\nresolve = [\"auth.internal.test:\(origin.port):127.0.0.1\"]\n"
    }

    static func base(_ origin: TestAuthOrigin) -> String { "http://auth.internal.test:\(origin.port)" }

    /// Stores a password through the control API (session persistence).
    @discardableResult
    static func store(
        _ daemon: DaemonProcess, url: String, user: String = user, password: String = password, realm: String? = nil,
        persistence: String = "session"
    ) throws -> TestResponse {
        var body: [String: Any] = ["url": url, "user": user, "password": password, "persistence": persistence]
        if let realm { body["realm"] = realm }
        let connection = try UnixSocketConnection(path: daemon.socketPath)
        return try connection.request("POST", "/v1/passwords", headers: [("Content-Type", "application/json")], body: jsonBody(body))
    }

    @Test(
        "every Digest algorithm and qop is answered in the daemon; the app gets the 200",
        arguments: ["MD5", "MD5-sess", "SHA-256", "SHA-256-sess", "SHA-512-256", "SHA-512-256-sess"], ["auth", "auth-int", "none"]
    )
    func digest(algorithm: String, qop: String) async throws {
        if qop == "none" && algorithm.hasSuffix("-sess") { return }  // RFC 2069 has no -sess
        let origin = try await TestAuthOrigin.start(name: "digest", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            #expect(try Self.store(daemon, url: Self.base(origin)).status == 201)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let path = "/digest/\(algorithm)/\(qop)/file.txt"
            let response = try connection.request("GET", Self.base(origin) + path)
            #expect(response.status == 200, "\(response.text)")
            #expect(response.text == "hello \(Self.user)")
            // A body is hashed into auth-int and replayed after the 401.
            let posted = try connection.request("POST", Self.base(origin) + path, body: Array("payload for auth-int".utf8))
            #expect(posted.status == 200, "\(posted.text)")
            #expect(origin.stats.failures == 0)
            #expect(origin.stats.successes == 2)
        }
    }

    @Test("Basic is answered from the store, then sent preemptively under the challenged directory")
    func basicAndPreemption() async throws {
        let origin = try await TestAuthOrigin.start(name: "basic", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<20 {
                let response = try connection.request("GET", Self.base(origin) + "/basic/docs/page\(index)")
                #expect(response.status == 200)
                #expect(response.header("WWW-Authenticate") == nil)
            }
            #expect(origin.stats.unauthorized == 1)
            #expect(origin.stats.successes == 20)
        }
    }

    @Test("preemptive Digest: 1000 requests to one space take one 401, with nc counting up and nextnonce followed")
    func digestPreemption() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "preempt", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(nextNonceEvery: 250)
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<1000 {
                let response = try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/item\(index)")
                guard response.status == 200 else {
                    Issue.record("request \(index) got \(response.status): \(response.text)")
                    return
                }
            }
            let stats = origin.stats
            print("Digest, one space, 1000 requests: \(stats.unauthorized) 401 round trips, \(stats.replays) replays, \(stats.stale) stale")
            #expect(stats.unauthorized == 1)
            #expect(stats.successes == 1000)
            #expect(stats.replays == 0)
        }
    }

    @Test("preemptive Digest keeps to the challenge's domain: other paths on the origin get no credential")
    func digestPreemptionKeepsToDomain() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "domain", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(digestDomain: "/digest/")
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<5 {
                let response = try connection.request("GET", Self.base(origin) + "/digest/MD5/auth/item\(index)")
                #expect(response.status == 200, "\(response.text)")
                let open = try connection.request("GET", Self.base(origin) + "/open/page\(index)")
                #expect(open.status == 200, "\(open.text)")
            }
            let stats = origin.stats
            // Under the domain: one 401, then up front.
            #expect(stats.unauthorized == 1)
            #expect(stats.successes == 5)
            // Outside it, nothing was sent.
            #expect(stats.openRequestsWithAuthorization == 0)
        }
    }

    @Test("preemptive Digest without a domain covers the whole origin (RFC 7616 §3.3)")
    func digestPreemptionWithoutDomain() async throws {
        let origin = try await TestAuthOrigin.start(name: "nodomain", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", Self.base(origin) + "/digest/MD5/auth/first").status == 200)
            #expect(try connection.request("GET", Self.base(origin) + "/open/page").status == 200)
            #expect(origin.stats.openRequestsWithAuthorization == 1)
        }
    }

    /// Concurrent requests over several upstream connections share one Digest nonce, so their
    /// `nc` values reach the origin out of order; an origin that insists on rising counts refuses
    /// the late ones with a plain 401. The server accepting the same password meanwhile shows that
    /// refusal is not about the password: it must not be marked refused (found by the soak, where
    /// it failed about 40% of requests).
    @Test("concurrent Digest requests to a server that insists on rising nc all succeed; the password is never marked refused")
    func concurrentDigestOutOfOrderCounts() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "strict-nc", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(strictCountOrder: true)
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let lock = NSLock()
            nonisolated(unsafe) var statuses: [Int: Int] = [:]  // guarded by `lock`
            let done = DispatchGroup()
            let (socketPath, base) = (daemon.socketPath, Self.base(origin))
            for client in 0..<12 {
                done.enter()
                // Threads, not tasks: the socket client blocks, and the clients must overlap.
                Thread.detachNewThread {
                    defer { done.leave() }
                    guard let connection = try? UnixSocketConnection(path: socketPath) else { return }
                    for index in 0..<40 {
                        let status = (try? connection.request("GET", base + "/digest/SHA-256/auth/c\(client)-\(index)").status) ?? -1
                        lock.withLock { statuses[status, default: 0] += 1 }
                    }
                }
            }
            await withCheckedContinuation { continuation in
                DispatchQueue.global().async {
                    done.wait()
                    continuation.resume()
                }
            }
            let counted = lock.withLock { statuses }
            let stats = origin.stats
            print("strict nc, 12 clients x 40 requests: \(counted), origin: \(stats.unauthorized) 401s, \(stats.replays) out-of-order or replayed counts")
            #expect(counted == [200: 480])
            let list = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            #expect((list.json["passwords"] as? [[String: Any]])?.first?["failed"] as? Bool == false)
        }
    }

    @Test("a stale nonce is retried with the new one without asking anyone")
    func staleNonce() async throws {
        let origin = try await TestAuthOrigin.start(
            name: "stale", user: Self.user, password: Self.password, behaviour: TestAuthBehaviour(staleAfter: 3)
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<10 {
                let response = try connection.request("GET", Self.base(origin) + "/digest/MD5/auth/s\(index)")
                #expect(response.status == 200, "request \(index): \(response.text)")
            }
            #expect(origin.stats.stale > 0)
            #expect(origin.stats.failures == 0)
        }
    }

    @Test("a wrong stored password is sent once, marked failed, and never again; the app gets the 401 with only Basic/Digest")
    func wrongPassword() async throws {
        let origin = try await TestAuthOrigin.start(name: "wrong", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin), password: "not-the-password")
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let first = try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x")
            #expect(first.status == 401)
            #expect(first.header("WWW-Authenticate")?.hasPrefix("Digest ") == true)
            #expect(origin.stats.failures == 1)
            for _ in 0..<5 {
                #expect(try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x").status == 401)
            }
            #expect(origin.stats.failures == 1)  // never sent again

            let list = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            let passwords = list.json["passwords"] as? [[String: Any]]
            #expect(passwords?.first?["failed"] as? Bool == true)

            // Replacing it clears the mark.
            try Self.store(daemon, url: Self.base(origin))
            #expect(try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x").status == 200)

            await daemon.stop()
            #expect(!daemon.log.contains(Self.password))
            #expect(!daemon.log.contains("not-the-password"))
        }
    }

    @Test("a refused password stored for a realm marks that password only, not the one stored for any realm; removed, no mark stays")
    func refusalMarksThePasswordSent() async throws {
        let origin = try await TestAuthOrigin.start(name: "realm-mark", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            try Self.store(daemon, url: Self.base(origin), password: "wrong-for-the-realm", realm: TestAuthOrigin.basicRealm)
            // The realm's own password is the one sent, and refused.
            #expect(try fetch(daemon, Self.base(origin) + "/basic/x").status == 401)
            #expect(origin.stats.failures == 1)
            func marks() throws -> [String?: Bool] {
                let list = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
                let passwords = list.json["passwords"] as? [[String: Any]] ?? []
                return Dictionary(passwords.map { ($0["realm"] as? String, $0["failed"] as? Bool ?? false) }, uniquingKeysWith: { a, _ in a })
            }
            func warnings() throws -> [String] {
                try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status").json["warnings"] as? [String] ?? []
            }
            #expect(try marks() == [nil: false, TestAuthOrigin.basicRealm: true], "the password stored for any realm was marked too")
            let marked = try warnings()
            #expect(marked.contains { $0.hasPrefix("1 stored password(s) were refused") }, "\(marked)")

            let query = "url=\(Self.base(origin))&user=\(Self.user)&realm=\(TestAuthOrigin.basicRealm)"
                .addingPercentEncoding(withAllowedCharacters: .urlQueryAllowed.subtracting(CharacterSet(charactersIn: "@:/")).union(CharacterSet(charactersIn: "=&")))
            let removed = try UnixSocketConnection(path: daemon.socketPath).request("DELETE", "/v1/passwords?" + (query ?? ""))
            #expect(removed.status == 200, "\(removed.text)")
            #expect(try marks() == [nil: false])
            let cleared = try warnings()
            #expect(!cleared.contains { $0.contains("were refused") }, "\(cleared)")
            // The password for any realm, never refused, now answers.
            #expect(try fetch(daemon, Self.base(origin) + "/basic/x").status == 200)
        }
    }

    /// `count` GETs of `url` at once, each on a connection and a thread of its own; their statuses, sorted.
    static func parallelGets(_ daemon: DaemonProcess, _ url: String, count: Int) -> [Int] {
        final class Statuses: Sendable { let list = Mutex<[Int]>([]) }
        let statuses = Statuses()
        let group = DispatchGroup()
        for _ in 0..<count {
            group.enter()
            Thread.detachNewThread {
                let status = (try? fetch(daemon, url).status) ?? -1
                statuses.list.withLock { $0.append(status) }
                group.leave()
            }
        }
        group.wait()
        return statuses.list.withLock { $0.sorted() }
    }

    @Test("parallel requests meeting one challenge try an unproven password once between them: a wrong one is refused once, not once each")
    func parallelRequestsTryAPasswordOnce() async throws {
        let origin = try await TestAuthOrigin.start(name: "parallel", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            // Every answer takes 300 ms: all eight meet the 401 before any answer is refused.
            let url = Self.base(origin) + "/basic/x?delay-ms=300"
            try Self.store(daemon, url: Self.base(origin), password: "not-the-password")
            #expect(Self.parallelGets(daemon, url, count: 8) == Array(repeating: 401, count: 8))
            #expect(origin.stats.failures == 1, "the wrong password was sent \(origin.stats.failures) times by eight requests")

            // The right one: proven by one request, then sent by all.
            try Self.store(daemon, url: Self.base(origin))
            #expect(Self.parallelGets(daemon, url, count: 8) == Array(repeating: 200, count: 8))
            #expect(origin.stats.failures == 1)

            // Replaced by a wrong one: not sent up front (it is not proven), tried once.
            try Self.store(daemon, url: Self.base(origin), password: "replaced-by-a-wrong-one")
            #expect(Self.parallelGets(daemon, url, count: 8) == Array(repeating: 401, count: 8))
            #expect(origin.stats.failures == 2, "the wrong replacement was sent \(origin.stats.failures - 1) times by eight requests")
        }
    }

    @Test("a right password replaced by a wrong one is sent once (not up front: it is not proven; on trial after the 401), not again")
    func wrongReplacementSentOnce() async throws {
        let origin = try await TestAuthOrigin.start(name: "replaced", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x").status == 200)
            #expect(origin.stats.failures == 0)

            try Self.store(daemon, url: Self.base(origin), password: "replaced-by-a-wrong-one")
            let refused = try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x")
            #expect(refused.status == 401)
            #expect(origin.stats.failures == 1, "the wrong password was sent \(origin.stats.failures) times for one request")
            #expect(try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x").status == 401)
            #expect(origin.stats.failures == 1, "a password marked failed was sent again")
        }
    }

    @Test("a password answered with Digest is never sent as Basic afterwards, in another realm either, not after a restart")
    func noDowngradeToBasic() async throws {
        let origin = try await TestAuthOrigin.start(name: "downgrade", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try await withDaemon(config: Self.config(origin), directory: directory, keepDirectory: true) { daemon in
            // Stored for any realm at this http:// origin, and answered with Digest.
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", Self.base(origin) + "/digest/SHA-256/auth/x").status == 200)
            let successes = origin.stats.successes

            // Now the server (or whoever is on the path) offers only Basic, in another realm.
            let downgraded = try connection.request("GET", Self.base(origin) + "/basic/x")
            #expect(downgraded.status == 401, "the password was sent as Basic after a Digest answer")
            #expect(downgraded.header("WWW-Authenticate")?.hasPrefix("Basic") == true)
            #expect(origin.stats.successes == successes)
            #expect(origin.stats.failures == 0)
            await daemon.stop()  // the log is written in batches: all of it is there once stopped
            #expect(daemon.log.contains("not sending as Basic"))
        }
        try await withDaemon(config: Self.config(origin), directory: directory, keepDirectory: true) { daemon in
            // The mark is kept with the password: a restarted daemon (session password gone,
            // stored again the same) still refuses the downgrade.
            try Self.store(daemon, url: Self.base(origin), persistence: "permanent")
            #expect(try fetch(daemon, Self.base(origin) + "/digest/MD5/auth/x").status == 200)
            await daemon.stop()
        }
        try await withDaemon(config: Self.config(origin), directory: directory, keepDirectory: true) { daemon in
            let downgraded = try fetch(daemon, Self.base(origin) + "/basic/x")
            #expect(downgraded.status == 401, "after a restart the password was sent as Basic")
        }
    }

    @Test("a password never answered with Digest is still sent as Basic")
    func basicStaysBasic() async throws {
        let origin = try await TestAuthOrigin.start(name: "basic-only", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            #expect(try fetch(daemon, Self.base(origin) + "/basic/x").status == 200)
            #expect(try fetch(daemon, Self.base(origin) + "/digest/SHA-256/auth/x").status == 200)
        }
    }

    @Test("a credential the app sends itself is forwarded untouched and never replaced")
    func clientCredential() async throws {
        let origin = try await TestAuthOrigin.start(name: "client", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            try Self.store(daemon, url: Self.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let wrong = Data("alice:typed-wrong".utf8).base64EncodedString()
            let response = try connection.request(
                "GET", Self.base(origin) + "/basic/x", headers: [("Authorization", "Basic \(wrong)")]
            )
            #expect(response.status == 401)
            #expect(origin.stats.failures == 1)
            #expect(origin.stats.successes == 0)
        }
    }

    @Test("no stored password: the app gets the origin's 401")
    func nothingStored() async throws {
        let origin = try await TestAuthOrigin.start(name: "none", user: Self.user, password: Self.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: Self.config(origin)) { daemon in
            let response = try fetch(daemon, Self.base(origin) + "/basic/x")
            #expect(response.status == 401)
            #expect(response.header("WWW-Authenticate")?.contains("basic@test") == true)
        }
    }
}

@Suite("Credentials the app supplies, and the audit log")
struct PersistAndAuditTests {
    @Test("Authbroker-Persist: session keeps a Basic credential the server accepted, for its realm; later requests need none")
    func persistSession() async throws {
        let origin = try await TestAuthOrigin.start(name: "persist", user: "alice", password: StoredCredentialTests.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: StoredCredentialTests.config(origin)) { daemon in
            let url = StoredCredentialTests.base(origin) + "/basic/x"
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", url).status == 401)
            let basic = Data("alice:\(StoredCredentialTests.password)".utf8).base64EncodedString()
            let supplied = try connection.request(
                "GET", url, headers: [("Authorization", "Basic \(basic)"), ("Authbroker-Persist", "session")]
            )
            #expect(supplied.status == 200)
            #expect(try connection.request("GET", url).status == 200)
            let list = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            let first = (list.json["passwords"] as? [[String: Any]])?.first
            #expect(first?["realm"] as? String == TestAuthOrigin.basicRealm)
            #expect(first?["persistence"] as? String == "session")
        }
    }

    @Test("the process is the one that connected: one that exec'd another program on the connection is logged as the first")
    func peerReadAtAccept() async throws {
        let origin = try await TestAuthOrigin.start(name: "exec", user: "alice", password: StoredCredentialTests.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: StoredCredentialTests.config(origin)) { daemon in
            try StoredCredentialTests.store(daemon, url: StoredCredentialTests.base(origin))
            // Python connects, then (once the daemon has had time to accept) becomes perl (same
            // pid, same start time), which sends the request on the inherited connection.
            let perl = #"open(my $s, "+<&=", $ARGV[0]) or die; binmode $s; syswrite($s, "GET $ARGV[1] HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); my $b; while (sysread($s, $b, 65536)) { print $b; }"#
            let python = #"import os, socket, sys, time; s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); time.sleep(0.5); fd = s.detach(); os.set_inheritable(fd, True); os.execv("/usr/bin/perl", ["perl", "-e", sys.argv[3], str(fd), sys.argv[2]])"#
            let run = try CLIAndClientsTests.run(
                "/usr/bin/env", ["python3", "-c", python, daemon.socketPath, StoredCredentialTests.base(origin) + "/digest/MD5/auth/exec", perl]
            )
            #expect(run.stdout.hasPrefix("HTTP/1.1 200"), "\(run.stdout) \(run.stderr)")
            await daemon.stop()  // the audit log is written in batches: all of it is there once stopped
            let text = try String(contentsOfFile: daemon.directory + "/state/authbroker/audit.jsonl", encoding: .utf8)
            let executable = text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
                .last?["executable"] as? String
            #expect(executable?.contains("python") == true, "the peer was read after it exec'd: \(executable ?? "none")")
        }
    }

    @Test("the audit log records which process used which stored credential for which server, never the secret")
    func auditLog() async throws {
        let origin = try await TestAuthOrigin.start(name: "audit", user: "alice", password: StoredCredentialTests.password)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: StoredCredentialTests.config(origin)) { daemon in
            try StoredCredentialTests.store(daemon, url: StoredCredentialTests.base(origin))
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", StoredCredentialTests.base(origin) + "/digest/MD5/auth/a").status == 200)
            #expect(try connection.request("GET", StoredCredentialTests.base(origin) + "/digest/MD5/auth/b").status == 200)
            // Written in batches off the request's thread; a stop writes whatever is still queued.
            await daemon.stop()
            let text = try String(contentsOfFile: daemon.directory + "/state/authbroker/audit.jsonl", encoding: .utf8)
            let lines = text.split(separator: "\n").compactMap { try? JSONSerialization.jsonObject(with: Data($0.utf8)) as? [String: Any] }
            #expect(lines.count == 2)
            #expect(lines.allSatisfy { $0["event"] as? String == "credential_used" && $0["user"] as? String == "alice" })
            #expect(lines.first?["realm"] as? String == TestAuthOrigin.digestRealm)
            #expect(lines.first?["pid"] as? Int == Int(getpid()))
            #expect((lines.first?["executable"] as? String)?.contains("AuthBrokerPackageTests") == true)
            #expect(!text.contains(StoredCredentialTests.password))
            let attributes = try FileManager.default.attributesOfItem(atPath: daemon.directory + "/state/authbroker/audit.jsonl")
            #expect((attributes[.posixPermissions] as? Int) == 0o600)
        }
    }
}
