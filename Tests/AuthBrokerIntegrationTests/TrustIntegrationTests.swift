import Foundation
import Testing
import TestSupport

/// Server trust through the real daemon over TLS, with a PKI made at run time.
@Suite("Server trust, end to end")
struct TrustIntegrationTests {
    @Test("a self-signed server is refused with reasons, fingerprints and the fix; the anchor fixes it and survives a restart")
    func selfSignedThenAnchored() async throws {
        let leaf = try TestPKI.makeLeaf(dnsNames: ["self-signed.internal.test"], issuer: nil)
        let origin = try await TestOrigin.start(name: "self-signed", identity: leaf)
        defer { Task { await origin.stop() } }
        let config = configText(resolving: [("self-signed.internal.test", origin)])
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }

        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            let refused = try fetch(daemon, "https://self-signed.internal.test:\(origin.port)/hello")
            #expect(refused.status == 502)
            #expect(refused.header("Proxy-Status")?.contains("error=tls_certificate_error") == true)
            #expect(refused.header("Content-Type") == "application/problem+json")
            #expect(refused.header("Authbroker-Request-Id")?.count == 15)
            let problem = refused.json
            #expect(problem["code"] as? String == "untrusted_server")
            #expect((problem["detail"] as? String)?.contains("self-signed.internal.test") == true)
            let reasons = problem["reasons"] as? [String] ?? []
            #expect(reasons.contains { $0.lowercased().contains("self-signed") })
            let chain = problem["chain"] as? [[String: Any]] ?? []
            #expect(chain.first?["sha256"] as? String == leaf.sha256Fingerprint)
            let fix = problem["fix"] as? [String] ?? []
            #expect(fix.contains { $0.hasPrefix("authbrokerctl anchors trust-server https://self-signed.internal.test:\(origin.port) --fingerprint \(leaf.sha256Fingerprint)") })
            #expect(fix.contains { $0.hasPrefix("authbrokerctl anchors add") })
            // The refused connection was never open as far as the counters go (it went to -1).
            #expect(try await DirectRelayTests.counter(daemon, "upstream_connections_open", settlesAt: 0) == 0)

