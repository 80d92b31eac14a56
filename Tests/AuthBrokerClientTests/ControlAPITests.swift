import AuthBrokerClient
import Foundation
import Testing
import TestSupport

/// The control API wrappers against the real daemon.
@Suite("BrokerClient control API")
struct ControlAPITests {
    @Test("status, anchors, passwords and identities through the library")
    func wrappers() async throws {
        try await withDaemon { daemon, client in
            let status = try await client.status()
            #expect(status.pid == daemon.pid)
            #expect(status.socket == daemon.socketPath)
            #expect(status.counters["requests_total"] != nil)

            let ca = try TestPKI.makeCA(commonName: "Client Test CA")
            #expect(try await client.anchors().isEmpty)
            let added = try await client.addAnchor(pem: ca.pem, hosts: ["*.internal.test"])
            #expect(added.count == 1)
            let listed = try await client.anchors()
            #expect(listed.map(\.hosts) == [["*.internal.test"]])
            #expect(listed.first?.certificate.sha256 == ca.sha256Fingerprint)
            let removed = try await client.removeAnchor(id: String(try #require(listed.first).id.prefix(12)))
            #expect(removed.id == listed.first?.id)
            #expect(try await client.anchors().isEmpty)

            let stored = try await client.addPassword(url: "https://files.internal.test/share", user: "bob", realm: "files", password: "s3cret: with spaces&=", persistence: .forSession)
            #expect(stored.user == "bob")
            #expect(stored.persistence == "session")
            #expect(try await client.passwords().map(\.user) == ["bob"])
            let gone = try await client.removePassword(url: "https://files.internal.test", user: "bob", realm: "files")
            #expect(gone.realm == "files")
            #expect(try await client.passwords().isEmpty)

            // A refused control request is a BrokerError with the daemon's code.
            do {
                try await client.addAnchor(pem: "not a pem", hosts: [])
                Issue.record("a bad PEM must be refused")
            } catch let error as BrokerError {
                #expect(error.status == 400)
                #expect(!error.code.isEmpty)
                #expect(error.proxyStatus == nil)
            }

            // A fresh daemon has no client identities (metadata only; keys never leave it).
            #expect(try await client.identities().isEmpty)
        }
    }

    @Test("any control request: the daemon's JSON as it sent it, a refusal as BrokerError with its kind, the agent stream streamed")
    func anyControlRequest() async throws {
        try await withDaemon { _, client in
            var client = client
            client.userAgent = "control-test/1"
            let (data, head) = try await client.controlData(method: "GET", path: "/v1/pins")
            #expect(head.status == 200)
            #expect(String(decoding: data, as: UTF8.self).contains(#""pins""#))

            do {
                _ = try await client.controlData(method: "DELETE", path: "/v1/anchors/0123456789abcdef")
                Issue.record("removing an anchor that does not exist must be refused")
            } catch let error as BrokerError {
                #expect(error.status == 404)
                #expect(error.kind == .notFound)
                #expect(error.requestID != nil)
            }

            // Nothing that would break the request line is sent.
            await #expect(throws: BrokerClientError.self) {
                _ = try await client.controlData(method: "GET", path: "/v1/status HTTP/1.1\r\nX-Injected: 1")
            }
            await #expect(throws: BrokerClientError.self) {
                _ = try await client.controlData(method: "GET /", path: "/v1/status")
            }

            // The agent stream returns at its head; its lines arrive as they are written.
            let events = try await client.sendControl(method: "GET", path: "/v1/agent")
            #expect(events.status == 200)
            var lines = events.body.makeAsyncIterator()
            let first = try await lines.next() ?? []
            #expect(String(decoding: first, as: UTF8.self).contains(#""attached""#))
            events.body.cancel()
        }
    }
}
