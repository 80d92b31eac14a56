import AuthBrokerCore
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing
import TestSupport

/// The HTTP cache through the real daemon, against an origin that counts what reaches it.
@Suite("HTTP cache", .serialized)
struct CacheTests {
    /// An origin that logs every request head and answers by path (one request per connection,
    /// `Connection: close`, unless it keeps connections alive), so a test can count what the
    /// cache let through.
    final class CountingOrigin: Sendable {
        let raw: RawOrigin
        private let log: NIOLockedValueBox<[String]>

        private init(raw: RawOrigin, log: NIOLockedValueBox<[String]>) {
            self.raw = raw
            self.log = log
        }

        var port: Int { self.raw.port }

        /// `keepAlive`: connections stay open for further requests (no `Connection: close`).
        static func start(keepAlive: Bool = false) async throws -> CountingOrigin {
            let log = NIOLockedValueBox<[String]>([])
            let raw = try await RawOrigin.start(everyRequest: keepAlive) { received in
                guard let end = RawOrigin.headEnd(in: received) else { return nil }
                let head = String(decoding: received[..<end], as: UTF8.self)
                let bodyLength = head.split(separator: "\r\n").first { $0.lowercased().hasPrefix("content-length:") }
                    .flatMap { Int($0.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) } ?? 0
                guard received.count >= end + 4 + bodyLength else { return nil }
                let count = log.withLockedValue { log in
                    log.append(head)
                    let line = Self.requestLine(head)
                    return log.filter { Self.requestLine($0) == line }.count
                }
                // /hang-later answers once, then never again (an origin that stopped answering).
                if Self.requestLine(head).contains(" /hang-later "), count > 1 { return nil }
                // /slow answers after a moment, so that requests for it overlap.
                let slow = Self.requestLine(head).contains(" /slow")
                let answer = Self.answer(head, count: count)
                if keepAlive { return RawOrigin.Reply(answer.replacingOccurrences(of: "Connection: close\r\n", with: "")) }
                return RawOrigin.Reply(answer, close: true, delay: slow ? .milliseconds(300) : nil)
            }
            return CountingOrigin(raw: raw, log: log)
        }

        /// `GET /path HTTP/1.1` (a String's "\r\n" is one Character: `prefix` would not stop at it).
        static func requestLine(_ head: String) -> Substring { head.split(separator: "\r\n").first ?? "" }

