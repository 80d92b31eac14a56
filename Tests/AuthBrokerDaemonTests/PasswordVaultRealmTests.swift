import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import AuthBrokerSecrets
import Foundation
import Testing
import TestSupport

/// Permanent passwords read back from the secret store (a daemon just started, nothing cached):
/// one stored for any realm and one for a realm of the same origin stay apart, in both stores
/// (gnome-keyring on the test's private bus, and the encrypted file), stored in either order.
@Suite("Password vault: realms in the secret store")
struct PasswordVaultRealmTests {
    static var backends: [String] {
        ProcessInfo.processInfo.environment["AUTHBROKER_SKIP_SECRET_SERVICE"] == "1" ? ["file"] : ["file", "secret-service"]
    }

    static func store(_ backend: String, directory: String) -> any SecretStore {
        backend == "file"
            ? EncryptedFileSecretStore(path: directory + "/secrets.bin", keyFilePath: directory + "/secrets.key", environment: [:])
            : SecretServiceStore()
    }

    @Test(
        "another realm gets the any-realm password, never the one stored for Payroll; removing the any-realm one leaves Payroll's",
        arguments: Self.backends, [false, true]
    )
    func realmsStayApart(backend: String, payrollFirst: Bool) async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = Self.store(backend, directory: directory)
        let vault = { PasswordVault(permanent: SecretStorePasswords(store: store)) }
        let origin = try CanonicalOrigin(parsing: "https://realms-\(UUID().uuidString.prefix(8).lowercased()).test")
        defer { _ = try? store.delete(kind: .password, attributes: ["server": origin.host]) }
        let writer = vault()
        let anyRealm = PasswordCredential(user: "alice", password: "pw-any")
        let payroll = PasswordCredential(user: "alice", password: "pw-payroll")
        if payrollFirst {
            try await writer.add(origin: origin, realm: "Payroll", credential: payroll, persistence: .permanent)
            try await writer.add(origin: origin, realm: nil, credential: anyRealm, persistence: .permanent)
        } else {
            try await writer.add(origin: origin, realm: nil, credential: anyRealm, persistence: .permanent)
            try await writer.add(origin: origin, realm: "Payroll", credential: payroll, persistence: .permanent)
        }

        // As after a restart: nothing in memory.
        let other = await vault().credential(for: ProtectionSpace(origin: origin, realm: "anything", authScheme: "Basic"))
        #expect(other?.credential.password == "pw-any", "a page's made-up realm got the Payroll password")
        let stored = await vault().credential(for: ProtectionSpace(origin: origin, realm: "Payroll", authScheme: "Basic"))
        #expect(stored?.credential.password == "pw-payroll", "storing the any-realm password replaced Payroll's")
        #expect(try await vault().list().count == 2)

        _ = try await vault().remove(origin: origin, realm: nil, user: "alice")
        #expect(await vault().credential(for: ProtectionSpace(origin: origin, realm: "anything", authScheme: "Basic")) == nil)
        let kept = await vault().credential(for: ProtectionSpace(origin: origin, realm: "Payroll", authScheme: "Basic"))
        #expect(kept?.credential.password == "pw-payroll", "removing the any-realm password removed the realm's too")
    }

    @Test("a password stored for any realm by an earlier build (no domain at all) is still found, and removed")
    func legacyAnyRealmItem() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = Self.store("file", directory: directory)
        let origin = try CanonicalOrigin(parsing: "https://legacy.test")
        try store.store(
            kind: .password, attributes: ["server": origin.host, "protocol": "https", "port": "443", "user": "alice", "authtype": "http"],
            label: "alice@https://legacy.test", secret: SecretValue("pw-old")
        )
        let vault = PasswordVault(permanent: SecretStorePasswords(store: store))
        let found = await vault.credential(for: ProtectionSpace(origin: origin, realm: "r", authScheme: "Basic"))
        #expect(found?.credential.password == "pw-old")
        _ = try await vault.remove(origin: origin, realm: nil, user: "alice")
        #expect(try store.list(kind: .password, matching: ["server": origin.host]).isEmpty)

        // Stored again for any realm: the old item is replaced, not kept beside the new one.
        try store.store(
            kind: .password, attributes: ["server": origin.host, "protocol": "https", "port": "443", "user": "alice", "authtype": "http"],
            label: "alice@https://legacy.test", secret: SecretValue("pw-old")
        )
        try await vault.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw-new"), persistence: .permanent)
        #expect(try store.list(kind: .password, matching: ["server": origin.host]).count == 1)
        #expect(try await vault.list().count == 1)
    }

    @Test("an empty realm is no realm: stored, found and removed as the password for any realm")
    func emptyRealmIsAnyRealm() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = Self.store("file", directory: directory)
        let origin = try CanonicalOrigin(parsing: "https://empty-realm.test")
        let vault = PasswordVault(permanent: SecretStorePasswords(store: store))
        try await vault.add(origin: origin, realm: "", credential: PasswordCredential(user: "alice", password: "pw"), persistence: .permanent)
        #expect(try await vault.list().map(\.realm) == [nil])
        _ = try await vault.remove(origin: origin, realm: nil, user: "alice")
        #expect(vault.cachedCredential(for: ProtectionSpace(origin: origin, realm: "", authScheme: "Basic")) == nil, "still sent after its removal")
        #expect(await vault.credential(for: ProtectionSpace(origin: origin, realm: "x", authScheme: "Basic")) == nil)
    }
}
