import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerTrust
import Foundation
import Logging
import NIOConcurrencyHelpers
import Testing

/// The daemon's keeping of the local CA: made once, read back, remade (and said so) when a half
/// is missing or does not match, and never made while the secret store refuses its key.
@Suite("Local CA")
struct LocalCATests {
    /// The secret store's neighbour: identity keys in memory, or a store that refuses.
    final class MemoryKeys: IdentityKeyStore {
        let keys = NIOLockedValueBox<[String: [UInt8]]>([:])
        let refusing = NIOLockedValueBox(false)
        struct Refused: Error, CustomStringConvertible { var description: String { "the keyring is locked" } }

        func storeKey(name: String, material: [UInt8]) throws {
            if self.refusing.withLockedValue({ $0 }) { throw Refused() }
            self.keys.withLockedValue { $0[name] = material }
        }
        func key(name: String) throws -> [UInt8]? {
            if self.refusing.withLockedValue({ $0 }) { throw Refused() }
            return self.keys.withLockedValue { $0[name] }
        }
        func removeKey(name: String) throws {
            self.keys.withLockedValue { _ = $0.removeValue(forKey: name) }
        }
    }

    struct Setup {
        let directory: String
        let keys = MemoryKeys()
        var files: LocalCA.Files { LocalCA.Files(stateDirectory: self.directory, systemAnchors: "/etc/ssl/certs/ca-certificates.crt") }

        init() throws {
            self.directory = NSTemporaryDirectory() + "authbroker-localca-\(UUID().uuidString)"
            try FileManager.default.createDirectory(atPath: self.directory, withIntermediateDirectories: true)
        }

        func localCA() -> LocalCA {
            LocalCA(files: self.files, keys: self.keys, owner: "alice@test", logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        }
    }

    @Test func madeOnceThenReadBack() async throws {
        let setup = try Setup()
        defer { try? FileManager.default.removeItem(atPath: setup.directory) }
        let first = try await setup.localCA().authority()
        #expect(setup.keys.keys.withLockedValue { $0.keys.sorted() } == ["@local-ca"])
        // A second daemon run reads the same CA.
        let again = try await setup.localCA().authority()
        #expect(again.der == first.der)
        let bundle = try String(contentsOfFile: setup.files.bundle, encoding: .utf8)
        #expect(bundle.hasSuffix(first.pem + "\n"))
        let mode = try FileManager.default.attributesOfItem(atPath: setup.files.certificate)[.posixPermissions] as? Int
        #expect(mode == 0o600)
    }

    @Test func aMissingOrMismatchedHalfMakesANewCA() async throws {
        let setup = try Setup()
        defer { try? FileManager.default.removeItem(atPath: setup.directory) }
        let first = try await setup.localCA().authority()
        // The key gone from the keyring.
        try setup.keys.removeKey(name: "@local-ca")
        let second = try await setup.localCA().authority()
        #expect(second.der != first.der)
        // The certificate file replaced by another CA's.
        try LocalCertificateAuthority.make(owner: "mallory@test").pem.write(toFile: setup.files.certificate, atomically: true, encoding: .utf8)
        let third = try await setup.localCA().authority()
        #expect(third.der != second.der)
        #expect(try String(contentsOfFile: setup.files.certificate, encoding: .utf8) == third.pem)
        // The certificate file gone.
        try FileManager.default.removeItem(atPath: setup.files.certificate)
        let fourth = try await setup.localCA().authority()
        #expect(fourth.der != third.der)
    }

    @Test func aRefusingSecretStoreIsAClearErrorAndNothingIsWritten() async throws {
        let setup = try Setup()
        defer { try? FileManager.default.removeItem(atPath: setup.directory) }
        setup.keys.refusing.withLockedValue { $0 = true }
        let localCA = setup.localCA()
        let error = await #expect(throws: BrokerError.self) { try await localCA.authority() }
        #expect(error?.code == .localCAUnavailable)
        #expect(error?.detail.contains("the keyring is locked") == true, "\(error?.detail ?? "")")
        #expect(!FileManager.default.fileExists(atPath: setup.files.certificate))
        // Once the store answers, the next need makes it.
        setup.keys.refusing.withLockedValue { $0 = false }
        _ = try await localCA.authority()
        #expect(FileManager.default.fileExists(atPath: setup.files.bundle))
    }

    @Test func rotationReplacesTheCAAndItsLeaves() async throws {
        let setup = try Setup()
        defer { try? FileManager.default.removeItem(atPath: setup.directory) }
        let localCA = setup.localCA()
        let before = try await localCA.authority()
        _ = try await localCA.serverContext(for: "git.corp.example")
        _ = try await localCA.serverContext(for: "git.corp.example")
        #expect(await localCA.leavesMinted == 1)
        let after = try await localCA.rotate()
        #expect(after.der != before.der)
        #expect(try await localCA.authority().der == after.der)
        _ = try await localCA.serverContext(for: "git.corp.example")
        #expect(await localCA.leavesMinted == 2)
        #expect(await localCA.mintingTime > .zero)
    }
}
