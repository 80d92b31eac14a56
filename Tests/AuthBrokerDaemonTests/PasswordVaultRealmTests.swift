import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import AuthBrokerSecrets
import Foundation
import Testing
import TestSupport

/// Permanent passwords read back from the secret store (a daemon just started, nothing cached):
/// one stored for any realm and one for a realm of the same origin stay apart.
@Suite("Password vault: realms in the secret store")
struct PasswordVaultRealmTests {
    static func vault(over directory: String) -> PasswordVault {
        let store = EncryptedFileSecretStore(path: directory + "/secrets.bin", keyFilePath: directory + "/secrets.key", environment: [:])
        return PasswordVault(permanent: SecretStorePasswords(store: store))
    }

    @Test("another realm gets the any-realm password, never the one stored for Payroll; removing the any-realm one leaves Payroll's")
    func realmsStayApart() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let origin = try CanonicalOrigin(parsing: "https://intra.test")
        let writer = Self.vault(over: directory)
        try await writer.add(origin: origin, realm: nil, credential: PasswordCredential(user: "alice", password: "pw-any"), persistence: .permanent)
        try await writer.add(
            origin: origin, realm: "Payroll", credential: PasswordCredential(user: "alice", password: "pw-payroll"), persistence: .permanent
        )

        // As after a restart: nothing in memory.
        let reader = Self.vault(over: directory)
        let other = await reader.credential(for: ProtectionSpace(origin: origin, realm: "anything", authScheme: "Basic"))
        #expect(other?.credential.password == "pw-any", "a page's made-up realm got the Payroll password")
        let payroll = await Self.vault(over: directory).credential(for: ProtectionSpace(origin: origin, realm: "Payroll", authScheme: "Basic"))
        #expect(payroll?.credential.password == "pw-payroll")

        let remover = Self.vault(over: directory)
        _ = try await remover.remove(origin: origin, realm: nil, user: "alice")
        let afterwards = Self.vault(over: directory)
        #expect(await afterwards.credential(for: ProtectionSpace(origin: origin, realm: "anything", authScheme: "Basic")) == nil)
        let kept = await afterwards.credential(for: ProtectionSpace(origin: origin, realm: "Payroll", authScheme: "Basic"))
        #expect(kept?.credential.password == "pw-payroll", "removing the any-realm password removed the realm's too")
    }
}
