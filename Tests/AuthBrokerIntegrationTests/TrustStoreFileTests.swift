import Foundation
import Testing
import TestSupport

/// The trust store file edited by hand while the daemon runs, and exceptions that expire:
/// both take effect in the running daemon, pooled connections included.
@Suite("Trust store file and expiring exceptions, end to end")
struct TrustStoreFileTests {
    static func trustFile(_ daemon: DaemonProcess) -> String {
        daemon.directory + "/state/authbroker/trust.json"
    }

    /// Polls `fetch` until its status is `status` (up to 10 s), and returns the last response.
    static func waitForStatus(_ status: Int, _ daemon: DaemonProcess, _ url: String) async throws -> TestResponse {
        var response = try fetch(daemon, url)
        for _ in 0..<100 where response.status != status {
            try await Task.sleep(for: .milliseconds(100))
            response = try fetch(daemon, url)
        }
        return response
    }

    @Test("an anchor deleted from trust.json by hand stops being trusted, and an API change does not bring it back")
    func anchorDeletedByHand() async throws {
        let leaf = try TestPKI.makeLeaf(dnsNames: ["hand.internal.test"], issuer: nil)
        let origin = try await TestOrigin.start(name: "hand", identity: leaf)
        defer { Task { await origin.stop() } }
        let url = "https://hand.internal.test:\(origin.port)/hello"
        try await withDaemon(config: configText(resolving: [("hand.internal.test", origin)])) { daemon in
            #expect(try addAnchor(daemon, pem: leaf.pem, hosts: ["hand.internal.test"]).status == 201)
            #expect(try fetch(daemon, url).status == 200)

            // The user deletes the anchor with an editor (a new file renamed over the old).
            let path = Self.trustFile(daemon)
            let data = try Data(contentsOf: URL(fileURLWithPath: path))
            var object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
            object["anchors"] = []
            try JSONSerialization.data(withJSONObject: object).write(to: URL(fileURLWithPath: path + ".tmp"))
            #expect(rename(path + ".tmp", path) == 0)

            // The pooled connection that was verified with the anchor is not reused either.
            let refused = try await Self.waitForStatus(502, daemon, url)
            #expect(refused.status == 502, "the deleted anchor is still trusted")
            #expect(refused.json["code"] as? String == "untrusted_server")

            // A change through the API keeps the hand edit.
            let pin = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/pins", headers: [("Content-Type", "application/json")],
                body: jsonBody(["host": "other.internal.test", "spki_sha256": String(repeating: "A", count: 43) + "="])
            )
            #expect(pin.status == 201, "\(pin.text)")
            let saved = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [String: Any]
            #expect((saved?["anchors"] as? [Any])?.isEmpty == true, "the deleted anchor came back")
            #expect((saved?["pins"] as? [Any])?.count == 1)
            let anchors = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/anchors")
            #expect((anchors.json["anchors"] as? [Any])?.isEmpty == true)
            #expect(daemon.log.contains("trust store changed on disk"))
        }
    }

    @Test("a trust.json edited into garbage is not written over; the API says so and the daemon keeps going")
    func garbageEdit() async throws {
        try await withDaemon { daemon in
            #expect(try addAnchor(daemon, pem: try TestPKI.makeCA(commonName: "Kept CA").pem, hosts: []).status == 201)
            let path = Self.trustFile(daemon)
            try "{ this is not json".write(toFile: path, atomically: false, encoding: .utf8)
            let response = try addAnchor(daemon, pem: try TestPKI.makeCA(commonName: "New CA").pem, hosts: [])
            #expect(response.status == 409, "\(response.text)")
            #expect(response.json["code"] as? String == "changed_on_disk")
            #expect((response.json["detail"] as? String)?.contains(path) == true)
            #expect(try String(contentsOfFile: path, encoding: .utf8) == "{ this is not json")
            let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
            #expect(status.status == 200)
        }
    }

    @Test("an exception added with an expiry trusts the server until then, and not after")
    func expiringException() async throws {
        let leaf = try TestPKI.makeLeaf(dnsNames: ["expiring.internal.test"], issuer: nil)
        let origin = try await TestOrigin.start(name: "expiring", identity: leaf)
        defer { Task { await origin.stop() } }
        let url = "https://expiring.internal.test:\(origin.port)/hello"
        try await withDaemon(config: configText(resolving: [("expiring.internal.test", origin)])) { daemon in
            let added = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/exceptions", headers: [("Content-Type", "application/json")],
                body: jsonBody(["host": "expiring.internal.test", "sha256": leaf.sha256Fingerprint, "expires": "3s"])
            )
            #expect(added.status == 201, "\(added.text)")
            let exception = added.json["exception"] as? [String: Any] ?? [:]
            #expect(exception["expires_at"] is String)
            #expect(try fetch(daemon, url).status == 200)

            let refused = try await Self.waitForStatus(502, daemon, url)
            #expect(refused.status == 502, "the exception outlived its expiry")
            let list = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/exceptions")
            #expect((list.json["exceptions"] as? [Any])?.isEmpty == true)

            let bad = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/exceptions", headers: [("Content-Type", "application/json")],
                body: jsonBody(["host": "expiring.internal.test", "sha256": leaf.sha256Fingerprint, "expires": "soon"])
            )
            #expect(bad.status == 400)
            #expect(bad.json["code"] as? String == "invalid_lifetime")
        }
    }
}