            let added = try addAnchor(daemon, pem: leaf.pem, hosts: ["*.internal.test"])
            #expect(added.status == 201)
            let allowed = try fetch(daemon, "https://self-signed.internal.test:\(origin.port)/hello")
            #expect(allowed.status == 200)
            #expect(allowed.text == "hello from self-signed")
        }
        // The anchor is in the daemon's state directory: a new daemon on the same state trusts it.
        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            let again = try fetch(daemon, "https://self-signed.internal.test:\(origin.port)/hello")
            #expect(again.status == 200)
        }
    }

    @Test("a CA anchor scoped to *.internal.test is used there and not for another host")
    func scopedAnchor() async throws {
        let ca = try TestPKI.makeCA(commonName: "Internal Test CA")
        let inside = try TestPKI.makeLeaf(dnsNames: ["app.internal.test"], issuer: ca)
        let outside = try TestPKI.makeLeaf(dnsNames: ["app.other.test"], issuer: ca)
        let insideOrigin = try await TestOrigin.start(name: "inside", identity: inside)
        let outsideOrigin = try await TestOrigin.start(name: "outside", identity: outside)
        defer { Task { await insideOrigin.stop(); await outsideOrigin.stop() } }
        let config = configText(resolving: [("app.internal.test", insideOrigin), ("app.other.test", outsideOrigin)])
        try await withDaemon(config: config) { daemon in
            let before = try fetch(daemon, "https://app.internal.test:\(insideOrigin.port)/hello")
            #expect(before.status == 502)
            #expect((before.json["reasons"] as? [String])?.isEmpty == false)

            #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["*.internal.test"]).status == 201)
            let trusted = try fetch(daemon, "https://app.internal.test:\(insideOrigin.port)/hello")
            #expect(trusted.status == 200)
            #expect(trusted.text == "hello from inside")

            let elsewhere = try fetch(daemon, "https://app.other.test:\(outsideOrigin.port)/hello")
            #expect(elsewhere.status == 502)
            #expect(elsewhere.header("Proxy-Status")?.contains("tls_certificate_error") == true)
            let reasons = (elsewhere.json["reasons"] as? [String] ?? []).joined(separator: " ")
            #expect(reasons.contains("*.internal.test"))
        }
    }

    @Test("an intermediate chain verifies; unknown CA, expired and wrong-host servers are refused with their reason")
    func failureReasons() async throws {
        let root = try TestPKI.makeCA(commonName: "Root CA")
        let intermediate = try TestPKI.makeCA(commonName: "Intermediate CA", issuer: root)
        let good = try TestPKI.makeLeaf(dnsNames: ["good.internal.test"], issuer: intermediate)
        let unknownCA = try TestPKI.makeCA(commonName: "Unknown CA")
        let unknown = try TestPKI.makeLeaf(dnsNames: ["unknown.internal.test"], issuer: unknownCA)
        let expired = try TestPKI.makeLeaf(
            dnsNames: ["expired.internal.test"], issuer: root,
            notBefore: .now - 86400 * 10, notAfter: .now - 86400
        )
        let wrongHost = try TestPKI.makeLeaf(dnsNames: ["someone-else.internal.test"], issuer: root)

        let goodOrigin = try await TestOrigin.start(name: "good", identity: good, chain: [intermediate])
        let unknownOrigin = try await TestOrigin.start(name: "unknown", identity: unknown)
        let expiredOrigin = try await TestOrigin.start(name: "expired", identity: expired)
        let wrongOrigin = try await TestOrigin.start(name: "wrong", identity: wrongHost)
        defer {
            Task {
                for origin in [goodOrigin, unknownOrigin, expiredOrigin, wrongOrigin] { await origin.stop() }
            }
        }
        let config = configText(resolving: [
            ("good.internal.test", goodOrigin), ("unknown.internal.test", unknownOrigin),
            ("expired.internal.test", expiredOrigin), ("wrong.internal.test", wrongOrigin),
        ])
        try await withDaemon(config: config) { daemon in
            #expect(try addAnchor(daemon, pem: root.pem, hosts: []).status == 201)

            let ok = try fetch(daemon, "https://good.internal.test:\(goodOrigin.port)/hello")
            #expect(ok.status == 200)

            let unknownResponse = try fetch(daemon, "https://unknown.internal.test:\(unknownOrigin.port)/hello")
            #expect(unknownResponse.status == 502)
            #expect(Self.reasonText(unknownResponse).contains("issuer"))

            let expiredResponse = try fetch(daemon, "https://expired.internal.test:\(expiredOrigin.port)/hello")
            #expect(expiredResponse.status == 502)
            #expect(Self.reasonText(expiredResponse).contains("expired"))

            let wrongResponse = try fetch(daemon, "https://wrong.internal.test:\(wrongOrigin.port)/hello")
            #expect(wrongResponse.status == 502)
            #expect(Self.reasonText(wrongResponse).contains("wrong.internal.test"))
        }
    }

    @Test("a server addressed by IP is checked against its IP SAN")
    func ipAddressServer() async throws {
        let ca = try TestPKI.makeCA(commonName: "IP CA")
        let byIP = try TestPKI.makeLeaf(ipAddresses: ["127.0.0.1"], issuer: ca)
        let namesOnly = try TestPKI.makeLeaf(dnsNames: ["localhost.internal.test"], issuer: ca)
        let ipOrigin = try await TestOrigin.start(name: "ip", identity: byIP)
        let nameOrigin = try await TestOrigin.start(name: "names", identity: namesOnly)
        defer { Task { await ipOrigin.stop(); await nameOrigin.stop() } }
        try await withDaemon { daemon in
            #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["127.0.0.1"]).status == 201)
            let ok = try fetch(daemon, "https://127.0.0.1:\(ipOrigin.port)/hello")
            #expect(ok.status == 200)
            let mismatch = try fetch(daemon, "https://127.0.0.1:\(nameOrigin.port)/hello")
            #expect(mismatch.status == 502)
            #expect(Self.reasonText(mismatch).contains("127.0.0.1"))
        }
    }

    @Test("an SPKI pin admits the pinned key and refuses another key for the same host")
    func pins() async throws {
        let ca = try TestPKI.makeCA(commonName: "Pinned CA")
        let pinned = try TestPKI.makeLeaf(dnsNames: ["pinned.internal.test"], issuer: ca)
        let other = try TestPKI.makeLeaf(dnsNames: ["pinned.internal.test"], issuer: ca)
        let pinnedOrigin = try await TestOrigin.start(name: "pinned", identity: pinned)
        let otherOrigin = try await TestOrigin.start(name: "other", identity: other)
        defer { Task { await pinnedOrigin.stop(); await otherOrigin.stop() } }
        // Both origins answer for the same name; each daemon resolves it to one of them.
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        for (origin, expected) in [(pinnedOrigin, 200), (otherOrigin, 502)] {
            let config = configText(resolving: [("pinned.internal.test", origin)])
            try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
                if expected == 200 {
                    #expect(try addAnchor(daemon, pem: ca.pem, hosts: []).status == 201)
                    let connection = try UnixSocketConnection(path: daemon.socketPath)
                    let pin = try connection.request(
                        "POST", "/v1/pins", headers: [("Content-Type", "application/json")],
                        body: jsonBody(["host": "pinned.internal.test", "spki_sha256": pinned.spkiSHA256])
                    )
                    #expect(pin.status == 201)
                }
                let response = try fetch(daemon, "https://pinned.internal.test:\(origin.port)/hello")
                #expect(response.status == expected)
                if expected == 502 {
                    #expect(Self.reasonText(response).lowercased().contains("pin"))
                }
            }
        }
    }

    @Test("Web PKI rules hold for the user's own CA, and authbrokerctl fetch shows each rule's reason")
    func webPKIRulesThroughFetch() async throws {
        let root = try TestPKI.makeCA(commonName: "Rules Root")
        let constrained = try TestPKI.makeCA(
            commonName: "Constrained Intermediate", issuer: root, excludedDNSDomains: ["secret.internal.test"]
        )
        // (host, leaf, chain, the reason authbrokerctl must print)
        let cases: [(String, TestIdentity, [TestIdentity], String)] = [
            (
                "client-only.internal.test",
                try TestPKI.makeLeaf(dnsNames: ["client-only.internal.test"], issuer: root, clientAuthenticationOnly: true),
                [], "it is for client authentication only, not for TLS servers"
            ),
            (
                "cn.internal.test", try TestPKI.makeLeaf(dnsNames: ["cn.internal.test"], issuer: root, commonName: "other.internal.test"),
                [], "its subject CN 'other.internal.test' is not, character for character, one of the names"
            ),
            (
                "www.secret.internal.test", try TestPKI.makeLeaf(dnsNames: ["www.secret.internal.test"], issuer: constrained),
                [constrained], "its name 'www.secret.internal.test' is excluded"
            ),
            (
                "shop.co.uk", try TestPKI.makeLeaf(dnsNames: ["*.co.uk"], issuer: root, commonName: "*.co.uk"),
                [], "would cover every name under the public suffix 'co.uk'"
            ),
        ]
        var started: [TestOrigin] = []
        for (host, leaf, chain, _) in cases {
            started.append(try await TestOrigin.start(name: host, identity: leaf, chain: chain))
        }
        let origins = started
        defer { Task { for origin in origins { await origin.stop() } } }
        let config = configText(resolving: zip(cases, origins).map { ($0.0, $1) })
        try await withDaemon(config: config) { daemon in
            let caFile = daemon.directory + "/root.pem"
            try root.pem.write(toFile: caFile, atomically: true, encoding: .utf8)
            let added = try CLIAndClientsTests.ctl(daemon, ["anchors", "add", caFile, "--hosts", "*.internal.test,shop.co.uk"])
            #expect(added.status == 0, "\(added.stderr)")
            for ((host, _, _, reason), origin) in zip(cases, origins) {
                let refused = try CLIAndClientsTests.ctl(daemon, ["fetch", "https://\(host):\(origin.port)/hello"])
                #expect(refused.status == 4, "\(host): \(refused.stdout)")
                #expect(refused.stderr.contains(reason), "\(host): \(refused.stderr)")
                #expect(refused.stdout.isEmpty)
            }
        }
    }

    static func reasonText(_ response: TestResponse) -> String {
        (response.json["reasons"] as? [String] ?? []).joined(separator: " | ")
    }
}
