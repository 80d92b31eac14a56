import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerSecrets
import NIOConcurrencyHelpers
import NIOPosix
import Foundation
import NIOHTTP1

/// How long a credential is kept, as URLCredential's persistence: for this request only (`none`,
/// never stored), until the daemon stops (`session`), or in the secret store (`permanent`).
package enum CredentialPersistence: String, Codable, Sendable, CaseIterable {
    case none
    case session
    case permanent
}

/// A stored password's public part: where it is used and whether the server refused it.
package struct StoredPasswordInfo: Sendable, Equatable {
    package var origin: CanonicalOrigin
    /// nil: any realm at that origin.
    package var realm: String?
    package var user: String
    package var persistence: CredentialPersistence
    /// The server refused it; it is not sent again until it is changed (lockout safety).
    package var failed: Bool
}

/// The passwords the broker answers Basic and Digest challenges with.
///
/// A password belongs to an origin and optionally a realm; for a protection space the entry with
/// the same realm wins over one for any realm. `session` ones live in memory; `permanent` ones in
/// the secret store (read on first need and cached, so repeat requests never wait on a keyring).
/// A password the server refused is marked failed and not offered again until it is replaced
/// (`AuthAttemptPolicy`). Secrets stay in `PasswordCredential`, whose descriptions are redacted.
package final class PasswordVault: Sendable {
    private struct Entry: Sendable {
        var info: StoredPasswordInfo
        var credential: PasswordCredential
    }

    private struct Key: Hashable, Sendable {
        var origin: CanonicalOrigin
        var realm: String?
        var user: String
    }

    /// A refused mark as kept on disk, so a password the server refused is not sent again
    /// after a restart either (a lockout counts across restarts too).
    private struct FailedMark: Codable {
        var url: String
        var realm: String?
        var user: String
    }

    private let session = NIOLockedValueBox<[Entry]>([])
    /// Permanent credentials read from the store so far.
    private let permanentCache = NIOLockedValueBox<[Key: PasswordCredential]>([:])
    private let failed = NIOLockedValueBox<Set<Key>>([])
    private let permanent: SecretStorePasswords?
    private let pool: NIOThreadPool
    /// Where refused marks are kept (`password-failures.json` in the state directory); nil: memory only.
    private let failuresPath: String?

    /// - Parameters:
    ///   - permanent: the secret store for `permanent` passwords; nil: session only.
    ///   - failuresPath: where refused marks survive restarts; an unreadable file starts empty.
    package init(permanent: SecretStorePasswords? = nil, failuresPath: String? = nil, pool: NIOThreadPool = .singleton) {
        self.permanent = permanent
        self.pool = pool
        self.failuresPath = failuresPath
        if let failuresPath, let data = FileManager.default.contents(atPath: failuresPath),
            let marks = try? JSONDecoder().decode([FailedMark].self, from: data)
        {
            let keys = marks.compactMap { mark -> Key? in
                guard let origin = try? CanonicalOrigin(parsing: mark.url) else { return nil }
                return Key(origin: origin, realm: mark.realm, user: mark.user)
            }
            self.failed.withLockedValue { $0 = Set(keys) }
        }
    }

    /// Writes the refused marks (temp file, then rename: never half a file).
    private func saveFailures(_ keys: Set<Key>) {
        guard let path = self.failuresPath else { return }
        let marks = keys.map { FailedMark(url: $0.origin.description, realm: $0.realm, user: $0.user) }
        guard let data = try? JSONEncoder().encode(marks.sorted { ($0.url, $0.user) < ($1.url, $1.user) }) else { return }
        let temporary = path + ".tmp"
        guard FileManager.default.createFile(atPath: temporary, contents: data, attributes: [.posixPermissions: 0o600]) else { return }
        _ = rename(temporary, path)
    }

    /// Changes the refused marks and keeps them on disk.
    private func updateFailed(_ change: (inout Set<Key>) -> Void) {
        let keys = self.failed.withLockedValue { failed -> Set<Key> in
            change(&failed)
            return failed
        }
        self.saveFailures(keys)
    }

    /// Adds a password, replacing one for the same origin, realm and user (and clearing its failed mark).
    package func add(
        origin: CanonicalOrigin, realm: String?, credential: PasswordCredential, persistence: CredentialPersistence
    ) async throws(BrokerError) {
        let key = Key(origin: origin, realm: realm, user: credential.user)
        switch persistence {
        case .none:
            return
        case .session:
            let info = StoredPasswordInfo(origin: origin, realm: realm, user: credential.user, persistence: .session, failed: false)
            self.session.withLockedValue { entries in
                entries.removeAll { Key(origin: $0.info.origin, realm: $0.info.realm, user: $0.info.user) == key }
                entries.append(Entry(info: info, credential: credential))
            }
        case .permanent:
            let store = try self.permanentStore()
            try await self.blocking { try store.add(origin: origin, realm: realm, credential: credential) }
            self.permanentCache.withLockedValue { $0[key] = credential }
        }
        self.updateFailed { _ = $0.remove(key) }
    }

    /// Removes the password for `origin`, `realm` and `user` (session and permanent); returns what was removed.
    package func remove(origin: CanonicalOrigin, realm: String?, user: String) async throws(BrokerError) -> StoredPasswordInfo {
        let key = Key(origin: origin, realm: realm, user: user)
        var removed: StoredPasswordInfo? = self.session.withLockedValue { entries in
            guard let index = entries.firstIndex(where: { Key(origin: $0.info.origin, realm: $0.info.realm, user: $0.info.user) == key })
            else { return nil }
            return entries.remove(at: index).info
        }
        if let store = self.permanent {
            let count = try await self.blocking { try store.remove(origin: origin, realm: realm, user: user) }
            self.permanentCache.withLockedValue { $0[key] = nil }
            if count > 0, removed == nil {
                removed = StoredPasswordInfo(origin: origin, realm: realm, user: user, persistence: .permanent, failed: false)
            }
        }
        self.updateFailed { _ = $0.remove(key) }
        guard let removed else {
            throw Self.notFound(origin: origin, realm: realm, user: user)
        }
        return removed
    }

    /// Session passwords, then permanent ones (metadata only).
    package func list() async throws(BrokerError) -> [StoredPasswordInfo] {
        let failed = self.failed.withLockedValue { $0 }
        var infos = self.session.withLockedValue { $0.map(\.info) }.map { info in
            var info = info
            info.failed = failed.contains(Key(origin: info.origin, realm: info.realm, user: info.user))
            return info
        }
        if let store = self.permanent {
            let entries = try await self.blocking { try store.allEntries() }
            infos += entries.map { entry in
                StoredPasswordInfo(
                    origin: entry.origin, realm: entry.realm, user: entry.user, persistence: .permanent,
                    failed: failed.contains(Key(origin: entry.origin, realm: entry.realm, user: entry.user))
                )
            }
        }
        return infos
    }

    /// The secret itself, for a caller that passed the PAM gate.
    package func reveal(origin: CanonicalOrigin, realm: String?, user: String) async throws(BrokerError) -> PasswordCredential {
        let key = Key(origin: origin, realm: realm, user: user)
        if let found = self.session.withLockedValue({ entries in
            entries.first { Key(origin: $0.info.origin, realm: $0.info.realm, user: $0.info.user) == key }?.credential
        }) {
            return found
        }
        if let store = self.permanent, let password = try await self.blocking({ try store.password(origin: origin, realm: realm, user: user) }) {
            return PasswordCredential(user: user, password: password)
        }
        throw Self.notFound(origin: origin, realm: realm, user: user)
    }

    /// The credential for `space` and whether it may be sent, reading the secret store when it
    /// is not cached. nil when there is none (or the store cannot be read: the 401 then goes to
    /// the client, and the error to the log).
    package func credential(for space: ProtectionSpace) async -> StoredAnswer? {
        if let known = self.cachedCredential(for: space) { return known }
        guard let store = self.permanent else { return nil }
        let origin = space.origin
        let found: (user: String, realm: String?, password: String)?
        do {
            found = try await self.blocking {
                let entries = try store.entries(origin: origin)
                guard let entry = entries.first(where: { $0.realm == space.realm }) ?? entries.first(where: { $0.realm == nil }),
                    let password = try store.password(origin: origin, realm: entry.realm, user: entry.user)
                else { return nil }
                return (entry.user, entry.realm, password)
            }
        } catch {
            return nil
        }
        guard let found else { return nil }
        let credential = PasswordCredential(user: found.user, password: found.password)
        let key = Key(origin: origin, realm: found.realm, user: found.user)
        self.permanentCache.withLockedValue { $0[key] = credential }
        let isFailed = self.failed.withLockedValue { $0.contains(key) }
        return StoredAnswer(credential: credential, state: isFailed ? .markedFailed : .usable)
    }

    /// From memory only (session passwords and permanent ones already read): for preemptive
    /// answers, which must not wait on a keyring.
    package func cachedCredential(for space: ProtectionSpace) -> StoredAnswer? {
        let failed = self.failed.withLockedValue { $0 }
        let sessionMatch = self.session.withLockedValue { entries -> Entry? in
            let candidates = entries.filter { $0.info.origin == space.origin && ($0.info.realm == nil || $0.info.realm == space.realm) }
            return candidates.first(where: { $0.info.realm != nil }) ?? candidates.first
        }
        if let entry = sessionMatch {
            let key = Key(origin: entry.info.origin, realm: entry.info.realm, user: entry.info.user)
            return StoredAnswer(credential: entry.credential, state: failed.contains(key) ? .markedFailed : .usable)
        }
        let cached = self.permanentCache.withLockedValue { cache -> (Key, PasswordCredential)? in
            let candidates = cache.filter { $0.key.origin == space.origin && ($0.key.realm == nil || $0.key.realm == space.realm) }
            return (candidates.first(where: { $0.key.realm != nil }) ?? candidates.first).map { ($0.key, $0.value) }
        }
        guard let (key, credential) = cached else { return nil }
        return StoredAnswer(credential: credential, state: failed.contains(key) ? .markedFailed : .usable)
    }

    /// The server refused `user`'s password for `space`: do not send it again until it changes.
    package func markFailed(space: ProtectionSpace, user: String) {
        let keys = [Key(origin: space.origin, realm: space.realm, user: user), Key(origin: space.origin, realm: nil, user: user)]
        self.updateFailed { $0.formUnion(keys) }
    }

    package var failedCount: Int {
        self.failed.withLockedValue { $0.count }
    }

    private static func notFound(origin: CanonicalOrigin, realm: String?, user: String) -> BrokerError {
        let realmText = realm.map { " (realm \"\($0)\")" } ?? ""
        return BrokerError(
            code: "password_not_found", status: .notFound, title: "No such password",
            detail: "There is no password for \(user) at \(origin)\(realmText). `authbrokerctl passwords list` shows the ones there are."
        )
    }

    private func permanentStore() throws(BrokerError) -> SecretStorePasswords {
        guard let permanent = self.permanent else {
            throw BrokerError(
                code: "secret_store_unavailable", status: .serviceUnavailable, title: "No secret store",
                detail: "Permanent passwords are kept in the secret store, which this daemon could not open; `authbrokerctl status` says why. Use persistence \"session\" meanwhile."
            )
        }
        return permanent
    }

    /// Runs a call that may block on a keyring on the blocking pool; store errors become broker errors.
    private func blocking<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws(BrokerError) -> T {
        do {
            return try await self.pool.runIfActive(body)
        } catch let error as SecretStoreError {
            throw BrokerError.secretStore(error)
        } catch {
            throw BrokerError.internalError("The secret store could not be used: \(error)")
        }
    }
}

/// A stored credential as the challenge broker hands it out.
package struct StoredAnswer: Sendable, Equatable {
    package var credential: PasswordCredential
    package var state: AuthAttemptPolicy.StoredCredential
}
