import Foundation
import Testing
import TestSupport

/// The Basic/Digest origin fixture itself: it must refuse what a real server refuses, accept
/// what a real client (the broker's Digest code, and curl) sends, and count what happened.
@Suite("TestAuthOrigin fixture")
struct TestAuthOriginTests {
    static let user = "alice"
    static let password = "secret"

    static func start(_ behaviour: TestAuthBehaviour = TestAuthBehaviour()) async throws -> TestAuthOrigin {
        try await TestAuthOrigin.start(name: "auth", user: user, password: password, behaviour: behaviour)
    }

    static func request(
        _ origin: TestAuthOrigin, _ target: String, method: String = "GET", authorization: String? = nil, body: [UInt8]? = nil
    ) throws -> TestResponse {
        let connection = try UnixSocketConnection(tcpPort: origin.port)
        defer { connection.close() }
        return try connection.request(method, target, headers: authorization.map { [("Authorization", $0)] } ?? [], body: body)
    }

    /// The first 401 for `target` and an answerer for its challenge.
    static func challenge(
        _ origin: TestAuthOrigin, _ target: String, password: String = password
    ) throws -> (TestResponse, TestDigestAnswerer) {
        let response = try request(origin, target)
        #expect(response.status == 401)
        let field = try #require(response.header("WWW-Authenticate") as String?)
        return (response, try TestDigestAnswerer(wwwAuthenticate: field, user: user, password: password))
    }

    static let curl = "/usr/bin/curl"

    static func curlFetch(_ arguments: [String]) throws -> (status: Int, body: String, stderr: String) {
        let result = try ExternalCommand.run(curl, ["-sS", "-w", "\n%{http_code}"] + arguments)
        let lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        let status = Int(lines.last ?? "") ?? -1
        return (status, lines.dropLast().joined(separator: "\n"), result.stderr)
    }

    // MARK: Basic

