import Foundation
import Testing
import TestSupport

/// The Kerberos fixtures proven with Debian's curl (built with GSS-API): a realm whose KDC
/// issues and logs tickets, Apache's mod_auth_gssapi and Squid's negotiate_kerberos_auth
/// accepting them. What these show about the servers' headers is what the broker's own
/// Negotiate is tested against.
@Suite(
    "Kerberos fixtures",
    .enabled(
        if: KerberosRealm.isInstalled && ApacheNegotiateSite.isInstalled && SquidProxy.isNegotiateInstalled && ApacheAuthServer.isInstalled,
        "needs krb5-kdc krb5-admin-server krb5-user libapache2-mod-auth-gssapi squid-openssl apache2 (scripts/install-deps test)"
    )
)
struct KerberosFixtureTests {
    static let user = "alice"
    static let password = "Kerberos-Secret-7"

    /// One curl run: every response's status, the last response's header fields, the bodies
    /// (all transfers' one after another) and curl's -v trace.
    struct CurlResult {
        var statuses: [Int]
        var headers: [(name: String, value: String)]
        var body: String
        var trace: String

        /// The last response's status.
        var status: Int { self.statuses.last ?? -1 }

        func headers(_ name: String) -> [String] {
            self.headers.filter { $0.name.lowercased() == name.lowercased() }.map(\.value)
        }

        /// The values of the `name` fields the client sent (from the -v trace).
        func sent(_ name: String) -> [String] {
            self.traceLines.compactMap { line in
                let prefix = "> \(name): "
                return line.hasPrefix(prefix) ? String(line.dropFirst(prefix.count)) : nil
            }
        }

