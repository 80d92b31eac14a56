import Foundation
import Testing
import TestSupport

/// Client identities (mTLS), answered by the daemon: imported with authbrokerctl, the key kept in
/// the secret store (each backend), presented to the hosts the user chose.
@Suite("Client identities end to end")
struct ClientIdentityIntegrationTests {
    struct PKI {
        let serverCA: TestIdentity
        let server: TestIdentity
        let clientCA: TestIdentity
        let client: TestIdentity
        let otherCA: TestIdentity
        let stranger: TestIdentity
        let expired: TestIdentity

        init() throws {
            self.serverCA = try TestPKI.makeCA(commonName: "mTLS Server CA")
            self.server = try TestPKI.makeLeaf(dnsNames: ["mtls.internal.test"], issuer: self.serverCA)
            self.clientCA = try TestPKI.makeCA(commonName: "mTLS Client CA")
            self.client = try TestPKI.makeClient(commonName: "alice", issuer: self.clientCA)
            self.otherCA = try TestPKI.makeCA(commonName: "Other Client CA")
            self.stranger = try TestPKI.makeClient(commonName: "mallory", issuer: self.otherCA)
            self.expired = try TestPKI.makeClient(
                commonName: "alice-old", issuer: self.clientCA, notBefore: .now - 86400 * 60, notAfter: .now - 86400
            )
        }
    }

    /// A PKCS#12 file of `identity` (and its CA) made with openssl, protected by `passphrase`.
    static func pkcs12(_ identity: TestIdentity, ca: TestIdentity, in directory: String, name: String, passphrase: String) throws -> String {
        let cert = directory + "/\(name).crt", key = directory + "/\(name).key", chain = directory + "/\(name)-ca.crt"
        try identity.pem.write(toFile: cert, atomically: true, encoding: .utf8)
        try identity.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
        try ca.pem.write(toFile: chain, atomically: true, encoding: .utf8)
        let output = directory + "/\(name).p12"
        let run = try CLIAndClientsTests.run(
            "/usr/bin/openssl",
            ["pkcs12", "-export", "-inkey", key, "-in", cert, "-certfile", chain, "-passout", "pass:\(passphrase)", "-out", output]
        )
        #expect(run.status == 0, "\(run.stderr)")
        return output
    }

