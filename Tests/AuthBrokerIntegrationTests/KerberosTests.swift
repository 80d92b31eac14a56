import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
import Glibc
#endif

/// The daemon answers Negotiate (Kerberos over SPNEGO) itself, with the user's ticket, for the
/// hosts `[kerberos]` names: against a real MIT KDC, Apache's mod_auth_gssapi as the origin
/// and Squid's negotiate_kerberos_auth as the upstream proxy. The app never sees Negotiate.
@Suite(
    "Kerberos: Negotiate answered by the daemon",
    .enabled(
        if: KerberosRealm.isInstalled && ApacheNegotiateSite.isInstalled,
        "needs krb5-kdc krb5-admin-server krb5-user libapache2-mod-auth-gssapi apache2 (scripts/install-deps test)"
    )
)
struct KerberosTests {
    static let user = KerberosFixtureTests.user
    static let password = KerberosFixtureTests.password

    /// A realm with the user and HTTP/localhost, Apache over TLS for `localhost`, and a daemon
    /// that trusts Apache's CA and runs in the realm's environment (its krb5.conf and cache).
    static func withApache(
        kerberos: String, tls: Bool = true, kinit: Bool = true,
        _ body: (KerberosRealm, ApacheNegotiateSite, DaemonProcess) async throws -> Void
    ) async throws {
        try await KerberosFixtureTests.withRealm { realm in
            _ = try realm.addService("HTTP/localhost")
            if kinit { try realm.kinit(user: Self.user, password: Self.password) }
            let ca = try TestPKI.makeCA(commonName: "Kerberos Daemon Test CA")
            let site = try await ApacheNegotiateSite.start(
                realm: realm, tlsIdentity: tls ? try TestPKI.makeLeaf(dnsNames: ["localhost"], issuer: ca) : nil
            )
            try await KerberosFixtureTests.stopping({ await site.stop() }) {
                let config = "[kerberos]\n\(kerberos)\n[upstream]\nresolve = [\"localhost:\(site.port):127.0.0.1\"]\n"
                let daemon = try await DaemonProcess.start(config: config, extraEnvironment: realm.environment)
                do {
                    #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["localhost"]).status == 201)
                    try await body(realm, site, daemon)
                } catch {
                    print("authbrokerd log for the failed test:\n\(daemon.log)\nApache error log:\n\(site.errorLog)")
                    await daemon.stop()
                    daemon.cleanUp()
                    throw error
                }
                await daemon.stop()
                daemon.cleanUp()
            }
        }
    }

    static func status(_ daemon: DaemonProcess) throws -> [String: Any] {
        try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status").json
    }