        /// The trace's lines, without their CR (`"\r\n"` is one Character: split on newlines).
        var traceLines: [String] {
            self.trace.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }
        }
    }

    /// curl with the realm's environment (its krb5.conf and ticket cache) over `environment`.
    /// Responses are read from the -v trace (`< ` lines), which, unlike -i, covers every
    /// transfer of a `--next` chain.
    static func curl(_ realm: KerberosRealm, _ arguments: [String], environment: [String: String] = [:]) throws -> CurlResult {
        let result = try ExternalCommand.run(
            "/usr/bin/curl", ["-sS", "-v"] + arguments, environment: realm.environment.merging(environment) { _, new in new }
        )
        var curl = CurlResult(statuses: [], headers: [], body: result.stdout, trace: result.stderr)
        for line in curl.traceLines where line.hasPrefix("< ") {
            let text = line.dropFirst(2)
            if text.hasPrefix("HTTP/") {
                curl.statuses.append(text.split(separator: " ").dropFirst().first.flatMap { Int($0) } ?? -1)
                curl.headers = []
            } else if let colon = text.firstIndex(of: ":") {
                curl.headers.append((String(text[..<colon]), text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces)))
            }
        }
        return curl
    }

    /// A realm with `user`, and `body` run with it; the realm always stopped.
    static func withRealm(_ body: (KerberosRealm) async throws -> Void) async throws {
        let started = ContinuousClock.now
        let realm = try await KerberosRealm.start()
        print("KDC for \(realm.realm) up on 127.0.0.1:\(realm.port) in \(ContinuousClock.now - started)")
        do {
            try realm.addUser(Self.user, password: Self.password)
            try await body(realm)
        } catch {
            print("kdc.log for the failed test:\n\(realm.kdcLog)")
            await realm.stop()
            throw error
        }
        await realm.stop()
    }

    /// Runs `body`, then `stop` whether it threw or not: not a `defer { Task { … } }`, which
    /// may not run before the test runner exits and so leaves servers behind.
    static func stopping(_ stop: () async -> Void, _ body: () async throws -> Void) async throws {
        do {
            try await body()
        } catch {
            await stop()
            throw error
        }
        await stop()
    }

    @Test("the realm: kinit into its own cache, a wrong password refused, an expired ticket, the KDC stopped and started")
    func realm() async throws {
        try await Self.withRealm { realm in
            #expect(throws: TestSupportError.self) { try realm.kinit(user: Self.user, password: "wrong") }
            #expect(realm.kdcLog.contains("PREAUTH_FAILED"))
            #expect(try !realm.hasValidTicket())

            try realm.kinit(user: Self.user, password: Self.password)
            #expect(try realm.hasValidTicket())
            let listing = try realm.klist()
            #expect(listing.contains("Default principal: alice@AUTHBROKER.TEST"), "\(listing)")
            #expect(listing.contains("krbtgt/AUTHBROKER.TEST@AUTHBROKER.TEST"))
            #expect(listing.contains(realm.ccachePath))
            #expect(realm.initialTicketsIssued(for: Self.user) == 1)

            // The KDC grants a 2 s ticket; after 3 s it is expired in the cache.
            try realm.kinit(user: Self.user, password: Self.password, lifetime: "2s")
            #expect(try realm.hasValidTicket())
            try await Task.sleep(for: .seconds(3))
            #expect(try !realm.hasValidTicket())

            await realm.stopKDC()
            let down = #expect(throws: TestSupportError.self) { try realm.kinit(user: Self.user, password: Self.password) }
            #expect(down?.description.contains("Cannot contact any KDC") == true, "\(String(describing: down))")
            try await realm.startKDC()
            try realm.kinit(user: Self.user, password: Self.password)
            #expect(try realm.hasValidTicket())

            try realm.kdestroy()
            #expect(try !realm.hasValidTicket())
            try realm.kdestroy()  // none left: no error
        }
    }

    @Test("Apache over TLS: Negotiate gets 200 naming the user, with a mutual-auth token; no ticket, an expired one, a replay get 401")
    func apacheNegotiate() async throws {
        try await Self.withRealm { realm in
            let ca = try TestPKI.makeCA(commonName: "Kerberos Test CA")
            let caFile = realm.directory + "/ca.pem"
            try ca.pem.write(toFile: caFile, atomically: true, encoding: .utf8)
            let started = ContinuousClock.now
            let site = try await ApacheNegotiateSite.start(realm: realm, tlsIdentity: try TestPKI.makeLeaf(dnsNames: ["localhost"], issuer: ca))
            print("Apache with mod_auth_gssapi up on \(site.url("/")) in \(ContinuousClock.now - started)")
            try await Self.stopping({ await site.stop() }) {
                let tls = ["--cacert", caFile]

                // No ticket: curl has no token to send, and Apache challenges.
                let bare = try Self.curl(realm, tls + ["--negotiate", "-u", ":", site.url("/negotiate/")])
                #expect(bare.status == 401, "\(bare.trace)")
                #expect(bare.headers("WWW-Authenticate") == ["Negotiate"])

                try realm.kinit(user: Self.user, password: Self.password)
                var logged = site.requests.count
                let ok = try Self.curl(realm, tls + ["--negotiate", "-u", ":", site.url("/negotiate/")])
                #expect(ok.status == 200, "\(ok.trace)\n\(site.errorLog)")
                #expect(ok.body == "negotiate ok\n")
                // The mutual-authentication token on the 200.
                let mutual = ok.headers("WWW-Authenticate")
                #expect(mutual.count == 1 && mutual[0].hasPrefix("Negotiate ") && mutual[0].count > 40, "\(mutual)")
                #expect(await site.requests(after: logged) { $0.status == 200 }.last?.user == "alice@AUTHBROKER.TEST", "\(site.accessLog)")
                #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") == 1, "\(realm.kdcLog)")

                // The same token again: a replay, refused.
                let token = try #require(ok.sent("Authorization").first)
                let replay = try Self.curl(realm, tls + ["-H", "Authorization: \(token)", site.url("/negotiate/")])
                #expect(replay.status == 401)
                // The refusal carries a token (a SPNEGO reject wrapping KRB_AP_ERR_REPEAT), not a bare challenge.
                #expect(replay.headers("WWW-Authenticate").count == 1)
                #expect(replay.headers("WWW-Authenticate").first?.hasPrefix("Negotiate ") == true)
                #expect(site.errorLog.contains("replay"), "\(site.errorLog)")

                // A second request takes a fresh token from the cached service ticket: no new TGS_REQ.
                #expect(try Self.curl(realm, tls + ["--negotiate", "-u", ":", site.url("/negotiate/")]).status == 200)
                #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") == 1)

                // Without connection binding each request on a connection must authenticate anew;
                // with it (/bound/) the second passes bare.
                let plainTwice = try Self.curl(
                    realm, tls + ["--negotiate", "-u", ":", site.url("/negotiate/"), "--next"] + tls + [site.url("/negotiate/")])
                #expect(plainTwice.statuses == [200, 401], "\(plainTwice.trace)")
                logged = site.requests.count
                let boundTwice = try Self.curl(realm, tls + ["--negotiate", "-u", ":", site.url("/bound/"), "--next"] + tls + [site.url("/bound/")])
                #expect(boundTwice.statuses == [200, 200], "\(boundTwice.trace)")
                #expect(boundTwice.body == "bound ok\nbound ok\n")
                #expect(boundTwice.sent("Authorization").count == 1)
                let bound = await site.requests(after: logged, atLeast: 2) { $0.requestLine.contains("/bound/") && $0.status == 200 }
                #expect(bound.map(\.user) == ["alice@AUTHBROKER.TEST", "alice@AUTHBROKER.TEST"])
                #expect(Set(bound.map(\.clientPort)).count == 1, "one connection: \(site.accessLog)")

                // /negotiate-or-basic/: both challenges; Basic checked against the KDC.
                let either = try Self.curl(realm, tls + [site.url("/negotiate-or-basic/")])
                #expect(either.status == 401)
                #expect(either.headers("WWW-Authenticate") == ["Negotiate", "Basic realm=\"\(ApacheNegotiateSite.basicRealm)\""])
                logged = site.requests.count
                let basic = try Self.curl(realm, tls + ["-u", "\(Self.user):\(Self.password)", site.url("/negotiate-or-basic/")])
                #expect(basic.status == 200)
                #expect(basic.headers("WWW-Authenticate").isEmpty)
                #expect(basic.body == "negotiate-or-basic ok\n")
                #expect(await site.requests(after: logged) { $0.status == 200 }.last?.user == "alice@AUTHBROKER.TEST", "\(site.accessLog)")
                #expect(try Self.curl(realm, tls + ["-u", "\(Self.user):wrong", site.url("/negotiate-or-basic/")]).status == 401)
                #expect(try Self.curl(realm, tls + ["--negotiate", "-u", ":", site.url("/negotiate-or-basic/")]).status == 200)

                // An expired ticket: the client cannot make a token ("Ticket expired"), sends none.
                try realm.kinit(user: Self.user, password: Self.password, lifetime: "2s")
                try await Task.sleep(for: .seconds(3))
                logged = site.requests.count
                let expired = try Self.curl(realm, tls + ["--negotiate", "-u", ":", site.url("/negotiate/")])
                #expect(expired.status == 401)
                #expect(expired.trace.contains("Ticket expired"), "\(expired.trace)")
                #expect(expired.sent("Authorization").isEmpty)

                // Its line logged (it may trail), every 401 of the test is in the log.
                #expect(await site.requests(after: logged) { $0.status == 401 }.count == 1, "\(site.accessLog)")
                #expect(site.unauthorizedCount == 6, "\(site.accessLog)")
                #expect(try Self.curl(realm, tls + [site.url("/public/")]).body == "public ok\n")
            }
        }
    }

    @Test("plain http: Apache's Negotiate without TLS")
    func apachePlainHTTP() async throws {
        try await Self.withRealm { realm in
            let site = try await ApacheNegotiateSite.start(realm: realm)
            try await Self.stopping({ await site.stop() }) {
                try realm.kinit(user: Self.user, password: Self.password)
                #expect(site.url("/negotiate/").hasPrefix("http://localhost:"))
                let ok = try Self.curl(realm, ["--negotiate", "-u", ":", site.url("/negotiate/")])
                #expect(ok.status == 200, "\(ok.trace)\n\(site.errorLog)")
                #expect(await site.requests(after: 0) { $0.status == 200 }.last?.user == "alice@AUTHBROKER.TEST", "\(site.accessLog)")
            }
        }
    }

    @Test(
        "Squid's Negotiate: an http origin and a CONNECT tunnel to Apache's Negotiate, 407 without a ticket",
        arguments: ["HTTP/localhost", "HTTP/127.0.0.1"]
    )
    func squidNegotiate(proxyPrincipal: String) async throws {
        try await Self.withRealm { realm in
            let ca = try TestPKI.makeCA(commonName: "Kerberos Test CA")
            let caFile = realm.directory + "/ca.pem"
            try ca.pem.write(toFile: caFile, atomically: true, encoding: .utf8)
            let started = ContinuousClock.now
            let squid = try await SquidProxy.start(negotiate: realm, principal: proxyPrincipal, hosts: ["localhost"])
            print("Squid with negotiate_kerberos_auth up on \(squid.port) in \(ContinuousClock.now - started)")
            let origin = try await ApacheAuthServer.start(user: "nobody-here", password: "unused")
            let site = try await ApacheNegotiateSite.start(realm: realm, tlsIdentity: try TestPKI.makeLeaf(dnsNames: ["localhost"], issuer: ca))
            // (Had a start thrown, the servers already made would be killed by their deinit.)
            try await Self.stopping({
                await squid.stop()
                await origin.stop()
                await site.stop()
            }) {
                // Clients name the proxy by the host its principal names.
                let proxyHost = String(proxyPrincipal.dropFirst("HTTP/".count))
                let proxy = ["--proxy-negotiate", "-U", ":", "-x", "http://\(proxyHost):\(squid.port)"]

                let refused = try Self.curl(realm, proxy + [origin.url("/public/")])
                #expect(refused.status == 407, "\(refused.trace)")
                #expect(refused.headers("Proxy-Authenticate") == ["Negotiate"])
                // Squid logs a transaction after it ends, too.
                #expect(await waitUntil(seconds: 5) { squid.proxyAuthenticationRequiredCount == 1 }, "\(squid.accessLog)")

                try realm.kinit(user: Self.user, password: Self.password)
                let plain = try Self.curl(realm, proxy + [origin.url("/public/")])
                #expect(plain.status == 200, "\(plain.trace)\n\(squid.accessLog)")
                #expect(plain.body == "public ok\n")
                #expect(
                    await waitUntil(seconds: 5) { squid.accessLog.contains("GET \(origin.url("/public/")) alice@AUTHBROKER.TEST") },
                    "\(squid.accessLog)")
                #expect(realm.serviceTicketsIssued(for: proxyPrincipal) == 1)

                // The same proxy token again: Squid's helper keeps a replay cache too.
                let token = try #require(plain.sent("Proxy-Authorization").first)
                let replay = try Self.curl(realm, ["-x", "http://\(proxyHost):\(squid.port)", "-H", "Proxy-Authorization: \(token)", origin.url("/public/")])
                #expect(replay.status == 407)
                // Unlike Apache, Squid refuses with a bare challenge, no error token.
                #expect(replay.headers("Proxy-Authenticate") == ["Negotiate"])

                // CONNECT through Squid (Negotiate to the proxy), then Negotiate to Apache inside.
                let logged = site.requests.count
                let tunnelled = try Self.curl(realm, proxy + ["--cacert", caFile, "--negotiate", "-u", ":", site.url("/negotiate/")])
                #expect(tunnelled.status == 200, "\(tunnelled.trace)\n\(squid.accessLog)")
                #expect(tunnelled.body == "negotiate ok\n")
                #expect(
                    await waitUntil(seconds: 5) { squid.accessLog.contains("CONNECT localhost:\(site.port) alice@AUTHBROKER.TEST") },
                    "\(squid.accessLog)")
                #expect(await site.requests(after: logged) { $0.status == 200 }.last?.user == "alice@AUTHBROKER.TEST", "\(site.accessLog)")
                // One ticket per principal, from the cache after that.
                #expect(realm.serviceTicketsIssued(for: proxyPrincipal) == 1)
                #expect(realm.serviceTicketsIssued(for: "HTTP/localhost") == 1)
                #expect(await waitUntil(seconds: 5) { squid.proxyAuthenticationRequiredCount == 2 }, "\(squid.accessLog)")
            }
        }
    }
}
