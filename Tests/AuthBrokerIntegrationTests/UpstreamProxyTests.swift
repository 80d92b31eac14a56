import Foundation
import Testing
import TestSupport

/// `[upstream] proxy`: http targets go to the proxy in absolute form, https ones through a
/// CONNECT tunnel (trust still decided against the origin), and the proxy's 407s are answered
/// from stored passwords, Basic and Digest, preemptively after the first.
@Suite("Upstream proxy")
struct UpstreamProxyTests {
    static let user = "proxy-user"
    static let password = "Proxy-Secret-17"

    static func config(proxy: Int, extra: String = "") -> String {
        "[upstream]\nproxy = \"http://127.0.0.1:\(proxy)\"\n\(extra)\n"
    }

    /// Stores the proxy's password (session) under its own URL.
    @discardableResult
    static func storeProxyPassword(_ daemon: DaemonProcess, proxyPort: Int, password: String = password) throws -> TestResponse {
        try storeProxyPassword(daemon, url: "http://127.0.0.1:\(proxyPort)", user: user, password: password)
    }

    @discardableResult
    static func storeProxyPassword(_ daemon: DaemonProcess, url: String, user: String, password: String) throws -> TestResponse {
        let body: [String: Any] = ["url": url, "user": user, "password": password, "persistence": "session"]
        let connection = try UnixSocketConnection(path: daemon.socketPath)
        return try connection.request("POST", "/v1/passwords", headers: [("Content-Type", "application/json")], body: jsonBody(body))
    }

    /// An HTTPS origin whose CA the daemon trusts for `host`.
    static func trustedHTTPSOrigin(host: String, daemon: DaemonProcess, ca: TestIdentity) async throws -> TestOrigin {
        let leaf = try TestPKI.makeLeaf(dnsNames: [host], issuer: ca)
        let origin = try await TestOrigin.start(name: "tls", identity: leaf)
        #expect(try addAnchor(daemon, pem: ca.pem, hosts: [host]).status == 201)
        return origin
    }

    @Test("http goes to the proxy in absolute form; https through one CONNECT tunnel, reused, with trust against the origin")
    func plainProxy() async throws {
        let proxy = try await TestForwardProxy.start()
        let origin = try await TestOrigin.start(name: "web")
        let ca = try TestPKI.makeCA(commonName: "Proxy Test CA")
        defer { Task { await proxy.stop(); await origin.stop() } }
        try await withDaemon(config: Self.config(proxy: proxy.port)) { daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let plain = try connection.request("GET", "http://web.internal.test:\(origin.port)/hello")
            #expect(plain.status == 200, "\(plain.text)")
            #expect(plain.text == "hello from web")
            #expect(proxy.stats.forwarded == 1)

            let secure = try await Self.trustedHTTPSOrigin(host: "secure.internal.test", daemon: daemon, ca: ca)
            defer { Task { await secure.stop() } }
            for _ in 0..<5 {
                let response = try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello")
                #expect(response.status == 200, "\(response.text)")
                #expect(response.text == "hello from tls")
            }
            #expect(proxy.stats.connects == 1)
            #expect(proxy.stats.tunnels == 1)

            // Trust is decided against the origin through the tunnel: an unknown CA is refused.
            let otherCA = try TestPKI.makeCA(commonName: "Unknown CA")
            let untrusted = try await TestOrigin.start(
                name: "untrusted", identity: try TestPKI.makeLeaf(dnsNames: ["untrusted.internal.test"], issuer: otherCA)
            )
            defer { Task { await untrusted.stop() } }
            let refused = try connection.request("GET", "https://untrusted.internal.test:\(untrusted.port)/hello")
            #expect(refused.status == 502)
            #expect(refused.header("Proxy-Status")?.contains("tls_certificate_error") == true)
        }
    }