        /// The reply for one request; `count`: how many requests with this request line came.
        static func answer(_ head: String, count: Int) -> String {
            let lines = head.split(separator: "\r\n").map(String.init)
            let parts = lines[0].split(separator: " ")
            let (method, target) = (String(parts[0]), String(parts[1]))
            let path = target.hasPrefix("http") ? "/" + target.split(separator: "/", maxSplits: 3).dropFirst(2).dropFirst().joined() : target
            func field(_ name: String) -> String? {
                lines.dropFirst().first { $0.lowercased().hasPrefix(name + ":") }.map { String($0.dropFirst(name.count + 1)).trimmingCharacters(in: .whitespaces) }
            }
            func reply(_ headers: [String], _ body: String, status: String = "200 OK") -> String {
                (["HTTP/1.1 \(status)", "Content-Length: \(body.utf8.count)", "Connection: close"] + headers).joined(separator: "\r\n")
                    + "\r\n\r\n" + body
            }
            switch (method, path) {
            case ("GET", _) where path.hasPrefix("/sized/"):
                return reply(["Cache-Control: max-age=600"], Self.sizedBody(path, count: count))
            case ("GET", "/etag"):
                if field("if-none-match") == "\"v1\"" { return "HTTP/1.1 304 Not Modified\r\nETag: \"v1\"\r\nCache-Control: max-age=0, x-updated\r\nConnection: close\r\n\r\n" }
                return reply(["ETag: \"v1\"", "Cache-Control: max-age=0"], "etag #\(count)")
            case ("GET", "/vary"):
                return reply(["Cache-Control: max-age=600", "Vary: Accept-Language"], "lang=\(field("accept-language") ?? "-") #\(count)")
            case ("POST", "/item"):
                return reply(["Cache-Control: no-store"], "posted")
            case ("GET", "/public"):
                return reply(["Cache-Control: public, max-age=600"], "public #\(count)")
            case ("GET", "/no-store"), ("GET", "/slow-no-store"):
                return reply(["Cache-Control: no-store"], "no-store #\(count)")
            case ("GET", "/huge-age"):
                // RFC 9111's delta-seconds at Int.max: the sums of the age must not overflow.
                return reply(["Cache-Control: max-age=600", "Age: 9223372036854775807", "ETag: \"a\""], "huge-age #\(count)")
            case ("GET", "/challenge"):
                return reply(
                    ["Cache-Control: public, max-age=3600", "WWW-Authenticate: Basic realm=\"cache\""], "who are you #\(count)",
                    status: "401 Unauthorized"
                )
            case ("GET", "/vary-cookie"):
                return reply(["Cache-Control: public, max-age=600", "Vary: Cookie"], "cookie #\(count)")
            case ("GET", "/hang-later"):
                return reply(["Cache-Control: max-age=0"], "hang-later #\(count)")
            case ("GET", "/must-revalidate"):
                return reply(["Cache-Control: max-age=0, must-revalidate"], "must #\(count)")
            case ("GET", "/etag-changed"):
                // The representation changed: the 304 names another one than the cache holds.
                if field("if-none-match") != nil { return "HTTP/1.1 304 Not Modified\r\nETag: \"v2\"\r\nConnection: close\r\n\r\n" }
                return reply(["ETag: \"\(count == 1 ? "v1" : "v2")\"", "Cache-Control: max-age=0"], "etag-changed #\(count)")
            case ("GET", "/stale-if-error"), ("GET", "/error"), ("GET", "/error-must-revalidate"):
                // Stored at once stale; every later request finds the origin failing.
                if count > 1 { return reply(["Content-Type: text/plain"], "the origin is down", status: "503 Service Unavailable") }
                let directives = ["/stale-if-error": ", stale-if-error=600", "/error-must-revalidate": ", must-revalidate, stale-if-error=600"]
                return reply(["Cache-Control: max-age=0" + (directives[path] ?? "")], "\(path) #\(count)")
            case ("GET", "/head-update"), ("GET", "/head-changed"):
                return reply(["ETag: \"h1\"", "Cache-Control: max-age=\(path == "/head-update" ? 0 : 600)", "X-Version: 1"], "head #\(count)")
            case ("HEAD", "/head-update"), ("HEAD", "/head-changed"):
                // Conditional fields ignored (as an origin may): always the full head, no body.
                // /head-update's is the stored GET's representation, fresh again; /head-changed's a new one.
                let tag = path == "/head-update" ? "\"h1\"" : "\"h2\""
                return "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nETag: \(tag)\r\nCache-Control: max-age=600\r\nX-Version: 2\r\n"
                    + "Set-Cookie: session=app-a\r\nConnection: close\r\n\r\n"
            default:
                // A forged member naming the broker: never reaches the app, miss or hit.
                return reply(["Cache-Control: max-age=600", "Content-Type: text/plain", "Cache-Status: authbrokerd; hit"], "\(path) #\(count)")
            }
        }

        /// The body of `/sized/<bytes>/...`: that many bytes, the request's count first, then a
        /// pattern with no zero byte in it (what a disk that lost blocks shows).
        static func sizedBody(_ path: String, count: Int) -> String {
            let size = Int(path.split(separator: "/")[1]) ?? 0
            let start = "\(path) #\(count)\n"
            let pattern = String(repeating: "0123456789abcdef", count: size / 16 + 1)
            return String((start + pattern).prefix(size))
        }

        /// The request heads that reached the origin for `method path`.
        func requests(_ method: String, _ path: String) -> [String] {
            self.log.withLockedValue { log in
                log.filter { head in
                    Self.requestLine(head) == "\(method) \(path) HTTP/1.1"
                }
            }
        }

        func stop() async { await self.raw.stop() }
    }

    static func config(_ origin: CountingOrigin, cacheDirectory: String) -> String {
        """
        [upstream]
        resolve = ["cache.test:\(origin.port):127.0.0.1"]
        # /hang-later stops answering: the broker gives up waiting for its head after this.
        response_head_timeout_ms = 1000

        [cache]
        enabled = true
        directory = "\(cacheDirectory)"
        """
    }

    /// A daemon with its cache on, in a directory of its own, before a fresh counting origin;
    /// `body` gets the daemon, the origin, its base URL and the cache directory. `prepare` may
    /// put files in the cache directory before the daemon starts.
    static func withCachingDaemon(
        keepAlive: Bool = false, prepare: (String) throws -> Void = { _ in },
        _ body: (DaemonProcess, CountingOrigin, String, String) async throws -> Void
    ) async throws {
        let origin = try await CountingOrigin.start(keepAlive: keepAlive)
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cacheDirectory = directory + "/cache"
        try FileManager.default.createDirectory(atPath: cacheDirectory, withIntermediateDirectories: true)
        try prepare(cacheDirectory)
        try await withDaemon(config: Self.config(origin, cacheDirectory: cacheDirectory)) { daemon in
            try await body(daemon, origin, "http://cache.test:\(origin.port)", cacheDirectory)
        }
    }