    @Test("an origin that requires Negotiate: the app gets 200 and never a Negotiate challenge; later requests carry a ticket up front")
    func origin() async throws {
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]\n[flows]\nrecord = \"always\"") { realm, site, daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let first = try connection.request("GET", site.url("/negotiate/"))
            #expect(first.status == 200, "\(first.text)")
            #expect(first.text == "negotiate ok\n")
            // Apache's mutual-authentication token was checked and removed.
            #expect(first.header("WWW-Authenticate") == nil)
            // Apache logs a request after answering it: its line may trail the response.
            let named = await waitUntil(seconds: 5) {
                site.requests.contains { $0.requestLine.contains("/negotiate/") && $0.status == 200 && $0.user == "alice@AUTHBROKER.TEST" }
            }
            #expect(named, "\(site.accessLog)")
            #expect(site.unauthorizedCount == 1)

            for index in 0..<100 {
                let response = try connection.request("GET", site.url("/negotiate/?\(index)"))
                guard response.status == 200 else {
                    Issue.record("request \(index): \(response.status) \(response.text)")
                    return
                }
            }
            // Preemptive: no more 401s; one service ticket from the KDC, cached after.
            #expect(site.unauthorizedCount == 1, "\(site.accessLog)")
            #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") == 1)

            // Tokens go up front only under the directory that took one: an open path gets none.
            let started = try #require(try Self.status(daemon)["kerberos"] as? [String: Any])["contexts_started"] as? Int
            for _ in 0..<5 { #expect(try connection.request("GET", site.url("/public/")).status == 200) }
            #expect(try #require(try Self.status(daemon)["kerberos"] as? [String: Any])["contexts_started"] as? Int == started)

            // A location that offers Basic too: Negotiate is preferred, no password is involved.
            let both = try connection.request("GET", site.url("/negotiate-or-basic/"))
            #expect(both.status == 200)
            let bothNamed = await waitUntil(seconds: 5) {
                site.requests.contains { $0.requestLine.contains("/negotiate-or-basic/") && $0.status == 200 && $0.user == "alice@AUTHBROKER.TEST" }
            }
            #expect(bothNamed, "\(site.accessLog)")

            let kerberos = try #require(try Self.status(daemon)["kerberos"] as? [String: Any])
            #expect(kerberos["ticket"] as? String == "valid")
            #expect(kerberos["principal"] as? String == "alice@AUTHBROKER.TEST")
            #expect(kerberos["expires"] != nil)
            #expect((kerberos["contexts_accepted"] as? Int ?? 0) >= 102, "\(kerberos)")
            #expect((kerberos["mutual_verified"] as? Int ?? 0) >= 102, "\(kerberos)")

            // The audit log names the host, the service, the principal and the process.
            let audit = try String(contentsOfFile: daemon.directory + "/state/authbroker/audit.jsonl", encoding: .utf8)
            let line = try #require(audit.split(separator: "\n").first { $0.contains("kerberos_ticket_used") })
            #expect(line.contains("\"service\":\"HTTP@localhost\""), "\(line)")
            #expect(line.contains("\"user\":\"alice@AUTHBROKER.TEST\""))
            #expect(line.contains("\"pid\":"))
            #expect(!audit.contains("Negotiate "), "no token in the audit log")
            #expect(!daemon.log.contains("Negotiate Y"), "no token in the daemon's log")

            // The flow log says what the broker applied: Negotiate, as the principal.
            let flows = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/flows?last=3")
            #expect(flows.text.contains("\"negotiate\"") && flows.text.contains("alice@AUTHBROKER.TEST"), "\(flows.text)")
            #expect(!flows.text.contains("Negotiate Y"), "no token in the flow log")
        }
    }

    @Test("delegation only to delegate_hosts: the server gets the user's forwardable ticket there and nowhere else")
    func delegation() async throws {
        for delegating in [false, true] {
            let kerberos = "hosts = [\"localhost\"]" + (delegating ? "\ndelegate_hosts = [\"localhost\"]" : "")
            try await Self.withApache(kerberos: kerberos, kinit: false) { realm, site, daemon in
                try realm.kinit(user: Self.user, password: Self.password, forwardable: true)
                let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", site.url("/delegate/"))
                #expect(response.status == 200, "\(response.text)")
                // Delegating, the client asks the KDC for a forwarded TGT to put in the token.
                #expect((realm.serviceTicketsIssued(for: "krbtgt/\(realm.realm)") > 0) == delegating, "\(delegating): \(realm.kdcLog)")
                // And the server received credentials (mod_auth_gssapi logs what it does with them).
                #expect(site.errorLog.contains("delegated creds") == delegating, "\(delegating): \(site.errorLog)")
                let auditPath = daemon.directory + "/state/authbroker/audit.jsonl"
                let audited = await waitUntil(seconds: 5) {
                    ((try? String(contentsOfFile: auditPath, encoding: .utf8)) ?? "").contains("kerberos_ticket_used")
                }
                #expect(audited)
                let audit = (try? String(contentsOfFile: auditPath, encoding: .utf8)) ?? ""
                #expect(audit.contains("\"delegated\":true") == delegating, "\(audit)")
            }
        }
    }

    @Test("20 apps asking at once for a host not yet visited: all get 200, and the KDC is asked for its ticket at most twice")
    func concurrentFirstRequests() async throws {
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]") { realm, site, daemon in
            let url = site.url("/negotiate/")
            let statuses = try await withThrowingTaskGroup(of: Int.self) { group in
                for _ in 0..<20 {
                    group.addTask { try UnixSocketConnection(path: daemon.socketPath).request("GET", url).status }
                }
                return try await group.reduce(into: [Int]()) { $0.append($1) }
            }
            #expect(statuses == Array(repeating: 200, count: 20))
            // Two Kerberos threads: at most two service-ticket requests before the cache holds it.
            #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") <= 2, "\(realm.kdcLog)")
        }
    }

    @Test("a connection-bound server (GssapiConnectionBound) is answered too")
    func connectionBound() async throws {
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]") { _, site, daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<20 {
                let response = try connection.request("GET", site.url("/bound/?\(index)"))
                #expect(response.status == 200, "\(index): \(response.text)")
            }
            // Apache logs a request after answering it: the last line may trail the response.
            let logged = await waitUntil(seconds: 5) { site.requests.filter { $0.requestLine.contains("/bound/") && $0.status == 200 }.count == 20 }
            #expect(logged, "\(site.accessLog)")
            #expect(site.unauthorizedCount <= 1, "\(site.accessLog)")
        }
    }

    @Test("a host not in [kerberos] hosts, or an http origin, gets no ticket: the KDC issues none and the app gets the 401 without Negotiate")
    func notListed() async throws {
        try await Self.withApache(kerberos: "hosts = [\"*.corp.example\"]") { realm, site, daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let response = try connection.request("GET", site.url("/negotiate/"))
            #expect(response.status == 401)
            #expect(response.header("WWW-Authenticate") == nil)
            let both = try connection.request("GET", site.url("/negotiate-or-basic/"))
            #expect(both.status == 401)
            #expect(both.header("WWW-Authenticate") == "Basic realm=\"\(ApacheNegotiateSite.basicRealm)\"")
            #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") == 0, "\(realm.kdcLog)")
            #expect(try !realm.klist().contains("HTTP/localhost"))
        }
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]", tls: false) { realm, site, daemon in
            let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", site.url("/negotiate/"))
            #expect(response.status == 401)
            #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") == 0, "\(realm.kdcLog)")
            #expect(daemon.log.contains("cleartext_origin"))
        }
    }

    @Test("no ticket: the broker's error says to run kinit; with Basic offered too, the app gets the 401 with Basic only; status and agents are told")
    func noTicket() async throws {
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]", kinit: false) { realm, site, daemon in
            let agent = try AgentStream(socketPath: daemon.socketPath)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let response = try connection.request("GET", site.url("/negotiate/"))
            #expect(response.status == 502)
            #expect(response.header("Authbroker-Error") == "kerberos_ticket_needed")
            #expect((response.json["detail"] as? String)?.contains("kinit") == true, "\(response.text)")
            #expect(response.json["fix"] as? [String] == ["kinit", "authbrokerctl status"])
            #expect(response.header("WWW-Authenticate") == nil)

            let both = try connection.request("GET", site.url("/negotiate-or-basic/"))
            #expect(both.status == 401)
            #expect(both.header("WWW-Authenticate") == "Basic realm=\"\(ApacheNegotiateSite.basicRealm)\"")

            let status = try Self.status(daemon)
            #expect((status["counters"] as? [String: Any])?["broker_errors_total"] as? Int == 1, "one broker error, counted once")
            let kerberos = try #require(status["kerberos"] as? [String: Any])
            #expect(kerberos["ticket"] as? String == "missing")
            #expect((status["warnings"] as? [String])?.contains { $0.contains("No Kerberos ticket") && $0.contains("kinit") } == true)

            let notice = try agent.nextEvent(named: "notice", within: .seconds(10))
            #expect((notice["notice"] as? [String: Any])?["code"] as? String == "kerberos_ticket_needed", "\(notice)")

            // Then kinit: the next request just works, no restart.
            try realm.kinit(user: Self.user, password: Self.password)
            #expect(try connection.request("GET", site.url("/negotiate/")).status == 200)
        }
    }

    @Test("a ticket that expires: the broker's error says so and to run kinit; status warns; a new kinit works at once")
    func expiredTicket() async throws {
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]", kinit: false) { realm, site, daemon in
            try realm.kinit(user: Self.user, password: Self.password, lifetime: "2s")
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try connection.request("GET", site.url("/negotiate/")).status == 200)
            try await Task.sleep(for: .seconds(3))
            let response = try connection.request("GET", site.url("/negotiate/"))
            #expect(response.status == 502)
            #expect(response.header("Authbroker-Error") == "kerberos_ticket_needed")
            #expect((response.json["detail"] as? String)?.contains("expired") == true, "\(response.text)")
            let kerberos = try #require(try Self.status(daemon)["kerberos"] as? [String: Any])
            #expect(kerberos["ticket"] as? String == "expired", "\(kerberos)")
            // The credential the daemon held went stale with the ticket; a new one is picked up.
            try realm.kinit(user: Self.user, password: Self.password)
            let renewed = try connection.request("GET", site.url("/negotiate/"))
            #expect(renewed.status == 200, "\(renewed.text)")
        }
    }

    @Test("a KDC that is down, or does not answer: a clear error within the bound, nothing hangs, the daemon serves on")
    func kdcDown() async throws {
        try await Self.withApache(kerberos: "hosts = [\"localhost\"]\nkdc_timeout_ms = 1500") { realm, site, daemon in
            await realm.stopKDC()
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let down = try connection.request("GET", site.url("/negotiate/"))
            #expect(down.status == 502)
            #expect(down.header("Authbroker-Error") == "kerberos_failed")
            #expect((down.json["detail"] as? String)?.contains("KDC") == true, "\(down.text)")

            // Something holds the KDC's port and never answers: the request waits the bound.
            let silent = try SilentKDC(port: realm.port)
            defer { silent.close() }
            let started = ContinuousClock.now
            let stuck = try connection.request("GET", site.url("/negotiate/"))
            let waited = ContinuousClock.now - started
            #expect(stuck.status == 502)
            #expect(stuck.header("Authbroker-Error") == "kerberos_failed", "\(stuck.text)")
            #expect((stuck.json["detail"] as? String)?.contains("no answer within 1500 ms") == true, "\(stuck.text)")
            #expect(waited < .seconds(30), "bounded by kdc_timeout_ms (and the KDC library's own tries)")
            // Other requests are not held up.
            #expect(try connection.request("GET", site.url("/public/")).status == 200)
        }
    }

    @Test(
        "a server that cannot prove it holds the service key (mutual authentication) gets its response withheld",
        arguments: [
            // negTokenResp accept-completed naming Kerberos, with no AP-REP in it.
            "oRQwEqADCgEAoQsGCSqGSIb3EgECAg==",
            // Not a token at all.
            "YWJjZA==",
        ]
    )
    func impostor(token: String) async throws {
        try await KerberosFixtureTests.withRealm { realm in
            _ = try realm.addService("HTTP/localhost")
            try realm.kinit(user: Self.user, password: Self.password)
            let ca = try TestPKI.makeCA(commonName: "Impostor Test CA")
            // It holds a certificate the user trusts for localhost, but not HTTP/localhost's key.
            let impostor = try await TestOrigin.start(name: "impostor", identity: try TestPKI.makeLeaf(dnsNames: ["localhost"], issuer: ca))
            try await KerberosFixtureTests.stopping({ await impostor.stop() }) {
                let config = "[kerberos]\nhosts = [\"localhost\"]\n[upstream]\nresolve = [\"localhost:\(impostor.port):127.0.0.1\"]\n"
                try await withDaemon(config: config, extraEnvironment: realm.environment) { daemon in
                    #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["localhost"]).status == 201)
                    let response = try UnixSocketConnection(path: daemon.socketPath).request(
                        "GET", "https://localhost:\(impostor.port)/negotiate-impostor/\(token)"
                    )
                    #expect(response.status == 502, "\(response.text)")
                    #expect(response.header("Authbroker-Error") == "kerberos_mutual_auth_failed", "\(response.text)")
                    #expect(!response.text.contains("welcome"))
                }
            }
        }
    }

    /// A realm with a ticket for HTTP/localhost and a TLS `TestOrigin` for `localhost`, behind a
    /// daemon that trusts it, allows Kerberos for it and runs with `config` added.
    static func withTestOrigin(config: String = "", _ body: (TestOrigin, DaemonProcess) async throws -> Void) async throws {
        try await KerberosFixtureTests.withRealm { realm in
            _ = try realm.addService("HTTP/localhost")
            try realm.kinit(user: Self.user, password: Self.password)
            let ca = try TestPKI.makeCA(commonName: "Kerberos Origin Test CA")
            let origin = try await TestOrigin.start(name: "kerberos", identity: try TestPKI.makeLeaf(dnsNames: ["localhost"], issuer: ca))
            try await KerberosFixtureTests.stopping({ await origin.stop() }) {
                let full = "[kerberos]\nhosts = [\"localhost\"]\n[upstream]\nresolve = [\"localhost:\(origin.port):127.0.0.1\"]\n" + config
                try await withDaemon(config: full, extraEnvironment: realm.environment) { daemon in
                    #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["localhost"]).status == 201)
                    try await body(origin, daemon)
                }
            }
        }
    }

    @Test("a refused ticket on an upload whose body was not kept is not answered again: the body is never resent short")
    func refusedUploadNotResent() async throws {
        try await Self.withTestOrigin(config: "[limits]\nrequest_body_buffer_bytes = 1024\n") { origin, daemon in
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            let base = "https://localhost:\(origin.port)/negotiate-once/upload"
            // The directory takes a ticket once: later requests there carry one up front.
            #expect(try connection.request("GET", base + "/first").status == 200)
            let body = [UInt8](repeating: 0x61, count: 64 * 1024)
            let response = try connection.request("PUT", base + "/big", body: body)
            // The server refused the up-front ticket after reading the body; the broker kept
            // only 1 KiB of it, so it must not send the request again.
            #expect(response.status == 401, "\(response.text)")
            #expect(response.text == "refused uploads 1, this one 65536 bytes", "\(response.text)")
        }
    }

    @Test("a refused ticket at a server that offers Basic too: the stored password answers")
    func refusedTicketThenStoredBasic() async throws {
        try await Self.withTestOrigin { origin, daemon in
            let base = "https://localhost:\(origin.port)"
            let stored = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/passwords", headers: [("Content-Type", "application/json")],
                body: jsonBody(["url": base, "user": "alice", "password": "pw", "persistence": "session"])
            )
            #expect(stored.status == 201)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            // The first token is taken; the next request's token is refused, then Basic answers.
            #expect(try connection.request("GET", base + "/negotiate-once/mixed/a?basic").text == "negotiate ok")
            let response = try connection.request("GET", base + "/negotiate-once/mixed/b?basic")
            #expect(response.status == 200, "\(response.text)")
            #expect(response.text == "basic ok", "\(daemon.log.suffix(4000))")
        }
    }

    @Test(
        "Squid demanding Negotiate as the upstream proxy: http and https (CONNECT), 1000 requests for a handful of 407s",
        .enabled(if: SquidProxy.isNegotiateInstalled, "squid-openssl is not installed (scripts/install-deps test)")
    )
    func squidProxy() async throws {
        try await KerberosFixtureTests.withRealm { realm in
            try realm.kinit(user: Self.user, password: Self.password)
            let squid = try await SquidProxy.start(
                negotiate: realm, principal: "HTTP/127.0.0.1", hosts: ["web.internal.test", "secure.internal.test"]
            )
            let origin = try await TestOrigin.start(name: "web")
            let ca = try TestPKI.makeCA(commonName: "Squid Kerberos Test CA")
            let secure = try await TestOrigin.start(name: "tls", identity: try TestPKI.makeLeaf(dnsNames: ["secure.internal.test"], issuer: ca))
            try await KerberosFixtureTests.stopping({ await squid.stop(); await origin.stop(); await secure.stop() }) {
                // Without [kerberos] proxy the proxy's Negotiate is not answered: the app gets the
                // 407 with no challenge it could answer, and the KDC issues nothing.
                let off = "[upstream]\nproxy = \"http://127.0.0.1:\(squid.port)\"\n"
                try await withDaemon(config: off, extraEnvironment: realm.environment) { daemon in
                    let response = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://web.internal.test:\(origin.port)/hello")
                    #expect(response.status == 407)
                    #expect(response.header("Proxy-Authenticate") == nil)
                    #expect(realm.serviceTicketsIssued(for: "HTTP/127.0.0.1") == 0)
                }
                let before = squid.proxyAuthenticationRequiredCount
                try await withDaemon(config: off + "[kerberos]\nproxy = true\n", extraEnvironment: realm.environment) { daemon in
                    #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["secure.internal.test"]).status == 201)
                    let connection = try UnixSocketConnection(path: daemon.socketPath)
                    for index in 0..<1000 {
                        let response = try connection.request("GET", "http://web.internal.test:\(origin.port)/hello?\(index)")
                        guard response.status == 200, response.text == "hello from web" else {
                            Issue.record("request \(index) got \(response.status): \(response.text)\n\(squid.accessLog.suffix(2000))")
                            return
                        }
                    }
                    let afterPlain = squid.proxyAuthenticationRequiredCount - before
                    print("Squid negotiate, 1000 http requests: \(afterPlain) 407 round trips")
                    #expect(afterPlain <= 4, "\(squid.accessLog.suffix(3000))")
                    #expect(squid.accessLog.contains("alice@AUTHBROKER.TEST"))

                    for _ in 0..<3 {
                        let response = try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello")
                        #expect(response.status == 200, "\(response.text)")
                    }
                    // The tunnel's CONNECT carried a ticket up front: the proxy took one before.
                    #expect(squid.proxyAuthenticationRequiredCount - before == afterPlain, "\(squid.accessLog.suffix(2000))")

                    // An origin behind the proxy answers 401 and the stored password answers it:
                    // the retry does not replay the proxy's token (its replay cache would refuse it).
                    let auth = try await TestAuthOrigin.start(name: "behind", user: "alice", password: "pw")
                    try await KerberosFixtureTests.stopping({ await auth.stop() }) {
                      try await withDaemon(config: off + "[kerberos]\nproxy = true\n", extraEnvironment: realm.environment) { fresh in
                        let url = "http://web.internal.test:\(auth.port)"
                        let stored = try UnixSocketConnection(path: fresh.socketPath).request(
                            "POST", "/v1/passwords", headers: [("Content-Type", "application/json")],
                            body: jsonBody(["url": url, "user": "alice", "password": "pw", "persistence": "session"])
                        )
                        #expect(stored.status == 201)
                        let behind = try UnixSocketConnection(path: fresh.socketPath).request("GET", url + "/basic/x")
                        #expect(behind.status == 200, "\(behind.status) \(behind.text)\n\(fresh.log.suffix(3000))")
                      }
                    }
                    let audit = try String(contentsOfFile: daemon.directory + "/state/authbroker/audit.jsonl", encoding: .utf8)
                    #expect(audit.contains("\"proxy\":true") && audit.contains("kerberos_ticket_used"))
                }
            }
        }
    }
}

