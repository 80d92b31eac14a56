import AuthBrokerCore
import Crypto
import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Secrets in one AES-256-GCM encrypted file: the store for machines with no Secret Service.
///
/// File layout: `AUTHBSEC` (8 bytes) · version (1 byte, now 1) · key id (8 bytes: HMAC-SHA-256
/// of a fixed label under the key, so a wrong key is told apart from damage) · nonce (12) ·
/// ciphertext · tag (16). The header is authenticated data, so any flipped bit or truncation
/// fails authentication and is reported as `corrupt`; a damaged file is never overwritten,
/// because every change reads and decrypts the file before it writes.
///
/// The key comes from `$CREDENTIALS_DIRECTORY/authbroker-secrets-key` when systemd passes
/// credentials (`LoadCredentialEncrypted=authbroker-secrets-key:…`), else from a 0600 key file
/// of 32 random bytes, created on first use — but never while a secrets file exists that an
/// earlier key encrypted.
///
/// Every change is a read-modify-write under an exclusive `flock` on `<path>.lock`, written
/// atomically (temporary file, `fsync`, `rename`, `fsync` of the directory), so that concurrent
/// writers — threads or processes — cannot lose each other's updates. Reads take no lock: the
/// rename makes every file they see complete.
package final class EncryptedFileSecretStore: SecretStore {
    /// The systemd credential name the key is read from.
    package static let credentialName = "authbroker-secrets-key"
    package static let keyByteCount = 32
    /// Largest secrets file read.
    package static let maxFileBytes = 64 << 20

    static let magic: [UInt8] = Array("AUTHBSEC".utf8)
    static let formatVersion: UInt8 = 1
    static let headerCount = 8 + 1 + 8
    static let nonceCount = 12
    static let tagCount = 16

    package let path: String
    package let keyFilePath: String
    private let credentialsDirectory: String?
    private let lockTimeout: Duration
    private let cachedKey: NIOLockedValueBox<SymmetricKey?> = NIOLockedValueBox(nil)

    package var backendName: String { "file" }

    /// - Parameters:
    ///   - path: the secrets file (`$XDG_DATA_HOME/authbroker/secrets.bin`, say); its directory
    ///     is created 0700 when missing.
    ///   - keyFilePath: the key file used when no systemd credential is passed.
    ///   - environment: where `CREDENTIALS_DIRECTORY` is read.
    ///   - lockTimeout: how long a change waits for another writer before failing with `busy`.
    package init(
        path: String,
        keyFilePath: String,
        environment: [String: String] = ProcessInfo.processInfo.environment,
        lockTimeout: Duration = .seconds(10)
    ) {
        self.path = path
        self.keyFilePath = keyFilePath
        if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty {
            self.credentialsDirectory = directory
        } else {
            self.credentialsDirectory = nil
        }
        self.lockTimeout = lockTimeout
    }

    /// Where the key comes from, for status output and logs.
    package var keySourceDescription: String {
        if let credential = self.credentialPath {
            return "systemd credential \(credential)"
        }
        return "key file \(self.keyFilePath)"
    }

    private var credentialPath: String? {
        self.credentialsDirectory.map { "\($0)/\(Self.credentialName)" }
    }

    // MARK: - SecretStore

    package func store(kind: SecretKind, attributes: [String: String], label: String, secret: SecretValue) throws(SecretStoreError) {
        try SecretStoreLimits.validate(kind: kind, attributes: attributes, requireSome: true)
        try SecretStoreLimits.validate(label: label, secret: secret)
        try self.modify { items in
            items.removeAll { $0.kind == kind && $0.attributes == attributes }
            items.append(Item(kind: kind, attributes: attributes, label: label, secret: secret))
        }
    }

    package func lookup(kind: SecretKind, attributes: [String: String], absent: Set<String>) throws(SecretStoreError) -> SecretValue? {
        try SecretStoreLimits.validate(kind: kind, attributes: attributes, requireSome: true)
        let items = try self.read()
        let matches = items.filter { $0.kind == kind && SecretStoreLimits.matches($0.attributes, attributes, absent: absent) }
        // Items are kept oldest change first.
        return (matches.last { $0.attributes == attributes } ?? matches.last)?.secret
    }

    @discardableResult
    package func delete(kind: SecretKind, attributes: [String: String], absent: Set<String>) throws(SecretStoreError) -> Int {
        try SecretStoreLimits.validate(kind: kind, attributes: attributes, requireSome: true)
        guard try self.read().contains(where: { $0.kind == kind && SecretStoreLimits.matches($0.attributes, attributes, absent: absent) })
        else { return 0 }
        return try self.modify { items in
            let before = items.count
            items.removeAll { $0.kind == kind && SecretStoreLimits.matches($0.attributes, attributes, absent: absent) }
            return before - items.count
        }
    }

    package func list(kind: SecretKind, matching: [String: String]) throws(SecretStoreError) -> [SecretItemMetadata] {
        try SecretStoreLimits.validate(kind: kind, attributes: matching, requireSome: false)
        return try self.read()
            .filter { $0.kind == kind && SecretStoreLimits.matches($0.attributes, matching) }
            .map { SecretItemMetadata(kind: $0.kind, attributes: $0.attributes, label: $0.label) }
    }

    // MARK: - Reading and writing

    struct Item {
        var kind: SecretKind
        var attributes: [String: String]
        var label: String
        var secret: SecretValue
    }

    private var lockPath: String { "\(self.path).lock" }

    /// Runs `change` on the items under the lock and saves the result.
    @discardableResult
    private func modify<Result>(_ change: (inout [Item]) -> Result) throws(SecretStoreError) -> Result {
        try FileIO.makeDirectory(AtomicFile.directory(of: self.path))
        return try FileIO.withExclusiveLock(path: self.lockPath, timeout: self.lockTimeout) { () throws(SecretStoreError) -> Result in
            let existing = try FileIO.readPrivateFile(self.path, what: "secrets file", maxBytes: Self.maxFileBytes)
            let key = try self.key(mayCreate: existing == nil)
            var items = try existing.map { bytes throws(SecretStoreError) in try self.decrypt(bytes, key: key) } ?? []
            let result = change(&items)
            var plaintext = Self.encode(items)
            defer { SecretValue.wipe(&plaintext) }
            let sealed = try self.encrypt(plaintext, key: key)
            try FileIO.writeAtomically(sealed, to: self.path, what: "secrets file")
            return result
        }
    }

    private func read() throws(SecretStoreError) -> [Item] {
        guard let bytes = try FileIO.readPrivateFile(self.path, what: "secrets file", maxBytes: Self.maxFileBytes) else {
            return []
        }
        return try self.decrypt(bytes, key: try self.key(mayCreate: false))
    }

    private func corrupt(_ what: String) -> SecretStoreError {
        SecretStoreError(
            .corrupt,
            "The secrets file \(self.path) cannot be read: \(what). It was left as it is. Restore it from a backup, or move it aside (mv '\(self.path)' '\(self.path).bad') to start with no stored secrets."
        )
    }

    private static func keyID(_ key: SymmetricKey) -> [UInt8] {
        Array(HMAC<SHA256>.authenticationCode(for: Array("authbroker secrets key id v1".utf8), using: key).prefix(8))
    }

    private func header(_ key: SymmetricKey) -> [UInt8] {
        Self.magic + [Self.formatVersion] + Self.keyID(key)
    }

    private func encrypt(_ plaintext: [UInt8], key: SymmetricKey) throws(SecretStoreError) -> [UInt8] {
        let header = self.header(key)
        do {
            let box = try AES.GCM.seal(plaintext, using: key, nonce: AES.GCM.Nonce(), authenticating: header)
            return header + Array(box.nonce) + Array(box.ciphertext) + Array(box.tag)
        } catch {
            throw SecretStoreError(.io, "Cannot encrypt the secrets file \(self.path): \(error). Nothing was changed.")
        }
    }

    private func decrypt(_ bytes: [UInt8], key: SymmetricKey) throws(SecretStoreError) -> [Item] {
        guard bytes.count >= Self.headerCount + Self.nonceCount + Self.tagCount else {
            throw self.corrupt("it is \(bytes.count) bytes, shorter than the smallest secrets file (truncated?)")
        }
        guard Array(bytes[0..<8]) == Self.magic else {
            throw self.corrupt("it does not start with the AuthBroker secrets header")
        }
        guard bytes[8] == Self.formatVersion else {
            throw self.corrupt("it has format version \(bytes[8]), and this broker reads version \(Self.formatVersion) (was it written by a newer version?)")
        }
        guard Array(bytes[9..<17]) == Self.keyID(key) else {
            throw SecretStoreError(
                .keyInvalid,
                "The secrets file \(self.path) was encrypted with another key than the \(self.keySourceDescription). Restore the key that belongs to the file; the file was left as it is."
            )
        }
        let header = Array(bytes[0..<Self.headerCount])
        var plaintext: Data
        do {
            let nonce = try AES.GCM.Nonce(data: bytes[Self.headerCount..<(Self.headerCount + Self.nonceCount)])
            let box = try AES.GCM.SealedBox(
                nonce: nonce,
                ciphertext: bytes[(Self.headerCount + Self.nonceCount)..<(bytes.count - Self.tagCount)],
                tag: bytes[(bytes.count - Self.tagCount)...]
            )
            plaintext = try AES.GCM.open(box, using: key, authenticating: header)
        } catch {
            throw self.corrupt("it failed authentication (damaged or truncated)")
        }
        defer {
            plaintext.withUnsafeMutableBytes { buffer in
                if let base = buffer.baseAddress { SecretValue.wipe(base, buffer.count) }
            }
        }
        guard let items = plaintext.withUnsafeBytes({ Self.decode($0) }) else {
            throw self.corrupt("its decrypted content is malformed")
        }
        return items
    }

    // MARK: - Plaintext encoding

    /// count · per item: kind (1) · label · attribute count · (name · value)* · secret; every
    /// string and the secret as a 32-bit big-endian length and bytes.
    static func encode(_ items: [Item]) -> [UInt8] {
        var out: [UInt8] = []
        // One allocation of exactly the size: a reallocation while appending would free a copy
        // of the plaintext secrets without wiping it.
        out.reserveCapacity(Self.encodedSize(items))
        func put(_ value: UInt32) {
            out.append(contentsOf: [UInt8(value >> 24), UInt8((value >> 16) & 0xff), UInt8((value >> 8) & 0xff), UInt8(value & 0xff)])
        }
        func put(_ text: String) {
            put(UInt32(text.utf8.count))
            out.append(contentsOf: text.utf8)
        }
        put(UInt32(items.count))
        for item in items {
            out.append(item.kind == .password ? 0 : 1)
            put(item.label)
            put(UInt32(item.attributes.count))
            for (name, value) in item.attributes.sorted(by: { $0.key < $1.key }) {
                put(name)
                put(value)
            }
            put(UInt32(item.secret.count))
            item.secret.withUnsafeBytes { out.append(contentsOf: $0) }
        }
        return out
    }

    /// The length of `encode(items)`: per item, the kind, four lengths (label, attribute count,
    /// secret; each attribute has two) and the bytes.
    static func encodedSize(_ items: [Item]) -> Int {
        var size = 4
        for item in items {
            size += 1 + 4 + item.label.utf8.count + 4 + 4 + item.secret.count
            for (name, value) in item.attributes { size += 8 + name.utf8.count + value.utf8.count }
        }
        return size
    }

    static func decode(_ bytes: UnsafeRawBufferPointer) -> [Item]? {
        var offset = 0
        func take(_ count: Int) -> UnsafeRawBufferPointer? {
            guard count >= 0, bytes.count - offset >= count else { return nil }
            defer { offset += count }
            return UnsafeRawBufferPointer(rebasing: bytes[offset..<(offset + count)])
        }
        func u32() -> Int? {
            guard let b = take(4) else { return nil }
            return Int(b[0]) << 24 | Int(b[1]) << 16 | Int(b[2]) << 8 | Int(b[3])
        }
        func text() -> String? {
            guard let count = u32(), let b = take(count) else { return nil }
            return String(validating: b, as: UTF8.self)
        }
        guard let count = u32(), count <= bytes.count else { return nil }
        var items: [Item] = []
        for _ in 0..<count {
            guard let kindByte = take(1)?.first, kindByte <= 1, let label = text(), let attributeCount = u32(),
                attributeCount <= bytes.count
            else { return nil }
            var attributes: [String: String] = [:]
            for _ in 0..<attributeCount {
                guard let name = text(), let value = text() else { return nil }
                attributes[name] = value
            }
            guard let secretCount = u32(), let secret = take(secretCount) else { return nil }
            items.append(
                Item(
                    kind: kindByte == 0 ? .password : .identityKey,
                    attributes: attributes,
                    label: label,
                    secret: SecretValue(copying: secret)
                )
            )
        }
        return offset == bytes.count ? items : nil
    }

    // MARK: - The key

    private func key(mayCreate: Bool) throws(SecretStoreError) -> SymmetricKey {
        if let key = self.cachedKey.withLockedValue({ $0 }) { return key }
        let key = try self.loadKey(mayCreate: mayCreate)
        self.cachedKey.withLockedValue { $0 = key }
        return key
    }

    private func loadKey(mayCreate: Bool) throws(SecretStoreError) -> SymmetricKey {
        if let credential = self.credentialPath {
            guard var bytes = try FileIO.readPrivateFile(credential, what: "credential", maxBytes: 4096, requirePrivate: false) else {
                throw SecretStoreError(
                    .keyMissing,
                    "CREDENTIALS_DIRECTORY is set but holds no \(Self.credentialName) credential (\(credential)). Add LoadCredentialEncrypted=\(Self.credentialName):PATH to the service (make one with: head -c 32 /dev/urandom | systemd-creds encrypt --name=\(Self.credentialName) - PATH), or run without CREDENTIALS_DIRECTORY to use the key file \(self.keyFilePath)."
                )
            }
            defer { SecretValue.wipe(&bytes) }
            guard bytes.count == Self.keyByteCount else {
                throw SecretStoreError(
                    .keyInvalid,
                    "The credential \(credential) is \(bytes.count) bytes; the secrets key must be exactly \(Self.keyByteCount) random bytes. Make it with: head -c 32 /dev/urandom | systemd-creds encrypt --name=\(Self.credentialName) - PATH."
                )
            }
            return SymmetricKey(data: bytes)
        }
        if var bytes = try FileIO.readPrivateFile(self.keyFilePath, what: "secrets key file", maxBytes: 4096) {
            defer { SecretValue.wipe(&bytes) }
            guard bytes.count == Self.keyByteCount else {
                throw SecretStoreError(
                    .keyInvalid,
                    "The secrets key file \(self.keyFilePath) is \(bytes.count) bytes; a key is exactly \(Self.keyByteCount) random bytes. Restore the right key file; if the secrets file \(self.path) is lost with it, move both aside to start again."
                )
            }
            return SymmetricKey(data: bytes)
        }
        guard mayCreate else {
            throw SecretStoreError(
                .keyMissing,
                "The secrets key file \(self.keyFilePath) is missing, so the secrets file \(self.path) cannot be read. Restore the key file from a backup, or move the secrets file aside (mv '\(self.path)' '\(self.path).bad') to start with no stored secrets."
            )
        }
        try FileIO.makeDirectory(AtomicFile.directory(of: self.keyFilePath))
        let key = SymmetricKey(size: .bits256)
        var keyBytes = key.withUnsafeBytes { [UInt8]($0) }
        defer { SecretValue.wipe(&keyBytes) }
        let created = try FileIO.writeAtomically(keyBytes, to: self.keyFilePath, what: "secrets key file", exclusive: true)
        if created { return key }
        // Another writer created it first: use theirs.
        return try self.loadKey(mayCreate: false)
    }
}