    static func get(_ daemon: DaemonProcess, _ url: String, _ headers: [(String, String)] = []) throws -> TestResponse {
        try UnixSocketConnection(path: daemon.socketPath).request("GET", url, headers: headers)
    }

    @Test("fresh hits never reach the origin; stale ones are validated and a 304 refreshes them; Vary separates; unsafe methods invalidate")
    func hitsValidationVaryAndInvalidation() async throws {
        try await Self.withCachingDaemon { daemon, origin, base, cacheDirectory in
            // Fresh: the origin sees the first request only; hits say so and carry Age.
            let first = try Self.get(daemon, base + "/fresh")
            #expect(first.status == 200 && first.text == "/fresh #1")
            #expect(first.header("Cache-Status") == nil)
            for _ in 0..<3 {
                let hit = try Self.get(daemon, base + "/fresh")
                #expect(hit.status == 200 && hit.text == "/fresh #1")
                #expect(hit.header("Cache-Status") == "authbrokerd; hit")
                #expect(hit.header("Age").flatMap(Int.init) != nil)
                #expect(hit.header("Content-Length") == "9" && hit.header("Content-Type") == "text/plain")
                #expect(hit.header("Authbroker-Request-Id") != nil)
            }
            // Fresh hits held in memory are the direct relay's to answer (no task per request).
            let statusCounters = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status").json["counters"] as? [String: Any]
            #expect((statusCounters?["requests_relayed_directly"] as? Int ?? 0) >= 3, "\(String(describing: statusCounters))")
            let head = try UnixSocketConnection(path: daemon.socketPath).request("HEAD", base + "/fresh")
            #expect(head.status == 200 && head.body.isEmpty && head.header("Content-Length") == "9")
            #expect(origin.requests("GET", "/fresh").count == 1 && origin.requests("HEAD", "/fresh").isEmpty)

            // Stale at once: each reuse asks the origin with If-None-Match, and its 304 serves the stored body.
            #expect(try Self.get(daemon, base + "/etag").text == "etag #1")
            let validated = try Self.get(daemon, base + "/etag")
            #expect(validated.status == 200 && validated.text == "etag #1")
            #expect(validated.header("Cache-Status") == "authbrokerd; fwd=stale; fwd-status=304")
            let etagRequests = origin.requests("GET", "/etag")
            #expect(etagRequests.count == 2)
            #expect(etagRequests.last?.lowercased().contains("if-none-match: \"v1\"") == true)
            // The 304's fields replaced the stored ones.
            #expect(validated.header("Cache-Control") == "max-age=0, x-updated")
            // The client's own conditional request is the client's: the origin's 304 goes to it.
            let conditional = try Self.get(daemon, base + "/etag", [("If-None-Match", "\"v1\"")])
            #expect(conditional.status == 304)

            // Vary: one stored response per language.
            #expect(try Self.get(daemon, base + "/vary", [("Accept-Language", "en")]).text == "lang=en #1")
            let de = try Self.get(daemon, base + "/vary", [("Accept-Language", "de")])
            #expect(de.text == "lang=de #2", "\(de.text) \(de.headers)")
            #expect(try Self.get(daemon, base + "/vary", [("Accept-Language", "en")]).text == "lang=en #1")
            #expect(try Self.get(daemon, base + "/vary", [("Accept-Language", "de")]).text == "lang=de #2")
            #expect(origin.requests("GET", "/vary").count == 2)

            // An unsafe method's success removes what is stored for its target.
            let item = try Self.get(daemon, base + "/item")
            #expect(item.text == "/item #1", "\(item.status) \(item.text) \(item.headers) \(origin.requests("GET", "/item"))")
            #expect(try Self.get(daemon, base + "/item").text == "/item #1")
            let post = try UnixSocketConnection(path: daemon.socketPath).request("POST", base + "/item", body: Array("x".utf8))
            #expect(post.status == 200 && post.text == "posted")
            #expect(try Self.get(daemon, base + "/item").text == "/item #2")

            // Credentials: the app's Authorization keeps a response out of the shared cache
            // unless the origin says public.
            let basic = [("Authorization", "Basic YWxpY2U6c2VjcmV0")]
            #expect(try Self.get(daemon, base + "/private", basic).text == "/private #1")
            #expect(try Self.get(daemon, base + "/private", basic).text == "/private #2")
            #expect(try Self.get(daemon, base + "/public", basic).text == "public #1")
            #expect(try Self.get(daemon, base + "/public", basic).text == "public #1")
            #expect(try Self.get(daemon, base + "/no-store").text == "no-store #1")
            #expect(try Self.get(daemon, base + "/no-store").text == "no-store #2")

            // Per request: refresh asks the origin and stores; no-store neither reads nor
            // stores; only-if-cached never reaches the network.
            #expect(try Self.get(daemon, base + "/fresh", [("Authbroker-Cache", "refresh")]).text == "/fresh #2")
            #expect(try Self.get(daemon, base + "/fresh").text == "/fresh #2")
            #expect(try Self.get(daemon, base + "/fresh", [("Authbroker-Cache", "no-store")]).text == "/fresh #3")
            #expect(try Self.get(daemon, base + "/fresh").text == "/fresh #2")
            #expect(try Self.get(daemon, base + "/fresh", [("Cache-Control", "only-if-cached")]).text == "/fresh #2")
            let notCached = try Self.get(daemon, base + "/never", [("Authbroker-Cache", "only-if-cached")])
            #expect(notCached.status == 504 && notCached.header("Authbroker-Error") == "not_cached")
            #expect(origin.requests("GET", "/never").isEmpty)
            // The app asks for a validated response: without a validator, that is a new one.
            let validated2 = try Self.get(daemon, base + "/item", [("Cache-Control", "no-cache")])
            #expect(validated2.text == "/item #3", "\(validated2.text) \(validated2.headers)")
            #expect(try Self.get(daemon, base + "/item").text == "/item #3")

            // What status and the CLI report.
            let status = try CLIAndClientsTests.ctl(daemon, ["cache", "status", "--json"])
            #expect(status.status == 0, "\(status.stderr)")
            let counters = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
            #expect(counters["enabled"] as? Bool == true)
            #expect((counters["hits"] as? Int ?? 0) >= 10)
            #expect(counters["revalidations"] as? Int == 1)
            let list = try CLIAndClientsTests.ctl(daemon, ["cache", "list"])
            #expect(list.status == 0 && list.stdout.contains(base + "/fresh") && list.stdout.contains("varies on accept-language"), "\(list.stdout)")
            let purge = try CLIAndClientsTests.ctl(daemon, ["cache", "purge", base + "/fresh"])
            #expect(purge.status == 0 && purge.stdout.contains("Removed 1"), "\(purge.stdout)")
            #expect(try Self.get(daemon, base + "/fresh").text == "/fresh #4")
            let clear = try CLIAndClientsTests.ctl(daemon, ["cache", "clear"])
            #expect(clear.status == 0 && clear.stdout.contains("Removed"), "\(clear.stdout)")
            #expect(try FileManager.default.contentsOfDirectory(atPath: cacheDirectory).isEmpty)
        }
    }

