import Foundation
import NIOConcurrencyHelpers
import Testing

@testable import AuthBrokerSecrets

#if canImport(Glibc)
import Glibc
#endif

@Suite("Encrypted file store")
final class EncryptedFileSecretStoreTests {
    let directory: String
    let path: String
    let keyPath: String

    init() throws {
        self.directory = try makeTemporaryDirectory()
        self.path = "\(self.directory)/data/authbroker/secrets.bin"
        self.keyPath = "\(self.directory)/config/authbroker/secrets.key"
    }

    deinit {
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    func makeStore(environment: [String: String] = [:], lockTimeout: Duration = .seconds(10)) -> EncryptedFileSecretStore {
        EncryptedFileSecretStore(path: self.path, keyFilePath: self.keyPath, environment: environment, lockTimeout: lockTimeout)
    }

    func fileBytes(_ path: String) throws -> [UInt8] {
        [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    func writeBytes(_ bytes: [UInt8], to path: String) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
        chmod(path, 0o600)
    }

    @Test("the plaintext is encoded into one allocation of exactly its size: no freed copy of the secrets")
    func encodingIsSizedExactly() {
        let items = (0..<50).map { index in
            EncryptedFileSecretStore.Item(
                kind: index % 2 == 0 ? .password : .identityKey,
                attributes: ["server": "host\(index).test", "user": "ü-\(index)", "protocol": "https"],
                label: "item \(index) ✓", secret: SecretValue(String(repeating: "s", count: index * 7))
            )
        }
        for count in [0, 1, 2, 50] {
            let slice = Array(items.prefix(count))
            #expect(EncryptedFileSecretStore.encode(slice).count == EncryptedFileSecretStore.encodedSize(slice), "\(count) items")
        }
    }

    @Test func createsPrivateFilesAndNoPlaintext() throws {
        let store = self.makeStore()
        // Nothing is created before the first change.
        #expect(try store.list(kind: .password, matching: [:]).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: self.keyPath))
        try store.store(kind: .password, attributes: ["server": "example.org", "user": "bob"], label: "Bob's password", secret: SecretValue("plain-secret-text"))
        #expect(fileMode(self.path) == 0o600)
        #expect(fileMode(self.keyPath) == 0o600)
        #expect(fileMode("\(self.directory)/data/authbroker") == 0o700)
        #expect(fileMode("\(self.directory)/config/authbroker") == 0o700)
        #expect(try self.fileBytes(self.keyPath).count == 32)
        let content = try self.fileBytes(self.path)
        #expect(Array(content.prefix(8)) == Array("AUTHBSEC".utf8))
        #expect(content[8] == 1)
        let text = String(decoding: content, as: UTF8.self)
        for visible in ["plain-secret-text", "example.org", "Bob's password", "server"] {
            #expect(!text.contains(visible))
        }
        // A second store over the same files (another process) reads it.
        #expect(try self.makeStore().lookup(kind: .password, attributes: ["server": "example.org", "user": "bob"])?.stringValue() == "plain-secret-text")
    }

    @Test(arguments: ["magic", "version", "ciphertext", "tag", "nonce"])
    func aFlippedByteIsCorruptAndTheFileIsLeftAlone(where: String) throws {
        let store = self.makeStore()
        try store.store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("s"))
        var content = try self.fileBytes(self.path)
        let index = switch `where` {
        case "magic": 0
        case "version": 8
        case "nonce": 17
        case "ciphertext": 17 + 12 + 2
        default: content.count - 1
        }
        content[index] ^= 0x01
        try self.writeBytes(content, to: self.path)
        try self.expectCorruptAndUntouched(store, content)
    }

    @Test(arguments: [0, 5, 17, 40, -1])
    func aTruncatedFileIsCorruptAndTheFileIsLeftAlone(length: Int) throws {
        let store = self.makeStore()
        try store.store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("some secret"))
        var content = try self.fileBytes(self.path)
        content = Array(content.prefix(length >= 0 ? length : content.count - 1))
        try self.writeBytes(content, to: self.path)
        try self.expectCorruptAndUntouched(store, content)
    }