    @Test("Basic: 401 with the realm and charset, 200 for the right password, 401 and a failure for a wrong one")
    func basic() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }

        let bare = try Self.request(origin, "/basic/x")
        #expect(bare.status == 401)
        #expect(bare.header("WWW-Authenticate") == #"Basic realm="basic@test", charset="UTF-8""#)

        let good = try Self.request(origin, "/basic/x", authorization: "Basic " + Data("alice:secret".utf8).base64EncodedString())
        #expect(good.status == 200)
        #expect(good.text == "hello alice")

        let wrong = try Self.request(origin, "/basic/x", authorization: "Basic " + Data("alice:guess".utf8).base64EncodedString())
        #expect(wrong.status == 401)
        let garbage = try Self.request(origin, "/basic/x", authorization: "Basic !!!")
        #expect(garbage.status == 401)
        let digest = try Self.request(origin, "/basic/x", authorization: #"Digest username="alice""#)
        #expect(digest.status == 401)
        // HEAD: the same answer without a body, on a connection that stays usable.
        let connection = try UnixSocketConnection(tcpPort: origin.port)
        let head = try connection.request("HEAD", "/basic/x")
        #expect(head.status == 401 && head.body.isEmpty)
        #expect(try connection.request("GET", "/basic/x").status == 401)
        connection.close()

        var expected = TestAuthStats()
        expected.requests = 7
        expected.unauthorized = 6
        expected.successes = 1
        expected.failures = 1
        expected.rejections = 2
        #expect(origin.stats == expected)
    }

    // MARK: Digest, every algorithm and qop

    static let routes: [(String, String)] = [
        ("MD5", "auth"), ("MD5", "auth-int"), ("MD5", "none"),
        ("MD5-sess", "auth"), ("MD5-sess", "auth-int"),
        ("SHA-256", "auth"), ("SHA-256", "auth-int"), ("SHA-256", "none"),
        ("SHA-256-sess", "auth"), ("SHA-256-sess", "auth-int"),
        ("SHA-512-256", "auth"), ("SHA-512-256", "auth-int"), ("SHA-512-256", "none"),
        ("SHA-512-256-sess", "auth"), ("SHA-512-256-sess", "auth-int"),
    ]

    @Test("Digest: the broker's own Digest code authenticates; rspauth verifies; nc 2 on the same nonce works; a replay does not", arguments: routes)
    func digestRoute(algorithm: String, qop: String) async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let target = "/digest/\(algorithm)/\(qop)/x?y=1"
        let (first, answererValue) = try Self.challenge(origin, target)
        var answerer = answererValue
        let field = try #require(first.header("WWW-Authenticate"))
        #expect(field.hasPrefix(#"Digest realm="digest@test""#))
        #expect(answerer.algorithm == algorithm)
        #expect(answerer.qopOptions == (qop == "none" ? [] : [qop]))
        #expect(answerer.opaque != nil)
        #expect(!answerer.stale)

        let method = qop == "auth-int" ? "POST" : "GET"
        let body: [UInt8]? = qop == "auth-int" ? Array("a body to protect".utf8) : nil
        let firstClientNonce = "cnonce-one"
        let authorization = try answerer.authorization(method: method, uri: target, body: body, clientNonce: firstClientNonce)
        let ok = try Self.request(origin, target, method: method, authorization: authorization, body: body)
        #expect(ok.status == 200)
        #expect(ok.text == "hello alice")
        let info = try #require(ok.header("Authentication-Info"))
        #expect(answerer.verify(authenticationInfo: info, responseBody: ok.body) == "verified")
        #expect(info.contains("rspauth="))
        if qop == "none" {
            #expect(!info.contains("qop=") && !info.contains("nc="))
        } else {
            #expect(info.contains("qop=\(qop)"))
            #expect(info.contains(#"cnonce="cnonce-one""#))
            #expect(info.contains("nc=00000001"))
        }
        #expect(!info.contains("nextnonce"))

        // The same header again is a replay when nc protects it (RFC 2069 has no nc to check).
        let again = try Self.request(origin, target, method: method, authorization: authorization, body: body)
        #expect(again.status == (qop == "none" ? 200 : 401))

        // The next request on the same nonce: nc 2, a new cnonce; -sess keeps the first in A1.
        let second = try answerer.authorization(
            method: method, uri: target, body: body, nonceCount: 2, clientNonce: "cnonce-two",
            sessionClientNonce: algorithm.hasSuffix("-sess") ? firstClientNonce : nil
        )
        let ok2 = try Self.request(origin, target, method: method, authorization: second, body: body)
        #expect(ok2.status == 200)
        #expect(answerer.verify(authenticationInfo: ok2.header("Authentication-Info") ?? "", responseBody: ok2.body) == "verified")

        let stats = origin.stats
        #expect(stats.successes == (qop == "none" ? 3 : 2))
        #expect(stats.replays == (qop == "none" ? 0 : 1))
        #expect(stats.failures == 0 && stats.rejections == 0 && stats.stale == 0)
    }

    @Test("Digest: the server hashes the request body for auth-int: a changed body fails")
    func authIntCoversTheBody() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let target = "/digest/SHA-256/auth-int/upload"
        var (_, answerer) = try Self.challenge(origin, target)
        let authorization = try answerer.authorization(method: "POST", uri: target, body: Array("original".utf8))
        let tampered = try Self.request(origin, target, method: "POST", authorization: authorization, body: Array("tampered".utf8))
        #expect(tampered.status == 401)
        #expect(origin.stats.failures == 1)
    }

    @Test("Digest: a wrong password is a failure; a wrong uri, realm, algorithm, qop, opaque or an unknown nonce is a rejection")
    func digestRefusals() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let target = "/digest/SHA-256/auth/x"
        let (first, _) = try Self.challenge(origin, target)
        let field = try #require(first.header("WWW-Authenticate"))

        var wrong = try TestDigestAnswerer(wwwAuthenticate: field, user: Self.user, password: "guess")
        #expect(try Self.request(origin, target, authorization: wrong.authorization(uri: target)).status == 401)
        var stranger = try TestDigestAnswerer(wwwAuthenticate: field, user: "mallory", password: Self.password)
        #expect(try Self.request(origin, target, authorization: stranger.authorization(uri: target)).status == 401)
        #expect(origin.stats.failures == 2)

        var right = try TestDigestAnswerer(wwwAuthenticate: field, user: Self.user, password: Self.password)
        // Computed for another uri than the request's.
        #expect(try Self.request(origin, target, authorization: right.authorization(uri: "/digest/SHA-256/auth/other")).status == 401)
        // Challenges altered by hand: the server did not issue these.
        let variants = [
            field.replacingOccurrences(of: "digest@test", with: "elsewhere@test"),
            field.replacingOccurrences(of: "algorithm=SHA-256", with: "algorithm=MD5"),
            field.replacingOccurrences(of: #"qop="auth""#, with: #"qop="auth-int""#),
            field.replacingOccurrences(of: "opaque=\"", with: "opaque=\"x"),
            field.replacingOccurrences(of: "nonce=\"", with: "nonce=\"x"),
        ]
        for variant in variants {
            #expect(variant != field)
            var forged = try TestDigestAnswerer(wwwAuthenticate: variant, user: Self.user, password: Self.password)
            let response = try Self.request(origin, target, authorization: forged.authorization(uri: target, body: variant.contains("auth-int") ? [] : nil))
            #expect(response.status == 401, "\(variant)")
        }
        // Not even Digest, and Digest missing its response.
        #expect(try Self.request(origin, target, authorization: "Basic YWxpY2U6c2VjcmV0").status == 401)
        #expect(try Self.request(origin, target, authorization: #"Digest username="alice", realm="digest@test""#).status == 401)
        let stats = origin.stats
        #expect(stats.rejections == 8)
        #expect(stats.successes == 0)
        #expect(stats.unauthorized == stats.requests)
    }

    @Test("Digest: nc must strictly increase per nonce; a lower nc after a higher one is a replay")
    func nonceCountOrder() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let target = "/digest/MD5/auth/x"
        var (_, answerer) = try Self.challenge(origin, target)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 5)).status == 200)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 3)).status == 401)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 5)).status == 401)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 6)).status == 200)
        #expect(origin.stats.replays == 2)
    }

    @Test("staleAfter: a used-up nonce gets 401 stale=true with a new nonce, which then works")
    func staleAfterUses() async throws {
        let origin = try await Self.start(TestAuthBehaviour(staleAfter: 2))
        defer { Task { await origin.stop() } }
        let target = "/digest/SHA-256/auth/x"
        var (_, answerer) = try Self.challenge(origin, target)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 1)).status == 200)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 2)).status == 200)
        let stale = try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 3))
        #expect(stale.status == 401)
        let field = try #require(stale.header("WWW-Authenticate"))
        #expect(field.contains("stale=true"))
        var renewed = try TestDigestAnswerer(wwwAuthenticate: field, user: Self.user, password: Self.password)
        #expect(renewed.stale)
        #expect(renewed.nonce != answerer.nonce)
        #expect(try Self.request(origin, target, authorization: renewed.authorization(uri: target)).status == 200)
        // A wrong password on a used-up nonce is not stale: stale promises the credentials were right.
        var wrong = try TestDigestAnswerer(wwwAuthenticate: field, user: Self.user, password: "guess")
        let refused = try Self.request(origin, target, authorization: wrong.authorization(uri: target, nonceCount: 9))
        #expect(refused.header("WWW-Authenticate")?.contains("stale") == false)
        let stats = origin.stats
        #expect(stats.stale == 1 && stats.successes == 3 && stats.failures == 1)
    }

    @Test("/control sets a nonce lifetime; an expired nonce with the right credentials is stale")
    func nonceLifetimeThroughControl() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let control = try Self.request(origin, "/control?nonceLifetimeMs=200&staleAfter=none&nextNonceEvery=none")
        #expect(control.status == 200)
        #expect(control.json["nonceLifetimeMs"] as? Int == 200)
        #expect(origin.behaviour.nonceLifetime == .milliseconds(200))
        #expect(try Self.request(origin, "/control?bogus=1").status == 400)

        let target = "/digest/MD5/auth/x"
        var (_, answerer) = try Self.challenge(origin, target)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 1)).status == 200)
        try await Task.sleep(for: .milliseconds(400))
        let stale = try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 2))
        #expect(stale.status == 401)
        #expect(stale.header("WWW-Authenticate")?.contains("stale=true") == true)
        #expect(origin.stats.stale == 1)
    }

    @Test("nextNonceEvery: Authentication-Info carries a nextnonce every N uses, and the next nonce works from nc 1")
    func nextNonce() async throws {
        let origin = try await Self.start(TestAuthBehaviour(nextNonceEvery: 2))
        defer { Task { await origin.stop() } }
        let target = "/digest/SHA-512-256/auth/x"
        var (_, answerer) = try Self.challenge(origin, target)
        let one = try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 1))
        #expect(one.header("Authentication-Info")?.contains("nextnonce") == false)
        let two = try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 2))
        let info = try #require(two.header("Authentication-Info"))
        #expect(answerer.verify(authenticationInfo: info, responseBody: two.body) == "verified")
        let old = answerer.nonce
        let adopted = answerer.adoptNextNonce(from: info)
        #expect(adopted)
        #expect(answerer.nonce != old)
        #expect(try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 1)).status == 200)

        origin.setBehaviour(TestAuthBehaviour(nextNonceEvery: 1))
        let three = try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: 2))
        #expect(three.header("Authentication-Info")?.contains("nextnonce") == true)
        #expect(origin.stats.successes == 4)
    }

    @Test("userhash: the route offers userhash=true and accepts H(user:realm) in place of the name")
    func userhash() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let target = "/digest-userhash/SHA-256/auth/x"
        let (first, offered) = try Self.challenge(origin, target)
        var answerer = offered
        #expect(first.header("WWW-Authenticate")?.contains("userhash=true") == true)
        #expect(answerer.userhash)
        let authorization = try answerer.authorization(uri: target)
        #expect(!authorization.contains(#"username="alice""#))
        #expect(authorization.contains("userhash=true"))
        let ok = try Self.request(origin, target, authorization: authorization)
        #expect(ok.status == 200)
        #expect(ok.text == "hello alice")

        // userhash=true where it was not offered is refused.
        let plainTarget = "/digest/SHA-256/auth/x"
        let (plainChallenge, _) = try Self.challenge(origin, plainTarget)
        let field = try #require(plainChallenge.header("WWW-Authenticate")) + ", userhash=true"
        var forced = try TestDigestAnswerer(wwwAuthenticate: field, user: Self.user, password: Self.password)
        #expect(try Self.request(origin, plainTarget, authorization: forced.authorization(uri: plainTarget)).status == 401)
        #expect(origin.stats.rejections == 1)
    }

    @Test("GET /stats serves the counters as JSON; unknown routes are 404 and -sess without qop does not exist")
    func statsRoute() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        _ = try Self.request(origin, "/basic/x")
        _ = try Self.request(origin, "/digest/MD5/auth/x")
        #expect(try Self.request(origin, "/digest/MD5-sess/none/x").status == 404)
        #expect(try Self.request(origin, "/digest/SHA-1/auth/x").status == 404)
        #expect(try Self.request(origin, "/elsewhere").status == 404)
        let stats = try Self.request(origin, "/stats")
        #expect(stats.status == 200)
        #expect(stats.header("Content-Type") == "application/json")
        let decoded = try JSONDecoder().decode(TestAuthStats.self, from: Data(stats.body))
        #expect(decoded == origin.stats)
        #expect(decoded.requests == 2 && decoded.unauthorized == 2)
    }

    @Test("many clients at once: every request is counted once")
    func concurrentClients() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let target = "/digest/SHA-256/auth/x"
        try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    var (_, answerer) = try Self.challenge(origin, target)
                    var statuses = 0
                    for count in 1...5 {
                        statuses += try Self.request(origin, target, authorization: answerer.authorization(uri: target, nonceCount: UInt32(count))).status
                    }
                    return statuses
                }
            }
            for try await sum in group { #expect(sum == 5 * 200) }
        }
        let stats = origin.stats
        #expect(stats.requests == 48 && stats.successes == 40 && stats.unauthorized == 8)
    }

    // MARK: curl, an independent client

    /// Not SHA-512-256: curl before 8.8 (Debian 12 ships 7.88) hashes it with SHA-256, which the
    /// fixture rightly refuses; Python's hashlib checks that algorithm below instead.
    static let curlRoutes: [String] = ["MD5/auth", "MD5/none", "SHA-256/auth", "SHA-256/none", "MD5-sess/auth", "SHA-256-sess/auth"]

    @Test("curl --digest authenticates against the fixture", arguments: curlRoutes)
    func curlDigest(route: String) async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let url = origin.url("/digest/\(route)/x")
        let good = try Self.curlFetch(["--digest", "-u", "alice:secret", url])
        #expect(good.status == 200, "\(good.stderr)")
        #expect(good.body == "hello alice")
        let bad = try Self.curlFetch(["--digest", "-u", "alice:guess", url])
        #expect(bad.status == 401)
        let stats = origin.stats
        #expect(stats.successes == 1)
        #expect(stats.failures == 1)
    }

    @Test("curl -u (Basic) authenticates against the fixture; curl --digest on userhash works too")
    func curlBasicAndUserhash() async throws {
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let basic = try Self.curlFetch(["-u", "alice:secret", origin.url("/basic/x")])
        #expect(basic.status == 200)
        #expect(basic.body == "hello alice")
        #expect(try Self.curlFetch(["-u", "alice:guess", origin.url("/basic/x")]).status == 401)
        #expect(try Self.curlFetch([origin.url("/basic/x")]).status == 401)
        let hashed = try Self.curlFetch(["--digest", "-u", "alice:secret", origin.url("/digest-userhash/SHA-256/auth/x")])
        #expect(hashed.status == 200, "\(hashed.stderr)")
    }

    /// A Digest client written from RFC 7616 in Python, with OpenSSL's SHA-512/256 (hashlib):
    /// independent of the project's own SHA512_256 on both sides of the other tests.
    static let pythonDigestClient = #"""
        import hashlib, http.client, re, sys
        port, path, method, body = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4].encode()
        conn = http.client.HTTPConnection("127.0.0.1", port)
        conn.request(method, path, body=body)
        r = conn.getresponse(); r.read()
        ch = dict(re.findall(r'(\w+)="?([^",]*)"?', r.getheader("WWW-Authenticate")[len("Digest "):]))
        alg = ch["algorithm"]
        name = {"MD5": "md5", "SHA-256": "sha256", "SHA-512-256": "sha512_256"}[alg.replace("-sess", "")]
        h = lambda b: hashlib.new(name, b if isinstance(b, bytes) else b.encode()).hexdigest()
        qop, nc, cnonce = ch["qop"], "00000001", "0a4f113b"
        ha1 = h("alice:" + ch["realm"] + ":secret")
        if alg.endswith("-sess"):
            ha1 = h(ha1 + ":" + ch["nonce"] + ":" + cnonce)
        ha2 = h(method + ":" + path + (":" + h(body) if qop == "auth-int" else ""))
        resp = h(":".join([ha1, ch["nonce"], nc, cnonce, qop, ha2]))
        auth = ('Digest username="alice", realm="%s", nonce="%s", uri="%s", algorithm=%s, qop=%s, nc=%s, cnonce="%s", response="%s", opaque="%s"'
                % (ch["realm"], ch["nonce"], path, alg, qop, nc, cnonce, resp, ch["opaque"]))
        conn.request(method, path, body=body, headers={"Authorization": auth})
        r = conn.getresponse()
        print(r.status, r.read().decode())
        """#

    @Test(
        "an independent Python client (hashlib SHA-512/256) authenticates",
        arguments: ["SHA-512-256/auth", "SHA-512-256-sess/auth-int", "SHA-256/auth-int", "MD5-sess/auth-int"]
    )
    func pythonDigest(route: String) async throws {
        guard let python = ExternalCommand.find(["/usr/bin/python3", "/usr/local/bin/python3"]) else {
            Issue.record("python3 is not installed (scripts/install-deps test installs it)")
            return
        }
        let origin = try await Self.start()
        defer { Task { await origin.stop() } }
        let result = try ExternalCommand.run(
            python, ["-c", Self.pythonDigestClient, String(origin.port), "/digest/\(route)/x", "POST", "some body"]
        )
        #expect(result.stdout == "200 hello alice\n", "\(result.stderr)")
        #expect(origin.stats.successes == 1)
    }
}