    @Test("a hostile origin's responses: an Age of Int.max is stale (no crash), a cacheable 401 and a Vary on the app's cookie are not stored")
    func hostileResponses() async throws {
        try await Self.withCachingDaemon { daemon, origin, base, _ in
            #expect(try Self.get(daemon, base + "/huge-age").text == "huge-age #1")
            // Stored, but as old as an age can be: validated, never a trap in the daemon.
            let again = try Self.get(daemon, base + "/huge-age")
            #expect(again.status == 200 && again.text == "huge-age #2", "\(again.status) \(again.text)")
            #expect(origin.requests("GET", "/huge-age").last?.lowercased().contains("if-none-match: \"a\"") == true)
            let list = try CLIAndClientsTests.ctl(daemon, ["cache", "list"])
            #expect(list.status == 0 && list.stdout.contains(base + "/huge-age"), "\(list.stdout) \(list.stderr)")

            for round in 1...2 {
                let challenge = try Self.get(daemon, base + "/challenge")
                #expect(challenge.status == 401 && challenge.text == "who are you #\(round)")
                #expect(challenge.header("Cache-Status") == nil)
                let cookie = try Self.get(daemon, base + "/vary-cookie", [("Cookie", "session=app-a-secret")])
                #expect(cookie.text == "cookie #\(round)")
            }
            #expect(origin.requests("GET", "/challenge").count == 2 && origin.requests("GET", "/vary-cookie").count == 2)
            let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
            #expect(status.status == 200, "the daemon still answers")
        }
    }