/// A KDC port that takes UDP datagrams and TCP connections and never answers either.
private final class SilentKDC: Sendable {
    private let udp: Int32
    private let tcp: Int32

    init(port: Int) throws {
        func bound(_ type: Int32) throws -> Int32 {
            let fd = socket(AF_INET, type, 0)
            guard fd >= 0 else { throw TestSupportError("socket: \(errno)") }
            var one: Int32 = 1
            setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_port = in_port_t(UInt16(port).bigEndian)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            let result = withUnsafePointer(to: &address) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
            }
            guard result == 0 else {
                Glibc.close(fd)
                throw TestSupportError("bind 127.0.0.1:\(port): \(errno)")
            }
            return fd
        }
        self.udp = try bound(Int32(SOCK_DGRAM.rawValue))
        self.tcp = try bound(Int32(SOCK_STREAM.rawValue))
        guard listen(self.tcp, 16) == 0 else { throw TestSupportError("listen: \(errno)") }
    }

    func close() {
        Glibc.close(self.udp)
        Glibc.close(self.tcp)
    }
}

/// An agent attached to `GET /v1/agent`, reading its JSON lines (chunked: the size lines are
/// skipped). Attached once `init` returns.
private struct AgentStream {
    let connection: UnixSocketConnection

    init(socketPath: String) throws {
        self.connection = try UnixSocketConnection(path: socketPath, timeoutSeconds: 15)
        try self.connection.send("GET /v1/agent HTTP/1.1\r\nHost: localhost\r\n\r\n")
        _ = try self.nextEvent(named: "attached", within: .seconds(15))
    }

    /// The next event line named `name` (earlier ones of other names are skipped); throws when
    /// none comes before the read timeout.
    func nextEvent(named name: String, within limit: Duration) throws -> [String: Any] {
        let deadline = ContinuousClock.now + limit
        while ContinuousClock.now < deadline {
            let line = try self.connection.readLine()
            guard line.hasPrefix("{"),
                let object = try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any],
                object["event"] as? String == name
            else { continue }
            return object
        }
        throw TestSupportError("no \(name) event within \(limit)")
    }
}
