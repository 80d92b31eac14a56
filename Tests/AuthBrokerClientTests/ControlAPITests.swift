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
}