    @Test("what one app fetched with a client identity it named is not stored for the others (a certificate is a credential)")
    func identityResponsesAreNotShared() async throws {
        let serverCA = try TestPKI.makeCA(commonName: "Cache Server CA")
        let server = try TestPKI.makeLeaf(dnsNames: ["mtls-cache.internal.test"], issuer: serverCA)
        let clientCA = try TestPKI.makeCA(commonName: "Cache Client CA")
        let origin = try await TestOrigin.start(name: "mtls-cache", identity: server, clientCA: clientCA, clientCertificateOptional: true)
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let config = configText(
            resolving: [("mtls-cache.internal.test", origin)], extra: "\n[cache]\nenabled = true\ndirectory = \"\(directory)/cache\"\n"
        )
        try await withDaemon(config: config) { daemon in
            #expect(try addAnchor(daemon, pem: serverCA.pem, hosts: ["mtls-cache.internal.test"]).status == 201)
            let client = try TestPKI.makeClient(commonName: "app-a", issuer: clientCA)
            let cert = daemon.directory + "/app-a.crt", key = daemon.directory + "/app-a.key"
            try client.pem.write(toFile: cert, atomically: true, encoding: .utf8)
            try client.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
            // No --hosts: presented only to requests that name it.
            let imported = try CLIAndClientsTests.ctl(daemon, ["identities", "import", "--cert", cert, "--key", key, "--name", "app-a"])
            #expect(imported.status == 0, "\(imported.stderr)")
            let url = "https://mtls-cache.internal.test:\(origin.port)/client-cert?cacheable"
            let named = try fetch(daemon, url, headers: [("Authbroker-Identity", "app-a")])
            #expect(named.status == 200 && named.text == "presented", "\(named.status) \(named.text)")
            let other = try fetch(daemon, url)
            #expect(other.status == 200 && other.text == "none", "served what app-a's certificate fetched: \(other.text)")
            #expect(other.header("Cache-Status") == nil)
            // What was fetched without one is stored, and served as usual.
            let again = try fetch(daemon, url)
            #expect(again.text == "none" && again.header("Cache-Status") == "authbrokerd; hit", "\(again.headers)")
        }
    }

    @Test("a stored response never stands in for a server whose certificate is no longer trusted")
    func trustRefusalIsNotHiddenByTheCache() async throws {
        let serverCA = try TestPKI.makeCA(commonName: "Cache Trust CA")
        let server = try TestPKI.makeLeaf(dnsNames: ["trust-cache.internal.test"], issuer: serverCA)
        let origin = try await TestOrigin.start(name: "trust-cache", identity: server)
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let config = configText(
            resolving: [("trust-cache.internal.test", origin)], extra: "\n[cache]\nenabled = true\ndirectory = \"\(directory)/cache\"\n"
        )
        try await withDaemon(config: config) { daemon in
            let added = try addAnchor(daemon, pem: serverCA.pem, hosts: ["trust-cache.internal.test"])
            let id = try #require((added.json["anchors"] as? [[String: Any]])?.first?["id"] as? String)
            let url = "https://trust-cache.internal.test:\(origin.port)/client-cert?stale"
            #expect(try fetch(daemon, url).text == "none")
            let removed = try UnixSocketConnection(path: daemon.socketPath).request("DELETE", "/v1/anchors/\(id)")
            #expect(removed.status == 200, "\(removed.text)")
            let refused = try fetch(daemon, url)
            #expect(refused.status == 502, "the stored response hid the trust failure: \(refused.headers)")
            #expect(refused.header("Authbroker-Error") == "untrusted_server")
            #expect(refused.header("Cache-Status") == nil)
        }
    }

