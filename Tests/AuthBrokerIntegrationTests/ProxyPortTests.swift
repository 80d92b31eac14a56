import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The loopback proxy port: unmodified programs (`authbrokerctl run -- curl`, wget, Python)
/// reach http:// origins through the broker, CONNECT gets a byte-exact tunnel, and another
/// local user's connection is closed before a byte is read.
@Suite("Proxy port", .serialized)
struct ProxyPortTests {
    static let password = "Proxy-Port-Secret-7"

    /// `authbrokerctl run --socket S -- program...`, with the daemon's socket and a clean proxy environment.
    static func runThroughBroker(_ daemon: DaemonProcess, _ program: [String]) throws -> ExternalCommand.Result {
        try ExternalCommand.run(
            DaemonProcess.binDirectory + "/authbrokerctl", ["run", "--socket", daemon.socketPath, "--"] + program
        )
    }

    static func storePassword(_ daemon: DaemonProcess, url: String, user: String) throws {
        let stored = try UnixSocketConnection(path: daemon.socketPath).request(
            "POST", "/v1/passwords", headers: [("Content-Type", "application/json")],
            body: jsonBody(["url": url, "user": user, "password": Self.password, "persistence": "session"])
        )
        #expect(stored.status == 201)
    }

    @Test("status reports the proxy port; env prints it for sh and fish")
    func statusAndEnv() async throws {
        try await withDaemon { daemon in
            let port = try daemon.proxyPort()
            #expect(port > 0)
            let env = try ExternalCommand.run(DaemonProcess.binDirectory + "/authbrokerctl", ["env", "--socket", daemon.socketPath])
            #expect(env.status == 0)
            #expect(env.stdout.contains("export http_proxy='http://127.0.0.1:\(port)'"))
            #expect(env.stdout.contains("export HTTPS_PROXY='http://127.0.0.1:\(port)'"))
            #expect(env.stdout.contains("export no_proxy='localhost,127.0.0.1,::1'"))
            let fish = try ExternalCommand.run(
                DaemonProcess.binDirectory + "/authbrokerctl", ["env", "--shell", "fish", "--socket", daemon.socketPath]
            )
            #expect(fish.stdout.contains("set -gx https_proxy 'http://127.0.0.1:\(port)'"))
            let status = try ExternalCommand.run(DaemonProcess.binDirectory + "/authbrokerctl", ["status", "--socket", daemon.socketPath])
            #expect(status.stdout.contains("proxy port:") && status.stdout.contains("127.0.0.1:\(port)"))
        }
    }

    @Test("with the proxy port off, env and run say so and how to turn it on")
    func proxyPortOff() async throws {
        try await withDaemon(config: "[proxy]\nlisten = []\n") { daemon in
            let env = try ExternalCommand.run(DaemonProcess.binDirectory + "/authbrokerctl", ["env", "--socket", daemon.socketPath])
            #expect(env.status == 1)
            #expect(env.stderr.contains("proxy port is off"), "\(env.stderr)")
            let run = try Self.runThroughBroker(daemon, ["/bin/true"])
            #expect(run.status == 1)
            let missing = try Self.runThroughBroker(daemon, [])
            #expect(missing.status == 64)
        }
    }

    @Test("curl, wget and Python's urllib and requests get a Basic-protected http:// page with only the broker holding the password")
    func unmodifiedProgramsGetAnsweredChallenges() async throws {
        let origin = try await TestAuthOrigin.start(name: "port", user: "alice", password: Self.password)
        defer { Task { await origin.stop() } }
        let base = "http://intranet.internal.test:\(origin.port)"
        try await withDaemon(config: "[upstream]\nresolve = [\"intranet.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            // Without a stored password the 401 reaches the program.
            let refused = try Self.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "\(base)/basic/a"])
            #expect(refused.stdout == "401")
            try Self.storePassword(daemon, url: base, user: "alice")

