import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The client connection's direct relay: plain requests answered by channel handlers, with
/// everything else, and every challenge, on the full path. Each test uses one client connection:
/// its first request goes the full path and leaves a pooled connection on that connection's event
/// loop, which the following requests are relayed on.
@Suite("Direct relay")
struct DirectRelayTests {
    /// One of the daemon's counters in `GET /v1/status`, or -1.
    static func counter(_ daemon: DaemonProcess, _ name: String) throws -> Int {
        let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
        return (status.json["counters"] as? [String: Any])?[name] as? Int ?? -1
    }

    /// A daemon whose `origin.internal.test` is a new test origin named `name`, with `extra`
    /// settings; `body` gets the daemon and the origin's base URL.
    static func withRelayedOrigin(
        _ name: String, extra: String = "", _ body: (DaemonProcess, String) async throws -> Void
    ) async throws {
        let origin = try await TestOrigin.start(name: name)
        defer { Task { await origin.stop() } }
        let base = "http://origin.internal.test:\(origin.port)"
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)], extra: extra)) { daemon in
            try await body(daemon, base)
        }
    }

    /// One request on a connection of its own, so the pool holds a connection to `base`.
    static func warmUp(_ daemon: DaemonProcess, _ base: String) throws {
        let warm = try UnixSocketConnection(path: daemon.socketPath)
        #expect(try warm.request("GET", "\(base)/hello").status == 200)
        warm.close()
    }

    static func relayedCount(_ daemon: DaemonProcess) throws -> Int {
        try Self.counter(daemon, "requests_relayed_directly")
    }

    /// Sends `GET base/hello` on `connection` until the relay answers one (at most 50 tries);
    /// whether it did. A request right after one of the full path's may take the full path too:
    /// the full path reports its request done, and gives its upstream connection back to the
    /// pool, just after the response's last byte is written, which the client may beat. From a
    /// relayed request on, the relay takes the connection's plain requests to that origin.
    static func untilRelayed(_ daemon: DaemonProcess, _ connection: UnixSocketConnection, _ base: String) async throws -> Bool {
        try await Self.untilRelayed(daemon) {
            let response = try connection.request("GET", "\(base)/hello")
            #expect(response.status == 200)
        }
    }

    /// Runs `send` (one plain request) until the relay answers one; whether it did.
    static func untilRelayed(_ daemon: DaemonProcess, _ send: () throws -> Void) async throws -> Bool {
        for _ in 0..<50 {
            let before = try Self.relayedCount(daemon)
            try send()
            if try Self.relayedCount(daemon) > before { return true }
            try await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    /// The daemon's log once it holds `count` lines that pass `filter` (access lines are batched,
    /// up to 100 ms late), or after 5 s.
    static func logLines(_ daemon: DaemonProcess, atLeast count: Int, _ filter: (Substring) -> Bool) async -> [Substring] {
        var lines: [Substring] = []
        for _ in 0..<50 {
            lines = daemon.log.split(separator: "\n").filter(filter)
            if lines.count >= count { break }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return lines
    }

    /// `name` once it reads `expected` (each read is a status request on a connection of its own,
    /// whose predecessors the daemon may not have seen close yet), or its last value after 5 s.
    static func counter(_ daemon: DaemonProcess, _ name: String, settlesAt expected: Int) async throws -> Int {
        var value = try Self.counter(daemon, name)
        for _ in 0..<100 where value != expected {
            try await Task.sleep(for: .milliseconds(50))
            value = try Self.counter(daemon, name)
        }
        return value
    }

    /// A connection costs its task's memory only once the full path is needed: until then the
    /// relay answers it alone. A connection that never needed it still closes cleanly, when the
    /// client goes and when the daemon stops.
    @Test("a connection whose requests were all relayed holds no task until one is not")
    func relayedConnectionsHoldNoTask() async throws {
        // A grace period longer than the test's reads: waiting it out for an idle connection fails.
        try await Self.withRelayedOrigin("lazy", extra: "[daemon]\nshutdown_grace_seconds = 120") { daemon, base in
            // An idle pooled connection for the relay; the connection that made it closes.
            let primer = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try await Self.untilRelayed(daemon, primer, base))
            primer.close()
            let before = try Self.relayedCount(daemon)
            let clients = try (0..<5).map { _ in try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 30) }
            for client in clients { #expect(try client.request("GET", "\(base)/hello").status == 200) }
            #expect(try Self.relayedCount(daemon) - before == 5, "each connection's request was relayed")
            // Five idle connections and the status request's own: only the last has a task.
            #expect(try await Self.counter(daemon, "client_connections_open", settlesAt: 6) == 6)
            #expect(try await Self.counter(daemon, "client_connections_on_full_path", settlesAt: 1) == 1)

            // A control request is the full path's: that connection gets its task, and keeps its relay.
            #expect(try clients[0].request("GET", "/v1/status").status == 200)
            #expect(try await Self.counter(daemon, "client_connections_on_full_path", settlesAt: 2) == 2)
            #expect(try await Self.untilRelayed(daemon, clients[0], base))

            // Clients that leave, relayed only or not, leave nothing open behind them.
            clients[0].close()
            clients[1].close()
            #expect(try await Self.counter(daemon, "client_connections_open", settlesAt: 4) == 4)
            #expect(try await Self.counter(daemon, "client_connections_on_full_path", settlesAt: 1) == 1)

            // SIGTERM closes the idle ones at once: no task had to see it first.
            kill(daemon.pid, SIGTERM)
            for client in clients[2...] { _ = try client.readToEnd() }  // EOF, or a throw at 30 s
            #expect(await daemon.waitForExit() == 0)
            #expect(!daemon.log.contains("grace period over"))
        }
    }

    /// With `io_threads = 2`, two client connections opened one after the other land on the
    /// daemon's two event loops. Only one loop has the pooled connection; the other's first
    /// request borrows it and starts one on its own loop, so that both connections are relayed
    /// from then on.
    @Test("client connections on either event loop are relayed once a connection is made on their loop")
    func relayOnEveryEventLoop() async throws {
        try await Self.withRelayedOrigin("loops", extra: "[daemon]\nio_threads = 2") { daemon, base in
            #expect(daemon.log.contains("io_threads=2"), "the daemon runs two event loops")
            try Self.warmUp(daemon, base)
            let clients = [try UnixSocketConnection(path: daemon.socketPath), try UnixSocketConnection(path: daemon.socketPath)]
            for client in clients { #expect(try client.request("GET", "\(base)/hello").status == 200) }
            // The connection started for the other loop is made meanwhile (loopback, no TLS);
            // on a loaded machine that can take a while, so wait for it rather than a set time.
            for _ in 0..<200 where try Self.counter(daemon, "upstream_connections_open") < 2 {
                try await Task.sleep(for: .milliseconds(50))
            }
            let before = try Self.relayedCount(daemon)
            for client in clients {
                for _ in 0..<4 { #expect(try client.request("GET", "\(base)/hello").status == 200) }
            }
            #expect(try Self.relayedCount(daemon) - before == 8, "every later request of both connections is relayed")
            let open = try Self.counter(daemon, "upstream_connections_open")
            #expect(open == 2, "one pooled connection per event loop: \(open)")
        }
    }

    /// The relay keeps an HTTPS route, client identity choice and all, per client connection. A
    /// change to the identities, or an identity's validity starting, must end it at once: else
    /// the connection would go on without the certificate the user just imported.
    @Test("an HTTPS route kept by the relay follows identity imports, removals and validity")
    func keptRouteFollowsIdentities() async throws {
        let serverCA = try TestPKI.makeCA(commonName: "Relay Server CA")
        let server = try TestPKI.makeLeaf(dnsNames: ["optional.internal.test"], issuer: serverCA)
        let clientCA = try TestPKI.makeCA(commonName: "Relay Client CA")
        let origin = try await TestOrigin.start(
            name: "optional-mtls", identity: server, clientCA: clientCA, clientCertificateOptional: true
        )
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("optional.internal.test", origin)])) { daemon in
            #expect(try addAnchor(daemon, pem: serverCA.pem, hosts: ["optional.internal.test"]).status == 201)
            let url = "https://optional.internal.test:\(origin.port)/client-cert"
            let client = try UnixSocketConnection(path: daemon.socketPath)
            func certificate() throws -> String {
                let response = try client.request("GET", url)
                #expect(response.status == 200, "\(response.text)")
                return response.text
            }
            func importIdentity(_ identity: TestIdentity, name: String) throws {
                let cert = daemon.directory + "/\(name).crt", key = daemon.directory + "/\(name).key"
                try identity.pem.write(toFile: cert, atomically: true, encoding: .utf8)
                try identity.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
                let run = try CLIAndClientsTests.ctl(
                    daemon, ["identities", "import", "--cert", cert, "--key", key, "--name", name, "--hosts", "optional.internal.test"]
                )
                #expect(run.status == 0, "\(run.stderr)")
            }

            #expect(try certificate() == "none")
            let relayedFirst = try await Self.untilRelayed(daemon) {
                let presented = try certificate()
                #expect(presented == "none")
            }
            #expect(relayedFirst, "relayed on the connection the first request pooled")

            try importIdentity(try TestPKI.makeClient(commonName: "now", issuer: clientCA), name: "relay-now")
            #expect(try certificate() == "presented", "an import ends the kept route")
            #expect(try CLIAndClientsTests.ctl(daemon, ["identities", "remove", "relay-now"]).status == 0)
            #expect(try certificate() == "none", "so does a removal")
            // (That went the full path: a change to the store retires pooled TLS connections.)
            let relayedAgain = try await Self.untilRelayed(daemon) {
                let presented = try certificate()
                #expect(presented == "none")
            }
            #expect(relayedAgain, "relayed again, without an identity")

            let validFrom = Date.now + 3
            try importIdentity(try TestPKI.makeClient(commonName: "soon", issuer: clientCA, notBefore: validFrom), name: "relay-soon")
            #expect(try certificate() == "none", "not valid yet")
            try await Task.sleep(for: .seconds(validFrom.timeIntervalSinceNow + 1.5))
            #expect(try certificate() == "presented", "its validity starting ends the kept route")
        }
    }

    @Test("plain keep-alive GETs and HEADs are relayed, with the full path's headers, bodies and log lines")
    func plainRequestsAreRelayed() async throws {
        // Not `withRelayedOrigin`: the Host check below needs the origin's port.
        let origin = try await TestOrigin.start(name: "relay")
        defer { Task { await origin.stop() } }
        let base = "http://origin.internal.test:\(origin.port)"
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin)])) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            var ids: Set<String> = []
            for index in 0..<20 {
                let response = try connection.request("GET", "\(base)/hello")
                #expect(response.status == 200, "request \(index)")
                #expect(response.text == "hello from relay")
                #expect(response.header("Via")?.contains("authbrokerd") == true)
                ids.insert(response.header("Authbroker-Request-Id") ?? "")
            }
            #expect(ids.count == 20 && !ids.contains(""), "every response has its own request id")
            let head = try connection.request("HEAD", "\(base)/hello")
            #expect(head.status == 200 && head.body.isEmpty)
            let big = try connection.request("GET", "\(base)/chunked/300000")
            #expect(big.status == 200 && big.body.count == 300_000 && BytePattern.matches(big.body[...], offset: 0))
            let notFound = try connection.request("GET", "\(base)/status/404")
            #expect(notFound.status == 404 && notFound.header("Proxy-Status") == nil)
            let headers = try connection.request("GET", "\(base)/headers?q=1", headers: [("X-Kept", "yes"), ("Keep-Alive", "timeout=5")])
            let fields = (headers.json["headers"] as? [[String]] ?? []).map { ($0[0].lowercased(), $0[1]) }
            #expect(fields.contains { $0 == ("x-kept", "yes") })
            #expect(!fields.contains { $0.0 == "keep-alive" })
            #expect(fields.first { $0.0 == "host" }?.1 == "origin.internal.test:\(origin.port)")

            let relayed = try Self.relayedCount(daemon)
            #expect(relayed >= 23, "relayed directly: \(relayed) of 24")
            // The relay's requests are logged like the full path's (origin only, never the path).
            let lines = await Self.logLines(daemon, atLeast: 24) { $0.contains(" request ") && $0.contains("target=\(base)") }
            #expect(lines.count == 24, "access lines: \(lines.count)")
            #expect(!daemon.log.contains("/headers?q=1"))
        }
    }

    @Test("requests the relay must not take go the full path: bodies, directives, credentials, Expect, Connection: close")
    func otherRequestsTakeTheFullPath() async throws {
        try await Self.withRelayedOrigin("full") { daemon, base in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try await Self.untilRelayed(daemon, connection, base))
            let before = try Self.relayedCount(daemon)
            #expect(try connection.request("POST", "\(base)/echo", body: Array("abc".utf8)).text == "abc")
            #expect(try connection.request("GET", "\(base)/hello", headers: [("Authbroker-Interactive", "1")]).status == 200)
            #expect(try connection.request("GET", "\(base)/hello", headers: [("Authorization", "Basic dTpw")]).status == 200)
            #expect(try connection.request("DELETE", "\(base)/status/204").status == 204)
            #expect(try connection.request("GET", "\(base)/hello", headers: [("Connection", "close")]).status == 200)
            #expect(try Self.relayedCount(daemon) == before + 0, "none of these was relayed")
        }
    }

    @Test("pipelined requests, relayed and not, are answered in order")
    func pipelinedMixture() async throws {
        try await Self.withRelayedOrigin("pipelined") { daemon, base in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            let get = "GET \(base)/hello HTTP/1.1\r\nHost: x\r\n\r\n"
            var text = ""
            for index in 0..<30 {
                switch index % 5 {
                case 1: text += "POST \(base)/echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nn\(String(format: "%03d", index))"
                case 3: text += "GET \(base)/bytes/\(70_000 + index) HTTP/1.1\r\nHost: x\r\n\r\n"
                default: text += get
                }
            }
            try connection.send(text)
            for index in 0..<30 {
                let response = try connection.readResponse()
                #expect(response.status == 200, "response \(index)")
                switch index % 5 {
                case 1: #expect(response.text == "n\(String(format: "%03d", index))", "response \(index)")
                case 3: #expect(response.body.count == 70_000 + index, "response \(index)")
                default: #expect(response.text == "hello from pipelined", "response \(index)")
                }
            }
            #expect(try Self.relayedCount(daemon) > 0)
            // The connection is still in step.
            #expect(try connection.request("GET", "\(base)/hello").text == "hello from pipelined")
        }
    }

    @Test("a hundred requests pipelined behind a slow relayed one are held, then answered in order")
    func manyHeldBehindASlowRelay() async throws {
        try await Self.withRelayedOrigin("held") { daemon, base in
            let connection = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 30)
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            var text = "GET \(base)/slow-head/400 HTTP/1.1\r\nHost: x\r\n\r\n"
            for index in 0..<100 {
                text += "GET \(base)/bytes/\(1000 + index) HTTP/1.1\r\nHost: x\r\n\r\n"
            }
            try connection.send(text)
            #expect(try connection.readResponse().status == 200)
            for index in 0..<100 {
                let response = try connection.readResponse()
                guard response.status == 200, response.body.count == 1000 + index else {
                    Issue.record("response \(index): \(response.status) with \(response.body.count) bytes")
                    return
                }
            }
            #expect(try Self.relayedCount(daemon) >= 50)
            #expect(try connection.request("GET", "\(base)/hello").text == "hello from held")
        }
    }

    @Test("a 401 on the relay is taken over by the full path: a stored password answers it, the origin sees one 401")
    func challengeIsAdopted() async throws {
        let origin = try await TestAuthOrigin.start(name: "adopt", user: "alice", password: "Wonderland-Secret-42")
        defer { Task { await origin.stop() } }
        let base = "http://auth.internal.test:\(origin.port)"
        try await withDaemon(config: "[upstream]\nresolve = [\"auth.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let relayed = try await Self.untilRelayed(daemon) {
                let response = try connection.request("GET", "\(base)/open/a")
                #expect(response.status == 200)
            }
            #expect(relayed)

            // No password stored: the 401 reaches the app, sent once to the origin per request.
            let refused = try connection.request("GET", "\(base)/basic/x")
            #expect(refused.status == 401)
            #expect(refused.header("WWW-Authenticate")?.contains("basic@test") == true)
            #expect(origin.stats.unauthorized == 1)

            let stored = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/passwords", headers: [("Content-Type", "application/json")],
                body: jsonBody(["url": base, "user": "alice", "password": "Wonderland-Secret-42", "persistence": "session"])
            )
            #expect(stored.status == 201)
            #expect(try connection.request("GET", "\(base)/open/c").status == 200)
            let answered = try connection.request("GET", "\(base)/basic/y")
            #expect(answered.status == 200 && answered.text == "hello alice")
            #expect(origin.stats.unauthorized == 2, "one 401 for this request, not one per send")
            #expect(origin.stats.successes == 1)
            // The space is known now: its requests carry the password up front, on the full path.
            #expect(try connection.request("GET", "\(base)/basic/z").status == 200)
            #expect(origin.stats.unauthorized == 2)
            #expect(!daemon.log.contains("Wonderland-Secret-42"))
        }
    }

    @Test("on the relay as on the full path: a 200's final Negotiate token is removed, an origin's 407 reaches the app with standard challenges only")
    func relayedHeadsFollowTheChallengeRules() async throws {
        try await Self.withRelayedOrigin("relay-challenges") { daemon, base in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try await Self.untilRelayed(daemon, connection, base))
            // Each answer on the relay, then on the full path (a directive keeps it off the relay).
            for (path, headers) in [("relay", [(String, String)]()), ("full path", [("Authbroker-Interactive", "1")])] {
                let before = try Self.relayedCount(daemon)
                let token = try connection.request("GET", "\(base)/offer-challenges/final-token", headers: headers)
                #expect(token.status == 200)
                let offered = token.headers.filter { $0.0.lowercased() == "www-authenticate" }.map(\.1)
                #expect(offered == [#"Basic realm="after""#], "\(path): \(offered)")

                let originChallenge = try connection.request("GET", "\(base)/offer-challenges/407", headers: headers)
                #expect(originChallenge.status == 407)
                // Proxy-Authenticate is hop-by-hop: the broker is the app's proxy, and it makes
                // no such challenge.
                #expect(originChallenge.header("Proxy-Authenticate") == nil, "\(path)")
                #expect(originChallenge.header("Proxy-Status") == nil, "\(path)")
                let originOffered = originChallenge.headers.filter { $0.0.lowercased() == "www-authenticate" }.map(\.1)
                #expect(originOffered == [#"Basic realm="origin-407""#], "\(path): \(originOffered)")
                let relayed = try Self.relayedCount(daemon) - before
                #expect(relayed == (path == "relay" ? 2 : 0), "\(path): relayed \(relayed)")
            }
        }
    }

    @Test("on the relay: a stalled head is 504, a pooled connection the origin closed is retried, a cut body cuts the client")
    func upstreamFaults() async throws {
        let origin = try await FaultyOrigin.start()
        defer { Task { await origin.stop() } }
        let config = """
            [upstream]
            resolve = ["faulty.internal.test:\(origin.port):127.0.0.1"]
            response_head_timeout_ms = 500
            """
        let base = "http://faulty.internal.test:\(origin.port)"
        try await withDaemon(config: config) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath, timeoutSeconds: 20)
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            let stalled = try connection.request("GET", "\(base)/stall-head")
            #expect(stalled.status == 504)
            #expect(stalled.header("Proxy-Status")?.contains("http_response_timeout") == true)
            // The same client connection carries on.
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            let reset = try connection.request("GET", "\(base)/reset-before-head")
            #expect(reset.status == 502)
            #expect(reset.header("Proxy-Status")?.contains("connection_terminated") == true)
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            // Each fault costs its pooled connection, so the /hello after it goes the full path.
            #expect(try Self.relayedCount(daemon) >= 1)
            try connection.send("GET \(base)/short-body HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(throws: (any Error).self) { _ = try connection.readResponse() }
            #expect(try fetch(daemon, "\(base)/hello").status == 200)
            #expect(await !Self.logLines(daemon, atLeast: 1) { $0.contains("error=aborted") }.isEmpty)
        }
    }

    @Test("a client leaving mid-download on the relay closes the upstream connection; descriptors return")
    func clientLeavesMidRelay() async throws {
        try await Self.withRelayedOrigin("leave") { daemon, base in
            try Self.warmUp(daemon, base)
            let before = await daemon.settledFileDescriptorCount()
            for _ in 0..<5 {
                let connection = try UnixSocketConnection(path: daemon.socketPath)
                #expect(try connection.request("GET", "\(base)/hello").status == 200)
                try connection.send("GET \(base)/bytes/\(500 * 1024 * 1024) HTTP/1.1\r\nHost: x\r\n\r\n")
                _ = try connection.discard(atLeast: 1024 * 1024)
                connection.close()
            }
            var released = false
            for _ in 0..<100 where !released {
                let status = try? UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
                let counters = status?.json["counters"] as? [String: Any]
                released = counters?["requests_in_flight"] as? Int == 1 && counters?["upstream_connections_open"] as? Int ?? 9 <= 1
                if !released { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(released, "no request is left in flight")
            // Cut mid-response, by the client: the same on either path, with the status and the bytes sent.
            let cut = await Self.logLines(daemon, atLeast: 5) { $0.contains("error=aborted") }
            #expect(cut.count == 5, "the five abandoned downloads are logged: \(cut.count)")
            #expect(cut.allSatisfy { $0.contains("status=200") && !$0.contains("bytes=0 ") }, "\(cut)")
            let fds = await daemon.waitForFileDescriptors(atMost: before + 1)
            #expect(fds <= before + 1, "descriptors: \(before) before, \(fds) after")
            #expect(try fetch(daemon, "\(base)/hello").status == 200)
        }
    }

    @Test("a 200 MiB download on the relay streams with bounded memory")
    func largeDownloadIsBounded() async throws {
        let size = 200 * 1024 * 1024
        try await Self.withRelayedOrigin("big") { daemon, base in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try await Self.untilRelayed(daemon, connection, base))
            let relayedBefore = try Self.relayedCount(daemon)
            let baseline = daemon.residentKiB ?? 0
            try connection.send("GET \(base)/bytes/\(size) HTTP/1.1\r\nHost: x\r\n\r\n")
            var received = 0
            var mismatches = 0
            var peakKiB = baseline
            let response = try connection.readResponse { slice in
                if !BytePattern.matches(slice, offset: received) { mismatches += 1 }
                received += slice.count
                if received % (16 * 1024 * 1024) < slice.count {
                    // A slow reader: the relay must stop reading from the origin meanwhile.
                    usleep(20_000)
                    peakKiB = max(peakKiB, daemon.residentKiB ?? 0)
                }
            }
            #expect(response.status == 200 && received == size && mismatches == 0)
            #expect(try Self.relayedCount(daemon) == relayedBefore + 1, "the download was relayed directly")
            print("200 MiB relayed download: daemon RSS \(baseline) KiB before, peak \(peakKiB) KiB during")
            #expect(peakKiB - baseline < 64 * 1024)
        }
    }

    @Test("SIGTERM during a relayed request: it finishes with Connection: close, and the daemon exits 0")
    func drainingFinishesRelayedRequest() async throws {
        try await Self.withRelayedOrigin("drain") { daemon, base in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try await Self.untilRelayed(daemon, connection, base), "this connection's requests are relayed")
            try connection.send("GET \(base)/slow-head/1500 HTTP/1.1\r\nHost: x\r\n\r\n")
            try await Task.sleep(for: .milliseconds(300))
            kill(daemon.pid, SIGTERM)
            let response = try connection.readResponse()
            #expect(response.status == 200)
            #expect(response.header("Connection")?.lowercased() == "close")
            #expect(try connection.readToEnd().isEmpty)
            #expect(await daemon.waitForExit() == 0)
        }
    }

    @Test("SIGTERM while a relayed request awaits a 401: the full path takes it over and answers it, not 503")
    func drainingDuringHandover() async throws {
        let origin = try await TestAuthOrigin.start(name: "drain-handover", user: "alice", password: "Handover-Secret-17")
        defer { Task { await origin.stop() } }
        let base = "http://auth.internal.test:\(origin.port)"
        try await withDaemon(config: "[upstream]\nresolve = [\"auth.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let stored = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/passwords", headers: [("Content-Type", "application/json")],
                body: jsonBody(["url": base, "user": "alice", "password": "Handover-Secret-17", "persistence": "session"])
            )
            #expect(stored.status == 201)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let relayed = try await Self.untilRelayed(daemon) {
                let response = try connection.request("GET", "\(base)/open/a")
                #expect(response.status == 200)
            }
            #expect(relayed)
            // No space is known at the origin yet, so the relay sends this one (counting it in
            // first); the origin holds its 401 until the drain has begun, and the relay then hands
            // the request over.
            try connection.send("GET \(base)/basic/late?delay-ms=1500 HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(await waitUntil(seconds: 5) { origin.stats.unauthorized == 1 }, "the origin has the request")
            kill(daemon.pid, SIGTERM)
            let response = try connection.readResponse()
            #expect(response.status == 200 && response.text == "hello alice", "answered with the stored password, not 503")
            #expect(response.header("Connection")?.lowercased() == "close")
            #expect(try connection.readToEnd().isEmpty)
            #expect(origin.stats.unauthorized == 1 && origin.stats.successes == 1)
            #expect(await daemon.waitForExit() == 0)
            #expect(!daemon.log.contains("Handover-Secret-17"))
        }
    }
}