    @Test("offline mode answers from the cache only; an unreachable origin's stored responses are served stale, marked")
    func offlineAndUnreachable() async throws {
        // A cache directory with a stranger's file and an unfinished write in it: both go.
        let prepare = { (cacheDirectory: String) throws in
            try Data("garbage".utf8).write(to: URL(fileURLWithPath: cacheDirectory + "/00000000deadbeef.entry"))
            try Data("half".utf8).write(to: URL(fileURLWithPath: cacheDirectory + "/.tmp-1"))
        }
        try await Self.withCachingDaemon(prepare: prepare) { daemon, origin, base, cacheDirectory in
            #expect(!FileManager.default.fileExists(atPath: cacheDirectory + "/00000000deadbeef.entry"))
            #expect(!FileManager.default.fileExists(atPath: cacheDirectory + "/.tmp-1"))
            #expect(try Self.get(daemon, base + "/etag").text == "etag #1")
            #expect(try Self.get(daemon, base + "/must-revalidate").text == "must #1")

            let on = try CLIAndClientsTests.ctl(daemon, ["offline", "on"])
            #expect(on.status == 0 && on.stdout.contains("Offline"), "\(on.stdout) \(on.stderr)")
            let stale = try Self.get(daemon, base + "/etag")
            #expect(stale.status == 200 && stale.text == "etag #1")
            #expect(stale.header("Cache-Status") == "authbrokerd; hit; detail=\"offline\"")
            let never = try Self.get(daemon, base + "/never")
            #expect(never.status == 504 && never.header("Authbroker-Error") == "not_cached")
            #expect(never.text.contains("authbrokerctl offline off"))
            // must-revalidate: never served stale.
            #expect(try Self.get(daemon, base + "/must-revalidate").header("Authbroker-Error") == "not_cached")
            let post = try UnixSocketConnection(path: daemon.socketPath).request("POST", base + "/item", body: Array("x".utf8))
            #expect(post.status == 503 && post.header("Authbroker-Error") == "offline")
            #expect(origin.requests("GET", "/etag").count == 1 && origin.requests("POST", "/item").isEmpty)
            let status = try CLIAndClientsTests.ctl(daemon, ["status"])
            #expect(status.stdout.contains("Offline mode is on") && status.stdout.contains("(offline)"), "\(status.stdout)")
            #expect(try CLIAndClientsTests.ctl(daemon, ["offline", "off"]).stdout.contains("Online"))

            // The origin stops answering: after the head timeout, the stored response answers.
            #expect(try Self.get(daemon, base + "/hang-later").text == "hang-later #1")
            let late = try Self.get(daemon, base + "/hang-later")
            #expect(late.status == 200 && late.text == "hang-later #1", "\(late.status) \(late.text)")
            #expect(late.header("Proxy-Status")?.hasPrefix("authbrokerd; error=http_response_timeout") == true, "\(late.headers)")
            #expect(origin.requests("GET", "/hang-later").count == 2)

            // The origin goes away: the stored response answers, saying why.
            await origin.stop()
            let fallback = try Self.get(daemon, base + "/etag")
            #expect(fallback.status == 200 && fallback.text == "etag #1")
            #expect(fallback.header("Cache-Status") == "authbrokerd; hit; detail=\"origin-unreachable\"")
            #expect(fallback.header("Proxy-Status")?.hasPrefix("authbrokerd; error=connection_refused") == true)
            #expect(fallback.header("Authbroker-Error") == nil)
            // Nothing stored: the broker's error, as without a cache.
            #expect(try Self.get(daemon, base + "/never").header("Authbroker-Error") == "connection_refused")
            #expect(try Self.get(daemon, base + "/must-revalidate").header("Authbroker-Error") == "connection_refused")
        }
    }

    @Test("a 304 that does not select the stored response never reaches an app that did not ask conditionally")
    func notModifiedForAnotherRepresentation() async throws {
        try await Self.withCachingDaemon { daemon, origin, base, _ in
            #expect(try Self.get(daemon, base + "/etag-changed").text == "etag-changed #1")
            // Stale: the broker validates with "v1"; the origin's 304 names "v2", so the request
            // goes again as the app sent it, and the app gets the full response.
            let second = try Self.get(daemon, base + "/etag-changed")
            #expect(second.status == 200 && second.text == "etag-changed #3", "\(second.status) \(second.text) \(second.headers)")
            let requests = origin.requests("GET", "/etag-changed").map { $0.lowercased() }
            #expect(requests.count == 3)
            #expect(requests.dropFirst().first?.contains("if-none-match: \"v1\"") == true)
            #expect(requests.last?.contains("if-none-match") == false, "\(requests)")
            // What it got is stored: the next validation names "v2", and the 304 selects it.
            let third = try Self.get(daemon, base + "/etag-changed")
            #expect(third.status == 200 && third.text == "etag-changed #3")
            #expect(third.header("Cache-Status") == "authbrokerd; fwd=stale; fwd-status=304")
            #expect(origin.requests("GET", "/etag-changed").last?.lowercased().contains("if-none-match: \"v2\"") == true)
            // The app's own conditional request gets the origin's 304, whatever it names.
            let conditional = try Self.get(daemon, base + "/etag-changed", [("If-None-Match", "\"v1\"")])
            #expect(conditional.status == 304 && conditional.header("ETag") == "\"v2\"")
        }
    }

