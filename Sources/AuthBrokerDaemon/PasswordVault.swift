import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerSecrets
import NIOConcurrencyHelpers
import NIOPosix
import Foundation
import Logging
import NIOHTTP1
import Synchronization

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
/// (`AuthAttemptPolicy`). A password a server accepted as a Digest answer is marked Digest-only:
/// never sent as Basic afterwards (in cleartext, to a server, or someone on the path, that offers
/// only Basic), until it is replaced. Both marks survive restarts. Secrets stay in
/// `PasswordCredential`, whose descriptions are redacted.
package final class PasswordVault: Sendable {
    private struct Entry: Sendable {
        var info: StoredPasswordInfo
        var credential: PasswordCredential
    }

    private typealias Key = PasswordKey

    private let session = NIOLockedValueBox<[Entry]>([])
    /// Permanent credentials read from the store so far.
    private let permanentCache = NIOLockedValueBox<[Key: PasswordCredential]>([:])
    /// Adds and removals so far (`changes`).
    private let changeCount = Atomic<UInt64>(0)
    /// Refused passwords: not sent again until replaced.
    private let failed: MarkFile
    /// Passwords a server accepted as a Digest answer: never sent as Basic until replaced.
    private let digestOnly: MarkFile
    private let permanent: SecretStorePasswords?
    private let pool: NIOThreadPool

    /// - Parameters:
    ///   - permanent: the secret store for `permanent` passwords; nil: session only.
    ///   - failuresPath: where refused marks survive restarts (`password-failures.json` in the
    ///     state directory); an unreadable file starts empty.
    ///   - digestOnlyPath: the same for Digest-only marks (`password-digest-only.json`).
    ///   - logger: where a marks file that cannot be read or written is reported.
    package init(
        permanent: SecretStorePasswords? = nil, failuresPath: String? = nil, digestOnlyPath: String? = nil,
        pool: NIOThreadPool = .singleton, logger: Logger? = nil
    ) {
        self.permanent = permanent
        self.pool = pool
        self.failed = MarkFile(path: failuresPath, what: "the refused-password marks", logger: logger)
        self.digestOnly = MarkFile(path: digestOnlyPath, what: "the Digest-only password marks", logger: logger)
    }

    /// An empty realm is no realm: the password for any realm, as the secret store keeps it (an
    /// empty `domain`).
    static func realm(_ realm: String?) -> String? { realm?.isEmpty == false ? realm : nil }

    /// Writes both marks files, when a change is not written yet, before it returns (the daemon
    /// calls it when it stops: the marks are written off the request's thread, a moment later).
    package func flushMarks() {
        self.failed.flush()
        self.digestOnly.flush()
    }

    /// Adds a password, replacing one for the same origin, realm and user (and clearing its failed mark).
    package func add(
        origin: CanonicalOrigin, realm: String?, credential: PasswordCredential, persistence: CredentialPersistence
    ) async throws(BrokerError) {
        let realm = Self.realm(realm)
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
        // A new password starts afresh: not refused, and no scheme seen for it yet.
        self.failed.update { _ = $0.remove(key) }
        self.digestOnly.update { _ = $0.remove(key) }
        self.changeCount.add(1, ordering: .releasing)
    }

    /// Removes the password for `origin`, `realm` and `user` (session and permanent); returns what was removed.
    package func remove(origin: CanonicalOrigin, realm: String?, user: String) async throws(BrokerError) -> StoredPasswordInfo {
        let realm = Self.realm(realm)
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
        self.failed.update { _ = $0.remove(key) }
        self.digestOnly.update { _ = $0.remove(key) }
        self.changeCount.add(1, ordering: .releasing)
        guard let removed else {
            throw Self.notFound(origin: origin, realm: realm, user: user)
        }
        return removed
    }

    /// Session passwords, then permanent ones (metadata only).
    package func list() async throws(BrokerError) -> [StoredPasswordInfo] {
        let failed = self.failed.all
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

    /// Whether any password is stored for `origin` (session or permanent, refused ones too):
    /// whether the proxy port intercepts a CONNECT to it. A secret store that cannot be asked
    /// counts as holding none.
    package func hasPassword(for origin: CanonicalOrigin) async -> Bool {
        if self.session.withLockedValue({ $0.contains { $0.info.origin == origin } }) { return true }
        guard let store = self.permanent else { return false }
        return (try? await self.blocking { try !store.entries(origin: origin).isEmpty }) ?? false
    }

    /// The secret itself, for a caller that passed the PAM gate.
    package func reveal(origin: CanonicalOrigin, realm: String?, user: String) async throws(BrokerError) -> PasswordCredential {
        let realm = Self.realm(realm)
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
        let isFailed = self.failed.contains(key)
        return StoredAnswer(credential: credential, realm: found.realm, state: isFailed ? .markedFailed : .usable)
    }

    /// From memory only (session passwords and permanent ones already read): for preemptive
    /// answers, which must not wait on a keyring.
    package func cachedCredential(for space: ProtectionSpace) -> StoredAnswer? {
        let failed = self.failed.all
        let sessionMatch = self.session.withLockedValue { entries -> Entry? in
            let candidates = entries.filter { $0.info.origin == space.origin && ($0.info.realm == nil || $0.info.realm == space.realm) }
            return candidates.first(where: { $0.info.realm != nil }) ?? candidates.first
        }
        if let entry = sessionMatch {
            let key = Key(origin: entry.info.origin, realm: entry.info.realm, user: entry.info.user)
            return StoredAnswer(credential: entry.credential, realm: entry.info.realm, state: failed.contains(key) ? .markedFailed : .usable)
        }
        let cached = self.permanentCache.withLockedValue { cache -> (Key, PasswordCredential)? in
            let candidates = cache.filter { $0.key.origin == space.origin && ($0.key.realm == nil || $0.key.realm == space.realm) }
            return (candidates.first(where: { $0.key.realm != nil }) ?? candidates.first).map { ($0.key, $0.value) }
        }
        guard let (key, credential) = cached else { return nil }
        return StoredAnswer(credential: credential, realm: key.realm, state: failed.contains(key) ? .markedFailed : .usable)
    }

    /// A server refused `user`'s password stored at `origin` for `storedRealm` (nil: any realm):
    /// do not send it again until it changes. Only that password is marked; another stored for
    /// the same user at the origin was never sent.
    package func markFailed(origin: CanonicalOrigin, user: String, storedRealm: String?) {
        self.failed.update { _ = $0.insert(Key(origin: origin, realm: Self.realm(storedRealm), user: user)) }
    }

    /// A server accepted `user`'s password stored at `origin` for `storedRealm` as a Digest
    /// answer: from now on that password is never sent as Basic (for any realm it may answer)
    /// until it is replaced.
    package func noteAnsweredWithDigest(origin: CanonicalOrigin, user: String, storedRealm: String?) {
        self.digestOnly.update { _ = $0.insert(Key(origin: origin, realm: Self.realm(storedRealm), user: user)) }
    }

    /// Whether `user`'s password stored for `storedRealm` must not be sent as Basic (it was
    /// answered with Digest before).
    package func isDigestOnly(origin: CanonicalOrigin, user: String, storedRealm: String?) -> Bool {
        self.digestOnly.contains(Key(origin: origin, realm: Self.realm(storedRealm), user: user))
    }

    /// Whether the password stored for `origin`, `realm` and `user` is marked refused.
    package func isMarkedFailed(origin: CanonicalOrigin, realm: String?, user: String) -> Bool {
        self.failed.contains(Key(origin: origin, realm: Self.realm(realm), user: user))
    }

    /// Counts adds and removals: what was concluded about a stored password (a proxy's held
    /// back, `ProxyPasswordDoubt`) holds only while this stays.
    package var changes: UInt64 { self.changeCount.load(ordering: .acquiring) }

    package var failedCount: Int {
        self.failed.all.count
    }

    private static func notFound(origin: CanonicalOrigin, realm: String?, user: String) -> BrokerError {
        let realmText = realm.map { " (realm \"\($0)\")" } ?? ""
        return BrokerError(
            code: .passwordNotFound, status: .notFound, title: "No such password",
            detail: "There is no password for \(user) at \(origin)\(realmText). `authbrokerctl passwords list` shows the ones there are."
        )
    }

    private func permanentStore() throws(BrokerError) -> SecretStorePasswords {
        guard let permanent = self.permanent else {
            throw BrokerError(
                code: .secretStoreUnavailable, status: .serviceUnavailable, title: "No secret store",
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
    /// The realm the password is stored for (nil: any realm): which stored password a refusal
    /// or a Digest acceptance is about.
    package var realm: String?
    package var state: AuthAttemptPolicy.StoredCredential
}