    func expectCorruptAndUntouched(_ store: EncryptedFileSecretStore, _ content: [UInt8]) throws {
        #expect(throws: SecretStoreError.corrupt) { try store.lookup(kind: .password, attributes: ["server": "example.org"]) }
        #expect(throws: SecretStoreError.corrupt) { try store.list(kind: .password, matching: [:]) }
        do throws(SecretStoreError) {
            try store.store(kind: .password, attributes: ["server": "other.org"], label: "y", secret: SecretValue("new"))
            Issue.record("a store over a corrupt file succeeded")
        } catch {
            #expect(error == .corrupt)
            #expect(error.message.contains(self.path))
            #expect(error.message.contains("mv "))
        }
        #expect(throws: SecretStoreError.corrupt) { try store.delete(kind: .password, attributes: ["server": "example.org"]) }
        #expect(try self.fileBytes(self.path) == content)
    }

    @Test func aKeyFileOthersCanReadIsRefused() throws {
        try self.makeStore().store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("s"))
        chmod(self.keyPath, 0o644)
        #expect(throws: SecretStoreError.permission) {
            try self.makeStore().lookup(kind: .password, attributes: ["server": "example.org"])
        }
        do throws(SecretStoreError) {
            _ = try self.makeStore().lookup(kind: .password, attributes: ["server": "example.org"])
        } catch {
            #expect(error.message.contains("chmod 600"))
        }
    }

    @Test func aSecretsFileOthersCanReadIsRefused() throws {
        try self.makeStore().store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("s"))
        chmod(self.path, 0o640)
        #expect(throws: SecretStoreError.permission) {
            try self.makeStore().lookup(kind: .password, attributes: ["server": "example.org"])
        }
    }

    @Test func aKeyFileOfTheWrongLengthIsRefused() throws {
        try FileManager.default.createDirectory(atPath: "\(self.directory)/config/authbroker", withIntermediateDirectories: true)
        try self.writeBytes(randomBytes(16), to: self.keyPath)
        #expect(throws: SecretStoreError.keyInvalid) {
            try self.makeStore().store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("s"))
        }
        #expect(!FileManager.default.fileExists(atPath: self.path))
    }

    @Test func aMissingKeyIsNotReplacedWhileSecretsExist() throws {
        try self.makeStore().store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("s"))
        let content = try self.fileBytes(self.path)
        try FileManager.default.removeItem(atPath: self.keyPath)
        let store = self.makeStore()
        #expect(throws: SecretStoreError.keyMissing) { try store.lookup(kind: .password, attributes: ["server": "example.org"]) }
        #expect(throws: SecretStoreError.keyMissing) {
            try store.store(kind: .password, attributes: ["server": "b.org"], label: "x", secret: SecretValue("s"))
        }
        #expect(!FileManager.default.fileExists(atPath: self.keyPath))
        #expect(try self.fileBytes(self.path) == content)
    }

    @Test func anotherKeyIsToldApartFromDamage() throws {
        try self.makeStore().store(kind: .password, attributes: ["server": "example.org"], label: "x", secret: SecretValue("s"))
        let content = try self.fileBytes(self.path)
        try self.writeBytes(randomBytes(32), to: self.keyPath)
        #expect(throws: SecretStoreError.keyInvalid) { try self.makeStore().lookup(kind: .password, attributes: ["server": "example.org"]) }
        #expect(throws: SecretStoreError.keyInvalid) {
            try self.makeStore().store(kind: .password, attributes: ["server": "b.org"], label: "x", secret: SecretValue("s"))
        }
        #expect(try self.fileBytes(self.path) == content)
    }

    @Test func theSystemdCredentialIsTheKeyWhenPassed() throws {
        let credentials = "\(self.directory)/credentials"
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: true)
        let key = randomBytes(32)
        try self.writeBytes(key, to: "\(credentials)/authbroker-secrets-key")
        let environment = ["CREDENTIALS_DIRECTORY": credentials]
        let store = self.makeStore(environment: environment)
        #expect(store.keySourceDescription.contains("systemd credential"))
        try store.store(kind: .identityKey, attributes: ["name": "laptop"], label: "x", secret: SecretValue("k"))
        #expect(!FileManager.default.fileExists(atPath: self.keyPath))
        #expect(bytes(of: try self.makeStore(environment: environment).lookup(kind: .identityKey, attributes: ["name": "laptop"])) == Array("k".utf8))
        // Without the credential the file cannot be opened: no key file, and it is not made.
        #expect(throws: SecretStoreError.keyMissing) { try self.makeStore().lookup(kind: .identityKey, attributes: ["name": "laptop"]) }
    }

    @Test func aMissingCredentialIsKeyMissing() throws {
        let environment = ["CREDENTIALS_DIRECTORY": "\(self.directory)/no-credentials"]
        do throws(SecretStoreError) {
            try self.makeStore(environment: environment).store(kind: .identityKey, attributes: ["name": "a"], label: "x", secret: SecretValue("k"))
            Issue.record("stored without a key")
        } catch {
            #expect(error == .keyMissing)
            #expect(error.message.contains("LoadCredentialEncrypted=authbroker-secrets-key"))
        }
    }

    @Test func concurrentWritersOnSeparateThreadsLoseNoUpdate() throws {
        let perThread = 200
        let failures = NIOLockedValueBox<[String]>([])
        let done = DispatchGroup()
        let path = self.path
        let keyPath = self.keyPath
        for thread in 0..<2 {
            done.enter()
            let worker = Thread {
                // A store of its own per thread, like a second process: no shared cache or lock.
                let store = EncryptedFileSecretStore(path: path, keyFilePath: keyPath, environment: [:])
                for index in 0..<perThread {
                    do throws(SecretStoreError) {
                        try store.store(
                            kind: .password,
                            attributes: ["server": "t\(thread).example.org", "user": "u\(index)"],
                            label: "\(thread)/\(index)",
                            secret: SecretValue("secret \(thread) \(index)")
                        )
                    } catch {
                        failures.withLockedValue { $0.append(error.message) }
                    }
                }
                done.leave()
            }
            worker.start()
        }
        done.wait()
        #expect(failures.withLockedValue { $0 } == [])
        let store = self.makeStore()
        #expect(try store.list(kind: .password, matching: [:]).count == 2 * perThread)
        #expect(try store.lookup(kind: .password, attributes: ["server": "t1.example.org", "user": "u199"])?.stringValue() == "secret 1 199")
    }

    @Test func aWriterWaitsForAnotherProcessHoldingTheLock() throws {
        let store = self.makeStore()
        try store.store(kind: .password, attributes: ["server": "a.org"], label: "x", secret: SecretValue("a"))
        // util-linux flock(1) holds the same lock from another process for a second.
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        holder.arguments = ["flock", "\(self.path).lock", "sleep", "1"]
        try holder.run()
        try self.waitUntilLocked()
        let clock = ContinuousClock()
        let started = clock.now
        try store.store(kind: .password, attributes: ["server": "b.org"], label: "y", secret: SecretValue("b"))
        #expect(clock.now - started > .milliseconds(200))
        holder.waitUntilExit()
        #expect(try store.list(kind: .password, matching: [:]).count == 2)
    }

    @Test func aStuckHolderIsBusyAndAKilledOneReleasesTheLock() throws {
        let store = self.makeStore(lockTimeout: .milliseconds(300))
        try store.store(kind: .password, attributes: ["server": "a.org"], label: "x", secret: SecretValue("a"))
        let holder = Process()
        holder.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // The shell takes the lock with flock(1) on fd 9 and becomes `sleep`, so the pid we kill
        // is the holder itself.
        holder.arguments = ["sh", "-c", "exec 9>>\"$0\" && flock 9 && exec sleep 30", "\(self.path).lock"]
        try holder.run()
        try self.waitUntilLocked()
        #expect(throws: SecretStoreError.busy) {
            try store.store(kind: .password, attributes: ["server": "b.org"], label: "y", secret: SecretValue("b"))
        }
        // Reads do not wait for writers.
        #expect(try store.lookup(kind: .password, attributes: ["server": "a.org"])?.stringValue() == "a")
        kill(holder.processIdentifier, SIGKILL)
        holder.waitUntilExit()
        // The lock file is still there (stale), and does not block.
        #expect(FileManager.default.fileExists(atPath: "\(self.path).lock"))
        try store.store(kind: .password, attributes: ["server": "b.org"], label: "y", secret: SecretValue("b"))
        #expect(try store.list(kind: .password, matching: [:]).count == 2)
    }

    /// Waits until someone else holds the lock file's lock.
    func waitUntilLocked() throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            let fd = open("\(self.path).lock", O_RDWR)
            if fd >= 0 {
                let free = flock(fd, LOCK_EX | LOCK_NB) == 0
                close(fd)
                if !free { return }
            }
            usleep(10_000)
        }
        throw SetupFailure("flock(1) did not take the lock within 10 s")
    }
}