    @Test("stale-if-error: a stored response answers for an origin that fails with 5xx, unless it may not be served stale")
    func staleIfError() async throws {
        try await Self.withCachingDaemon { daemon, origin, base, _ in
            for path in ["/stale-if-error", "/error", "/error-must-revalidate"] {
                #expect(try Self.get(daemon, base + path).text == "\(path) #1")
            }
            // The origin permits it: the stored response, marked, instead of the 503.
            let stale = try Self.get(daemon, base + "/stale-if-error")
            #expect(stale.status == 200 && stale.text == "/stale-if-error #1", "\(stale.status) \(stale.text) \(stale.headers)")
            #expect(stale.header("Cache-Status") == "authbrokerd; fwd=stale; fwd-status=503")
            #expect(stale.header("Age").flatMap(Int.init) != nil)
            #expect(stale.header("Authbroker-Error") == nil && stale.header("Warning") == nil)
            // The error's body was read away: the daemon answers the next request as before.
            #expect(try Self.get(daemon, base + "/stale-if-error").text == "/stale-if-error #1")
            #expect(origin.requests("GET", "/stale-if-error").count == 3)
            // Nothing permits it: the origin's 503 goes to the app.
            let error = try Self.get(daemon, base + "/error")
            #expect(error.status == 503 && error.text == "the origin is down")
            #expect(error.header("Cache-Status") == nil)
            // The app permits it.
            let asked = try Self.get(daemon, base + "/error", [("Cache-Control", "stale-if-error=600")])
            #expect(asked.status == 200 && asked.text == "/error #1", "\(asked.status) \(asked.text)")
            // must-revalidate outranks stale-if-error.
            let mustRevalidate = try Self.get(daemon, base + "/error-must-revalidate")
            #expect(mustRevalidate.status == 503 && mustRevalidate.text == "the origin is down")
            let status = try CLIAndClientsTests.ctl(daemon, ["cache", "status", "--json"])
            let counters = try #require(try JSONSerialization.jsonObject(with: Data(status.stdout.utf8)) as? [String: Any])
            #expect(counters["served_stale"] as? Int == 3, "\(counters)")
        }
        // An origin that keeps its connection: the 503's body is read away, and the pooled
        // connection carries the next request. One client connection, so each request starts
        // only after the last one's upstream connection went back to the pool.
        try await Self.withCachingDaemon(keepAlive: true) { daemon, origin, base, _ in
            let client = try UnixSocketConnection(path: daemon.socketPath)
            #expect(try client.request("GET", base + "/stale-if-error").text == "/stale-if-error #1")
            for _ in 0..<2 {
                let stale = try client.request("GET", base + "/stale-if-error")
                #expect(stale.status == 200 && stale.text == "/stale-if-error #1", "\(stale.status) \(stale.text)")
            }
            #expect(origin.requests("GET", "/stale-if-error").count == 3)
            #expect(origin.raw.acceptedConnections == 1)
        }
    }

    @Test("a HEAD response freshens the stored GET it matches, and removes one it does not")
    func headUpdatesStoredGet() async throws {
        try await Self.withCachingDaemon { daemon, origin, base, _ in
            #expect(try Self.get(daemon, base + "/head-update").text == "head #1")
            #expect(try Self.get(daemon, base + "/head-changed").text == "head #1")
            let socket = daemon.socketPath
            // Same ETag and length: the stored GET takes the HEAD's fields, fresh for 600 s.
            let head = try UnixSocketConnection(path: socket).request("HEAD", base + "/head-update")
            #expect(head.status == 200 && head.header("X-Version") == "2", "\(head.status) \(head.headers)")
            #expect(head.header("Set-Cookie") == "session=app-a")
            let updated = try Self.get(daemon, base + "/head-update")
            #expect(updated.text == "head #1" && updated.header("X-Version") == "2", "\(updated.text) \(updated.headers)")
            // The cookie was the app's that sent the HEAD: the entry does not keep it.
            #expect(updated.header("Set-Cookie") == nil)
            #expect(updated.header("Cache-Status") == "authbrokerd; hit")
            #expect(origin.requests("GET", "/head-update").count == 1)
            // Another ETag: the stored GET describes what is no longer there, and goes.
            let changed = try UnixSocketConnection(path: socket).request("HEAD", base + "/head-changed", headers: [("Cache-Control", "no-cache")])
            #expect(changed.status == 200 && changed.header("ETag") == "\"h2\"")
            #expect(origin.requests("HEAD", "/head-changed").count == 1)
            let refetched = try Self.get(daemon, base + "/head-changed")
            #expect(refetched.text == "head #2" && refetched.header("Cache-Status") == nil, "\(refetched.text) \(refetched.headers)")
        }
        // A HEAD that carried credentials: its response is that app's, and updates nothing the
        // other apps are served.
        try await Self.withCachingDaemon { daemon, origin, base, _ in
            #expect(try Self.get(daemon, base + "/head-update").text == "head #1")
            let head = try UnixSocketConnection(path: daemon.socketPath).request(
                "HEAD", base + "/head-update", headers: [("Authorization", "Basic YWxpY2U6c2VjcmV0")]
            )
            #expect(head.status == 200 && head.header("X-Version") == "2")
            let after = try Self.get(daemon, base + "/head-update")
            #expect(after.header("X-Version") == "1" && after.header("Cache-Status") != "authbrokerd; hit", "\(after.headers)")
            #expect(origin.requests("GET", "/head-update").count == 2)
        }
    }

