import Foundation
import Testing
import TestSupport

/// `[[rewrite]]`: another URL (judged by the new host's trust), another address for the same
/// name (which must still prove it is that host), and request and response fields edited.
@Suite("Rewrite rules", .serialized)
struct RewriteRuleTests {
    @Test("to, connect_to and header edits apply through the socket and the proxy port; trust is never weakened")
    func rewrites() async throws {
        let new = try await TestOrigin.start(name: "new")
        defer { Task { await new.stop() } }
        let ca = try TestPKI.makeCA(commonName: "Rewrite CA")
        let prod = try await TestOrigin.start(name: "prod-replica", identity: try TestPKI.makeLeaf(dnsNames: ["prod.test"], issuer: ca))
        defer { Task { await prod.stop() } }
        let impostor = try await TestOrigin.start(name: "impostor", identity: try TestPKI.makeLeaf(dnsNames: ["other.test"], issuer: ca))
        defer { Task { await impostor.stop() } }
        let config = """
            [upstream]
            resolve = ["new.test:\(new.port):127.0.0.1"]

            [[rewrite]]
            host = "old.test"
            path = "/api/"
            to = "http://new.test:\(new.port)/"
            set_request_headers = ["X-Env: staging"]
            remove_request_headers = ["Cookie"]
            set_response_headers = ["Cache-Control: no-store"]
            remove_response_headers = ["X-Origin"]

            [[rewrite]]
            host = "prod.test"
            connect_to = "127.0.0.1:\(prod.port)"

            [[rewrite]]
            host = "fake.test"
            connect_to = "127.0.0.1:\(impostor.port)"

            [flows]
            record = "always"
            """
        try await withDaemon(config: config) { daemon in
            #expect(try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/anchors", headers: [("Content-Type", "application/json")], body: jsonBody(["pem": ca.pem])
            ).status == 201)
            let echoed = try UnixSocketConnection(path: daemon.socketPath).request(
                "GET", "http://old.test/api/headers?q=1", headers: [("Cookie", "session=secret"), ("X-Keep", "yes")]
            )
            #expect(echoed.status == 200)
            #expect(echoed.json["uri"] as? String == "/headers?q=1")
            let fields = (echoed.json["headers"] as? [[String]]) ?? []
            let names = fields.compactMap { $0.first?.lowercased() }
            #expect(names.contains("x-env") && names.contains("x-keep") && !names.contains("cookie"), "\(fields)")
            #expect(fields.contains(["Host", "new.test:\(new.port)"]) || fields.contains(["host", "new.test:\(new.port)"]), "\(fields)")
            #expect(echoed.header("Cache-Control") == "no-store")
            #expect(echoed.header("X-Origin") == nil)
            // Outside the rule's path: not rewritten (and old.test does not exist).
            let outside = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://old.test/other")
            #expect(outside.header("Authbroker-Error") == "dns_error")

            // connect_to: another address, the same name for TLS, through the proxy port too.
            let replica = try UnixSocketConnection(path: daemon.socketPath).request("GET", "https://prod.test/hello")
            #expect(replica.status == 200 && replica.text == "hello from prod-replica")
            let curl = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "https://prod.test/hello"])
            #expect(curl.stdout == "hello from prod-replica", "\(curl.stderr)")
            // A server there that cannot prove it is the host is refused, as without the rule.
            let fake = try UnixSocketConnection(path: daemon.socketPath).request("GET", "https://fake.test/hello")
            #expect(fake.status == 502)
            #expect(fake.header("Authbroker-Error") == "untrusted_server")

            // The flow log says which rule sent each request where.
            let flows = try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow"])
            let lines = flows.stdout.split(separator: "\n")
            #expect(lines.contains { $0.contains("GET http://old.test/api/headers?q=1 200") && $0.hasSuffix("rewrite config.toml:4, to http://new.test:\(new.port)/headers?q=1") }, "\(flows.stdout)")
            #expect(lines.contains { $0.contains("GET https://prod.test/hello 200") && $0.hasSuffix("rewrite config.toml:13, to 127.0.0.1:\(prod.port)") }, "\(flows.stdout)")
        }
    }
}