    @Test(
        "a stored proxy password answers the proxy's 407 once, then goes preemptively: 1000 requests, one 407",
        arguments: [TestProxyAuth.basic, .digest(algorithm: "SHA-256", qop: "auth"), .digest(algorithm: "MD5", qop: "auth")]
    )
    func storedProxyPassword(auth: TestProxyAuth) async throws {
        let proxy = try await TestForwardProxy.start(auth: auth, user: Self.user, password: Self.password)
        let origin = try await TestOrigin.start(name: "web")
        defer { Task { await proxy.stop(); await origin.stop() } }
        try await withDaemon(config: Self.config(proxy: proxy.port)) { daemon in
            #expect(try Self.storeProxyPassword(daemon, proxyPort: proxy.port).status == 201)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<1000 {
                let response = try connection.request("GET", "http://web.internal.test:\(origin.port)/hello?\(index)")
                guard response.status == 200 else {
                    Issue.record("request \(index) got \(response.status): \(response.text)")
                    return
                }
            }
            print("proxy \(auth), 1000 requests: \(proxy.stats.proxyAuthenticationRequired) 407 round trips")
            #expect(proxy.stats.proxyAuthenticationRequired == 1)
            #expect(proxy.stats.forwarded == 1000)
            #expect(proxy.authStats.failures == 0)
            // The audit log names the proxy's space (all of it is written once the daemon stops).
            await daemon.stop()
            let audit = try String(contentsOfFile: daemon.directory + "/state/authbroker/audit.jsonl", encoding: .utf8)
            #expect(audit.contains("\"proxy\":true"))
        }
    }

    @Test("a 407 to CONNECT is answered from the store; the tunnel then carries the https requests", arguments: [TestProxyAuth.basic, .digest(algorithm: "SHA-256", qop: "auth")])
    func connectAuthentication(auth: TestProxyAuth) async throws {
        let proxy = try await TestForwardProxy.start(auth: auth, user: Self.user, password: Self.password)
        let ca = try TestPKI.makeCA(commonName: "Proxy Test CA")
        defer { Task { await proxy.stop() } }
        try await withDaemon(config: Self.config(proxy: proxy.port)) { daemon in
            try Self.storeProxyPassword(daemon, proxyPort: proxy.port)
            let secure = try await Self.trustedHTTPSOrigin(host: "secure.internal.test", daemon: daemon, ca: ca)
            defer { Task { await secure.stop() } }
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for _ in 0..<3 {
                let response = try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello")
                #expect(response.status == 200, "\(response.text)")
            }
            #expect(proxy.stats.proxyAuthenticationRequired == 1)
            #expect(proxy.stats.tunnels == 1)
        }
    }

    @Test("a wrong stored proxy password is sent once, marked REFUSED and never again; the client gets the 407")
    func wrongProxyPassword() async throws {
        let proxy = try await TestForwardProxy.start(auth: .basic, user: Self.user, password: Self.password)
        let origin = try await TestOrigin.start(name: "web")
        let ca = try TestPKI.makeCA(commonName: "Proxy Test CA")
        defer { Task { await proxy.stop(); await origin.stop() } }
        try await withDaemon(config: Self.config(proxy: proxy.port)) { daemon in
            try Self.storeProxyPassword(daemon, proxyPort: proxy.port, password: "wrong")
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for _ in 0..<3 {
                let response = try connection.request("GET", "http://web.internal.test:\(origin.port)/hello")
                #expect(response.status == 407)
                #expect(response.header("Proxy-Authenticate")?.hasPrefix("Basic ") == true)
            }
            #expect(proxy.stats.refused == 1)
            let secure = try await Self.trustedHTTPSOrigin(host: "secure.internal.test", daemon: daemon, ca: ca)
            defer { Task { await secure.stop() } }
            let tunnelled = try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello")
            #expect(tunnelled.status == 407, "\(tunnelled.text)")
            #expect(tunnelled.header("Proxy-Authenticate")?.hasPrefix("Basic ") == true)
            #expect(tunnelled.text.contains("passwords add http://127.0.0.1:\(proxy.port)"))
            #expect(proxy.stats.refused == 1)
            let listed = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            #expect(listed.text.contains("\"failed\":true"), "\(listed.text)")

            // The client answers the 407 itself: its Proxy-Authorization goes to the proxy.
            let token = Data("\(Self.user):\(Self.password)".utf8).base64EncodedString()
            let own = try connection.request(
                "GET", "http://web.internal.test:\(origin.port)/hello", headers: [("Proxy-Authorization", "Basic \(token)")]
            )
            #expect(own.status == 200, "\(own.text)")
            #expect(proxy.stats.refused == 1)
        }
    }

    @Test("an origin's 407 behind the proxy goes to the app; the proxy's password is never marked refused by it")
    func originProxyChallengeIsNotTheProxys() async throws {
        let proxy = try await TestForwardProxy.start(auth: .basic, user: Self.user, password: Self.password)
        let faulty = try await FaultyOrigin.start()
        let origin = try await TestOrigin.start(name: "web")
        defer { Task { await proxy.stop(); await faulty.stop(); await origin.stop() } }
        try await withDaemon(config: Self.config(proxy: proxy.port)) { daemon in
            try Self.storeProxyPassword(daemon, proxyPort: proxy.port)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let base = "http://faulty.internal.test:\(faulty.port)"
            #expect(try connection.request("GET", "\(base)/hello").status == 200)
            // Another realm, then the proxy's own realm mimicked: the app gets the origin's 407.
            for realm in ["evil", "evil", TestAuthOrigin.basicRealm] {
                let challenged = try connection.request("GET", "\(base)/proxy-challenge/\(realm)")
                #expect(challenged.status == 407)
                #expect(challenged.text == "origin")
                #expect(challenged.header("Authbroker-Error") == nil)
            }
            // The proxy's password is held back for that origin from now on (its 407 in the
            // proxy's realm may have been the proxy's): its requests meet the proxy's own 407,
            // passed to the app, while another origin still gets the password.
            for path in ["/proxy-challenge/\(TestAuthOrigin.basicRealm)", "/hello"] {
                let held = try connection.request("GET", base + path)
                #expect(held.status == 407)
                #expect(held.text == "proxy authentication required")
                #expect(held.header("Authbroker-Error") == nil)
            }
            #expect(try connection.request("GET", "http://web.internal.test:\(origin.port)/hello").status == 200)
            #expect(proxy.stats.refused == 0)
            let listed = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            #expect(!listed.text.contains("\"failed\":true"), "\(listed.text)")
        }
    }

    @Test("a proxy password changed at the directory is refused at most twice over plain http, not once per request, then marked by a CONNECT")
    func changedProxyPasswordIsNotRetriedPerRequest() async throws {
        let proxy = try await TestForwardProxy.start(auth: .basic, user: Self.user, password: Self.password)
        let first = try await TestOrigin.start(name: "first"), second = try await TestOrigin.start(name: "second")
        let third = try await TestOrigin.start(name: "third")
        let ca = try TestPKI.makeCA(commonName: "Proxy Test CA")
        defer { Task { await proxy.stop(); await first.stop(); await second.stop(); await third.stop() } }
        try await withDaemon(config: Self.config(proxy: proxy.port)) { daemon in
            try Self.storeProxyPassword(daemon, proxyPort: proxy.port)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for origin in [first, second, third] {
                #expect(try connection.request("GET", "http://\(origin.name).internal.test:\(origin.port)/hello").status == 200)
            }
            #expect(proxy.stats.refused == 0)

            // The password expires at the directory: an apt update's worth of requests follows.
            proxy.changePassword("Changed-At-The-Directory")
            for _ in 0..<4 {
                for origin in [first, second, third] {
                    let response = try connection.request("GET", "http://\(origin.name).internal.test:\(origin.port)/hello")
                    #expect(response.status == 407)
                }
            }
            #expect(proxy.stats.refused == 2, "the refused proxy password was sent \(proxy.stats.refused) times")

            // An https request's CONNECT is surely the proxy's: its 407 marks the password refused.
            let secure = try await Self.trustedHTTPSOrigin(host: "secure.internal.test", daemon: daemon, ca: ca)
            defer { Task { await secure.stop() } }
            #expect(try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello").status == 407)
            #expect(proxy.stats.refused == 3)
            let listed = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/passwords")
            #expect(listed.text.contains("\"failed\":true"), "\(listed.text)")

            // The new password, stored, is sent at once everywhere.
            try Self.storeProxyPassword(daemon, proxyPort: proxy.port, password: "Changed-At-The-Directory")
            #expect(try connection.request("GET", "http://first.internal.test:\(first.port)/hello").status == 200)
            #expect(try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello").status == 200)
            #expect(proxy.stats.refused == 3)
        }
    }

    @Test("no_proxy hosts are reached directly")
    func noProxy() async throws {
        let proxy = try await TestForwardProxy.start()
        let origin = try await TestOrigin.start(name: "direct")
        defer { Task { await proxy.stop(); await origin.stop() } }
        let extra = "no_proxy = [\"*.direct.test\"]\nresolve = [\"app.direct.test:\(origin.port):127.0.0.1\"]"
        try await withDaemon(config: Self.config(proxy: proxy.port, extra: extra)) { daemon in
            let response = try fetch(daemon, "http://app.direct.test:\(origin.port)/headers")
            #expect(response.status == 200, "\(response.text)")
            #expect(proxy.stats.forwarded == 0)
            #expect(proxy.stats.connects == 0)
            // A client's Proxy-Authorization never reaches an origin.
            let withCredentials = try fetch(
                daemon, "http://app.direct.test:\(origin.port)/headers", headers: [("Proxy-Authorization", "Basic eDp5")]
            )
            #expect(!withCredentials.text.lowercased().contains("proxy-authorization"))
        }
    }

    @Test("a proxy that does not answer gives 502 with Proxy-Status naming it as next-hop", arguments: ["http", "https"])
    func proxyDown(scheme: String) async throws {
        let port = try freeLoopbackPort()
        try await withDaemon(config: Self.config(proxy: port)) { daemon in
            let response = try fetch(daemon, "\(scheme)://web.internal.test:8443/hello")
            #expect(response.status == 502, "\(response.text)")
            let status = response.header("Proxy-Status") ?? ""
            #expect(status.contains("error=connection_refused"), "\(status)")
            #expect(status.contains("next-hop=\"127.0.0.1:\(port)\""), "\(status)")
            #expect(response.text.contains("[upstream] proxy"))
        }
    }
}