    @Test("concurrent requests for one missing URL reach the origin once; the others are answered from what it stored")
    func collapsedMisses() async throws {
        try await Self.withCachingDaemon { daemon, origin, base, _ in
            for path in ["/slow", "/slow-no-store"] {
                let lock = NSLock()
                nonisolated(unsafe) var bodies: [String] = []  // guarded by `lock`
                let done = DispatchGroup()
                let socketPath = daemon.socketPath
                for _ in 0..<8 {
                    done.enter()
                    // Threads, not tasks: the socket client blocks, and the requests must overlap.
                    Thread.detachNewThread {
                        defer { done.leave() }
                        let text = (try? UnixSocketConnection(path: socketPath).request("GET", base + path).text) ?? "failed"
                        lock.withLock { bodies.append(text) }
                    }
                }
                await withCheckedContinuation { continuation in
                    DispatchQueue.global().async {
                        done.wait()
                        continuation.resume()
                    }
                }
                let got = lock.withLock { bodies }
                if path == "/slow" {
                    // One request went to the origin; the seven others waited and got what it stored.
                    #expect(got == Array(repeating: "/slow #1", count: 8), "\(got)")
                    #expect(origin.requests("GET", path).count == 1)
                } else {
                    // Not storable: those that waited go to the origin themselves, and all get an answer.
                    #expect(got.count == 8 && got.allSatisfy { $0.hasPrefix("no-store #") }, "\(got)")
                    #expect(origin.requests("GET", path).count == 8)
                }
            }
        }
    }

    @Test("a body whose bytes the disk lost while the daemon was down (its length intact) is never served: the origin answers")
    func lostBodyBytesAfterARestart() async throws {
        let origin = try await CountingOrigin.start()
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let cacheDirectory = directory + "/cache"
        try FileManager.default.createDirectory(atPath: cacheDirectory, withIntermediateDirectories: true)
        let config = Self.config(origin, cacheDirectory: cacheDirectory)
        let base = "http://cache.test:\(origin.port)"
        // A body read whole (and held in memory), and one checked in a pass of its own; of each,
        // one the disk loses blocks of and one it keeps.
        let paths = [1024, 1 << 20].flatMap { ["/sized/\($0)/lost", "/sized/\($0)/kept"] }
        try await withDaemon(config: config) { (daemon: DaemonProcess) async throws in
            for path in paths {
                #expect(try Self.get(daemon, base + path).text == CountingOrigin.sizedBody(path, count: 1))
                #expect(try Self.get(daemon, base + path).header("Cache-Status") == "authbrokerd; hit")
            }
        }

        // A power cut while it was down: blocks of two bodies read back as zeros, the files'
        // lengths (so their heads' checks) intact.
        var damaged = 0
        for name in try FileManager.default.contentsOfDirectory(atPath: cacheDirectory) {
            let (head, bodyOffset, _) = try CacheEntryFile.readHead(cacheDirectory + "/" + name).get()
            guard head.url.hasSuffix("/lost") else { continue }
            let handle = try #require(FileHandle(forWritingAtPath: cacheDirectory + "/" + name))
            try handle.seek(toOffset: UInt64(bodyOffset) + UInt64(head.bodyLength / 2))
            try handle.write(contentsOf: Data(count: head.bodyLength > 4096 ? 4096 : 256))
            try handle.close()
            damaged += 1
        }
        #expect(damaged == 2)

        try await withDaemon(config: config) { daemon in
            for path in paths {
                let lost = path.hasSuffix("/lost")
                let response = try Self.get(daemon, base + path)
                #expect(response.status == 200)
                #expect(!response.body.contains(0), "\(path): the lost bytes were served")
                // The origin's new answer; the kept one still from the cache.
                #expect(response.text == CountingOrigin.sizedBody(path, count: lost ? 2 : 1), "\(path)")
                #expect(response.header("Cache-Status") == (lost ? nil : "authbrokerd; hit"), "\(path)")
                #expect(origin.requests("GET", path).count == (lost ? 2 : 1), "\(path)")
                // The new answer was stored in place of the lost one.
                let again = try Self.get(daemon, base + path)
                #expect(again.text == CountingOrigin.sizedBody(path, count: lost ? 2 : 1), "\(path)")
                #expect(again.header("Cache-Status") == "authbrokerd; hit")
            }
            #expect(origin.requests("GET", "/sized/1024/lost").count == 2 && origin.requests("GET", "/sized/1048576/lost").count == 2)
            #expect(daemon.log.components(separatedBy: "dropped a cache entry that did not match its head").count == 3, "\(daemon.log)")
        }
    }

    @Test("with the cache off, the cache commands say how to turn it on")
    func cacheOff() async throws {
        try await withDaemon { daemon in
            let status = try CLIAndClientsTests.ctl(daemon, ["cache"])
            #expect(status.status == 0 && status.stdout.contains("enabled = true"), "\(status.stdout)")
            let offline = try CLIAndClientsTests.ctl(daemon, ["offline", "on"])
            #expect(offline.status != 0 && offline.stderr.contains("[cache]"), "\(offline.stderr)")
        }
    }
}