    static func exercise(store: String) async throws {
        let pki = try PKI()
        let origin = try await TestOrigin.start(name: "mtls", identity: pki.server, clientCA: pki.clientCA)
        defer { Task { await origin.stop() } }
        let config = configText(resolving: [("mtls.internal.test", origin)], extra: "[secrets]\nstore = \"\(store)\"\n")
        try await withDaemon(config: config) { daemon in
            let url = "https://mtls.internal.test:\(origin.port)/hello"
            #expect(try addAnchor(daemon, pem: pki.serverCA.pem, hosts: ["*.internal.test"]).status == 201)
            // The flow log records from here on; it names the identity presented (below).
            #expect(try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow"]).status == 0)

            // None yet: the server wanted one; the problem says which host and how to import.
            let none = try fetch(daemon, url)
            #expect(none.status == 502)
            #expect(none.json["code"] as? String == "client_certificate_required")
            #expect(none.header("Proxy-Status")?.contains("tls_certificate_error") == true)
            #expect((none.json["fix"] as? [String])?.first?.contains("identities import") == true)

            let suffix = UUID().uuidString.prefix(8).lowercased()
            let name = "alice-\(store)-\(suffix)"
            let p12 = try Self.pkcs12(pki.client, ca: pki.clientCA, in: daemon.directory, name: "alice", passphrase: "p12-pass")
            // A wrong passphrase says so, in words: no BoringSSL codes or build paths.
            let wrong = try CLIAndClientsTests.ctl(
                daemon, ["identities", "import", p12, "--name", name, "--passphrase-stdin"], stdin: "not-the-pass\n"
            )
            #expect(wrong.status != 0)
            #expect(wrong.stderr.contains("passphrase is not the one given"), "\(wrong.stderr)")
            #expect(!wrong.stderr.contains("OPENSSL") && !wrong.stderr.contains(".build/"), "\(wrong.stderr)")
            let imported = try CLIAndClientsTests.ctl(
                daemon, ["identities", "import", p12, "--name", name, "--hosts", "mtls.internal.test", "--passphrase-stdin"],
                stdin: "p12-pass\n"
            )
            #expect(imported.status == 0, "\(imported.stderr)")
            #expect(imported.stdout.contains(pki.client.sha256Fingerprint))

            let accepted = try fetch(daemon, url)
            #expect(accepted.status == 200, "\(accepted.text)")
            #expect(accepted.text == "hello from mtls")
            let flows = try CLIAndClientsTests.ctl(daemon, ["flows", "--no-follow", "--last", "1"])
            #expect(flows.stdout.contains("GET \(url) 200 15 B") && flows.stdout.contains("identity \(name)"), "\(flows.stdout)")

            // Another CA's identity, named by the request: the server rejects it.
            let strangerName = "mallory-\(suffix)"
            let strangerP12 = try Self.pkcs12(pki.stranger, ca: pki.otherCA, in: daemon.directory, name: "mallory", passphrase: "x")
            #expect(
                try CLIAndClientsTests.ctl(
                    daemon, ["identities", "import", strangerP12, "--name", strangerName, "--passphrase-stdin"], stdin: "x\n"
                ).status == 0
            )
            let rejected = try fetch(daemon, url, headers: [("Authbroker-Identity", strangerName)])
            #expect(rejected.status == 502)
            #expect(["client_certificate_rejected", "client_certificate_required"].contains(rejected.json["code"] as? String), "\(rejected.text)")

            // An expired identity is never presented, even when named.
            let expiredName = "old-\(suffix)"
            let cert = daemon.directory + "/old.crt", key = daemon.directory + "/old.key"
            try [pki.expired.pem, pki.clientCA.pem].joined(separator: "\n").write(toFile: cert, atomically: true, encoding: .utf8)
            try pki.expired.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
            let importedExpired = try CLIAndClientsTests.ctl(daemon, ["identities", "import", "--cert", cert, "--key", key, "--name", expiredName])
            #expect(importedExpired.status == 0, "\(importedExpired.stderr)")
            let expired = try fetch(daemon, url, headers: [("Authbroker-Identity", expiredName)])
            #expect(expired.status == 400)
            #expect(expired.json["code"] as? String == "identity_expired")

            let list = try CLIAndClientsTests.ctl(daemon, ["identities", "list", "--json"])
            #expect(list.status == 0)
            #expect(list.stdout.contains(name) && list.stdout.contains(pki.client.sha256Fingerprint))
            #expect(!list.stdout.contains("PRIVATE KEY") && !list.stdout.contains("p12-pass"))
            let status = try CLIAndClientsTests.ctl(daemon, ["status"])
            #expect(status.stdout.contains("secret store:"), "\(status.stdout)")
            #expect(status.stdout.contains("'\(expiredName)' has expired"))

            #expect(try CLIAndClientsTests.ctl(daemon, ["identities", "remove", name]).status == 0)
            #expect(try fetch(daemon, url).json["code"] as? String == "client_certificate_required")
            for other in [strangerName, expiredName] { _ = try CLIAndClientsTests.ctl(daemon, ["identities", "remove", other]) }

            await daemon.stop()
            #expect(!daemon.log.contains("p12-pass"))
            #expect(!daemon.log.contains("PRIVATE KEY"))
        }
    }

    @Test("encrypted-file store: none, accepted, wrong, expired; the key never shows")
    func fileStore() async throws {
        try await Self.exercise(store: "file")
    }

    @Test(
        "Secret Service store: the same through a real gnome-keyring",
        .enabled(if: ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] != nil, "needs a session bus: run under scripts/with-test-keyring (make test does)")
    )
    func secretServiceStore() async throws {
        try await Self.exercise(store: "secret-service")
    }

    @Test("a permanent password the server refused stays refused after a restart: never sent again")
    func refusedStaysRefused() async throws {
        let origin = try await TestAuthOrigin.start(name: "refused", user: "alice", password: "Right-Secret-2")
        defer { Task { await origin.stop() } }
        let config = StoredCredentialTests.config(origin) + "[secrets]\nstore = \"file\"\n"
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let url = StoredCredentialTests.base(origin)
        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            let added = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", url, "--user", "alice", "--password-stdin", "--persistence", "permanent"],
                stdin: "Wrong-Secret-3\n"
            )
            #expect(added.status == 0, "\(added.stderr)")
            #expect(try fetch(daemon, url + "/basic/x").status == 401)
            #expect(origin.stats.failures == 1)
        }
        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            let again = try fetch(daemon, url + "/basic/x")
            #expect(again.status == 401)
            #expect(origin.stats.failures == 1)  // not sent again
            let list = try CLIAndClientsTests.ctl(daemon, ["passwords", "list"])
            #expect(list.stdout.contains("REFUSED"), "\(list.stdout)")
        }
    }

    @Test("a permanent password survives a daemon restart (encrypted-file store)")
    func permanentPassword() async throws {
        let origin = try await TestAuthOrigin.start(name: "permanent", user: "alice", password: "Perm-Secret-1")
        defer { Task { await origin.stop() } }
        let config = StoredCredentialTests.config(origin) + "[secrets]\nstore = \"file\"\n"
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let url = StoredCredentialTests.base(origin)
        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            let added = try CLIAndClientsTests.ctl(
                daemon, ["passwords", "add", url, "--user", "alice", "--password-stdin", "--persistence", "permanent"],
                stdin: "Perm-Secret-1\n"
            )
            #expect(added.status == 0, "\(added.stderr)")
        }
        try await withDaemon(config: config, directory: directory, keepDirectory: true) { daemon in
            #expect(try fetch(daemon, url + "/digest/SHA-256/auth/x").status == 200)
            let list = try CLIAndClientsTests.ctl(daemon, ["passwords", "list"])
            #expect(list.stdout.contains("permanent"))
            let secrets = try Data(contentsOf: URL(fileURLWithPath: directory + "/data/authbroker/secrets.bin"))
            #expect(secrets.range(of: Data("Perm-Secret-1".utf8)) == nil)  // encrypted at rest
        }
    }
}