            let curl = try Self.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "\(base)/basic/curl"])
            #expect(curl.status == 0 && curl.stdout == "hello alice", "\(curl.stderr)")
            let wget = try Self.runThroughBroker(daemon, ["/usr/bin/wget", "-q", "-O", "-", "\(base)/basic/wget"])
            #expect(wget.status == 0 && wget.stdout == "hello alice", "\(wget.stderr)")
            let urllib = try Self.runThroughBroker(
                daemon, ["/usr/bin/python3", "-c", "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())", "\(base)/basic/urllib"]
            )
            #expect(urllib.status == 0 && urllib.stdout == "hello alice", "\(urllib.stderr)")
            if FileManager.default.fileExists(atPath: "/usr/lib/python3/dist-packages/requests") {
                let requests = try Self.runThroughBroker(
                    daemon, ["/usr/bin/python3", "-c", "import sys, requests; r = requests.get(sys.argv[1]); r.raise_for_status(); sys.stdout.write(r.text)", "\(base)/basic/requests"]
                )
                #expect(requests.status == 0 && requests.stdout == "hello alice", "\(requests.stderr)")
            } else {
                Issue.record("python3-requests is not installed (scripts/install-deps test installs it)")
            }
            #expect(origin.stats.successes == 4)
            // Not one program saw the password: it never went to them.
            #expect(origin.stats.failures == 0)
        }
    }

    @Test("CONNECT: a byte-exact tunnel both ways, bytes sent with the CONNECT included")
    func connectTunnelIsByteExact() async throws {
        // Every byte value, HTTP-looking text and a bare CR: nothing may be parsed or changed.
        let upload = Array(0...255).map(UInt8.init) + Array("GET / HTTP/1.1\r\nHost: x\r\n\r\n\r\u{0}".utf8) + Array(repeating: 0x41, count: 70_000)
        let download = Array(Array(0...255).map(UInt8.init).reversed()) + Array(repeating: 0x0D, count: 100_000)
        let origin = try await RawOrigin.start { received in
            received.count >= upload.count ? RawOrigin.Reply(download, close: true) : nil
        }
        defer { Task { await origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\"tunnel.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let client = try UnixSocketConnection(tcpPort: try daemon.proxyPort(), timeoutSeconds: 20)
            let head = "CONNECT tunnel.internal.test:\(origin.port) HTTP/1.1\r\nHost: tunnel.internal.test:\(origin.port)\r\n\r\n"
            // The first part of the upload in the same write as the CONNECT (optimistic data).
            try client.send(Array(head.utf8) + upload[..<300])
            let statusLine = try client.readLine()
            #expect(statusLine.hasPrefix("HTTP/1.1 200"), "\(statusLine)")
            while try client.readLine() != "" {}
            try client.send(Array(upload[300...]))
            let received = try client.readToEnd()
            #expect(received == download, "\(received.count) bytes back, \(download.count) expected")
            #expect(origin.received.first == upload, "the origin got \(origin.received.first?.count ?? 0) bytes")
        }
    }

    @Test("bytes sent with the CONNECT, and nothing after, reach the origin at once (a ClientHello sent optimistically)")
    func optimisticBytesAloneAreDelivered() async throws {
        let hello = Array("\u{16}\u{3}\u{1}optimistic client hello".utf8)
        let origin = try await RawOrigin.start { received in
            received.count >= hello.count ? RawOrigin.Reply("server hello", close: true) : nil
        }
        defer { Task { await origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\"early.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let client = try UnixSocketConnection(tcpPort: try daemon.proxyPort(), timeoutSeconds: 10)
            try client.send(Array("CONNECT early.internal.test:\(origin.port) HTTP/1.1\r\nHost: x\r\n\r\n".utf8) + hello)
            #expect(try client.readLine().hasPrefix("HTTP/1.1 200"))
            while try client.readLine() != "" {}
            #expect(String(decoding: try client.readToEnd(), as: UTF8.self) == "server hello")
            #expect(origin.received.first == hello)
        }
    }

    @Test("curl through the proxy port to an https:// origin: the tunnel carries its TLS end to end")
    func curlHTTPSThroughTunnel() async throws {
        let ca = try TestPKI.makeCA(commonName: "Tunnel Test CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["secure.internal.test"], issuer: ca)
        let origin = try await TestOrigin.start(name: "tunnelled", identity: leaf)
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let caFile = directory + "/ca.pem"
        try ca.pem.write(toFile: caFile, atomically: true, encoding: .utf8)
        try await withDaemon(config: "[upstream]\nresolve = [\"secure.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let curl = try Self.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "--fail", "--cacert", caFile, "https://secure.internal.test:\(origin.port)/hello"]
            )
            #expect(curl.status == 0, "\(curl.stderr)")
            #expect(curl.stdout == "hello from tunnelled")
            let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
            #expect((status.json["counters"] as? [String: Any])?["tunnels_opened"] as? Int == 1)
        }
    }

    @Test("a tunnel goes through the upstream proxy, whose 407 the broker answers from the store; curl never sees it")
    func tunnelThroughUpstreamProxy() async throws {
        let proxy = try await TestForwardProxy.start(auth: .basic, user: UpstreamProxyTests.user, password: UpstreamProxyTests.password)
        defer { Task { await proxy.stop() } }
        let ca = try TestPKI.makeCA(commonName: "Tunnel Proxy CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["behind.internal.test"], issuer: ca)
        let origin = try await TestOrigin.start(name: "behind", identity: leaf)
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try ca.pem.write(toFile: directory + "/ca.pem", atomically: true, encoding: .utf8)
        try await withDaemon(config: UpstreamProxyTests.config(proxy: proxy.port)) { daemon in
            try UpstreamProxyTests.storeProxyPassword(daemon, proxyPort: proxy.port)
            let curl = try Self.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "--fail", "--cacert", directory + "/ca.pem", "https://behind.internal.test:\(origin.port)/hello"]
            )
            #expect(curl.status == 0, "\(curl.stderr)")
            #expect(curl.stdout == "hello from behind")
            #expect(proxy.stats.tunnels == 1)
            #expect(proxy.stats.proxyAuthenticationRequired == 1)
        }
    }

    @Test(
        "bad CONNECTs get the broker's error and a close, and the daemon carries on",
        arguments: [
            ("CONNECT no-such-host.invalid:443 HTTP/1.1\r\nHost: x\r\n\r\n", 502, "dns_error"),
            ("CONNECT closed.internal.test:PORT HTTP/1.1\r\nHost: x\r\n\r\n", 502, "connection_refused"),
            ("CONNECT bad_name!:443 HTTP/1.1\r\nHost: x\r\n\r\n", 400, ""),
            ("CONNECT example.com HTTP/1.1\r\nHost: x\r\n\r\n", 400, ""),
            ("CONNECT \u{1}\u{2}garbage HTTP/1.1\r\n\r\n", 400, ""),
        ]
    )
    func badConnects(request: String, status: Int, proxyStatus: String) async throws {
        // A port that was just free: bind, note it, close.
        let gone = try await RawOrigin.startSilent()
        let closedPort = gone.port
        await gone.stop()
        try await withDaemon(config: "[upstream]\nresolve = [\"closed.internal.test:\(closedPort):127.0.0.1\"]\n") { daemon in
            let proxyPort = try daemon.proxyPort()
            let client = try UnixSocketConnection(tcpPort: proxyPort, timeoutSeconds: 20)
            try client.send(request.replacingOccurrences(of: "PORT", with: String(closedPort)))
            let response = try client.readResponse(method: "CONNECT")
            #expect(response.status == status)
            if !proxyStatus.isEmpty {
                #expect(response.header("Proxy-Status")?.contains("error=\(proxyStatus)") == true, "\(response.headers)")
            }
            #expect(client.peerClosedWithin(milliseconds: 5000))
            // Still serving, on the port and on the socket.
            #expect(try UnixSocketConnection(tcpPort: proxyPort).request("GET", "http://no-such-host.invalid/").status == 502)
            #expect(try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status").status == 200)
        }
    }

    @Test("the control API is not on the proxy port: a web page could reach it there (by 127.0.0.1, or DNS rebinding)")
    func noControlAPIOnProxyPort() async throws {
        try await withDaemon { daemon in
            let port = try daemon.proxyPort()
            for (method, target) in [("GET", "/v1/status"), ("POST", "/v1/anchors"), ("GET", "/v1/passwords"), ("GET", "/")] {
                let client = try UnixSocketConnection(tcpPort: port)
                let response = try client.request(method, target)
                #expect(response.status == 400, "\(method) \(target)")
                #expect(response.json["code"] as? String == "not_absolute")
                #expect(client.peerClosedWithin(milliseconds: 5000) || target == "/")
            }
            // Through the proxy, to the port itself: still no control API.
            let looped = try UnixSocketConnection(tcpPort: port).request("GET", "http://127.0.0.1:\(port)/v1/status")
            #expect(looped.status == 400)
            #expect(looped.json["code"] as? String == "not_absolute")
        }
    }

    @Test("an idle tunnel is closed after tunnel_idle_timeout_ms, both ends")
    func idleTunnelCloses() async throws {
        let origin = try await RawOrigin.startSilent()
        defer { Task { await origin.stop() } }
        let config = "[upstream]\nresolve = [\"idle.internal.test:\(origin.port):127.0.0.1\"]\n[limits]\ntunnel_idle_timeout_ms = 300\n"
        try await withDaemon(config: config) { daemon in
            let client = try UnixSocketConnection(tcpPort: try daemon.proxyPort(), timeoutSeconds: 20)
            try client.send("CONNECT idle.internal.test:\(origin.port) HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try client.readLine().hasPrefix("HTTP/1.1 200"))
            #expect(client.peerClosedWithin(milliseconds: 10_000))
            #expect(await origin.waitUntilNoConnectionIsOpen())
        }
    }

    @Test("a client that leaves mid-CONNECT leaves nothing open")
    func clientLeavesDuringConnect() async throws {
        let origin = try await RawOrigin.startSilent()
        defer { Task { await origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\"silent.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            let proxyPort = try daemon.proxyPort()
            let baseline = await daemon.settledFileDescriptorCount()
            for _ in 0..<5 {
                let client = try UnixSocketConnection(tcpPort: proxyPort)
                try client.send("CONNECT silent.internal.test:\(origin.port) HTTP/1.1\r\nHost: x\r\n\r\n")
                _ = try client.readLine()
                try client.send("\u{16}\u{3}\u{1}half a TLS hello")
                client.close()
            }
            #expect(await origin.waitUntilNoConnectionIsOpen())
            #expect(await daemon.waitForFileDescriptors(atMost: baseline) <= baseline)
        }
    }
}

/// Another local user on the proxy port: loopback TCP is open to everyone, the broker is not.
@Suite("Proxy port against another local user", .enabled(if: TestUser.canCreate, "making the other user needs root"), .serialized)
struct ProxyPortOtherUserTests {
    @Test("another user's connection is closed before a byte is read; the origin never hears of it")
    func otherUserIsRefusedUnread() async throws {
        let other = try TestUser.ensure(name: "abtestother", password: "attacker-\(UInt32.random(in: 0...UInt32.max))")
        let origin = try await TestAuthOrigin.start(name: "guarded", user: "alice", password: ProxyPortTests.password)
        defer { Task { await origin.stop() } }
        let base = "http://guarded.internal.test:\(origin.port)"
        try await withDaemon(config: "[upstream]\nresolve = [\"guarded.internal.test:\(origin.port):127.0.0.1\"]\n") { daemon in
            try ProxyPortTests.storePassword(daemon, url: base, user: "alice")
            let port = try daemon.proxyPort()
            let attempt = try ExternalCommand.run(
                "/usr/bin/setpriv",
                other.setprivArguments + ["/usr/bin/curl", "-sS", "-m", "10", "-x", "http://127.0.0.1:\(port)", "\(base)/basic/stolen"]
            )
            #expect(attempt.status != 0)
            #expect(!attempt.stdout.contains("hello alice"))
            #expect(origin.stats.requests == 0)
            // The user's own request still works.
            let own = try UnixSocketConnection(tcpPort: port).request("GET", "\(base)/basic/own")
            #expect(own.status == 200 && own.text == "hello alice")
            await daemon.stop()
            #expect(daemon.log.contains("refused a proxy-port connection that is not from this user"))
            #expect(daemon.log.contains("peer_uid=\(other.uid)"))
        }
    }
}
