import AuthBrokerCore
import AuthBrokerHTTPAuth
import NIOConcurrencyHelpers
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
/// the same realm wins over one for any realm. A password the server refused is marked failed
/// and not offered again until it is replaced (`AuthAttemptPolicy`). Secrets stay in
/// `PasswordCredential`, whose descriptions are redacted.
package final class PasswordVault: Sendable {
    private struct Entry: Sendable {
        var info: StoredPasswordInfo
        var credential: PasswordCredential
    }

    private let entries = NIOLockedValueBox<[Entry]>([])

    package init() {}

    /// Adds a password, replacing one for the same origin, realm and user (and clearing its failed mark).
    package func add(origin: CanonicalOrigin, realm: String?, credential: PasswordCredential, persistence: CredentialPersistence) throws(BrokerError) {
        guard persistence == .session else {
            throw BrokerError.badRequest(
                code: "persistence_unavailable",
                detail:
                    "Only session persistence (kept until the daemon stops) is available in this version; the secret-store backed permanent persistence is not built yet. Add the password with persistence \"session\"."
            )
        }
        let info = StoredPasswordInfo(origin: origin, realm: realm, user: credential.user, persistence: persistence, failed: false)
        self.entries.withLockedValue { entries in
            entries.removeAll { $0.info.origin == origin && $0.info.realm == realm && $0.info.user == credential.user }
            entries.append(Entry(info: info, credential: credential))
        }
    }

    /// Removes the password for `origin`, `realm` and `user`; returns what was removed.
    package func remove(origin: CanonicalOrigin, realm: String?, user: String) throws(BrokerError) -> StoredPasswordInfo {
        let removed: StoredPasswordInfo? = self.entries.withLockedValue { entries in
            guard let index = entries.firstIndex(where: { $0.info.origin == origin && $0.info.realm == realm && $0.info.user == user })
            else { return nil }
            return entries.remove(at: index).info
        }
        guard let removed else {
            let realmText = realm.map { " (realm \"\($0)\")" } ?? ""
            throw BrokerError(
                code: "password_not_found", status: .notFound, title: "No such password",
                detail: "There is no password for \(user) at \(origin)\(realmText). `authbrokerctl passwords list` shows the ones there are."
            )
        }
        return removed
    }

    /// The secret itself, for a caller that passed the PAM gate.
    package func reveal(origin: CanonicalOrigin, realm: String?, user: String) throws(BrokerError) -> PasswordCredential {
        let found = self.entries.withLockedValue { entries in
            entries.first { $0.info.origin == origin && $0.info.realm == realm && $0.info.user == user }?.credential
        }
        guard let found else {
            let realmText = realm.map { " (realm \"\($0)\")" } ?? ""
            throw BrokerError(
                code: "password_not_found", status: .notFound, title: "No such password",
                detail: "There is no password for \(user) at \(origin)\(realmText). `authbrokerctl passwords list` shows the ones there are."
            )
        }
        return found
    }

    package func list() -> [StoredPasswordInfo] {
        self.entries.withLockedValue { $0.map(\.info) }
    }

    /// The credential for `space` and whether it may be sent: the entry for its realm, else one
    /// for any realm at its origin. nil when there is none.
    package func credential(for space: ProtectionSpace) -> StoredAnswer? {
        self.entries.withLockedValue { entries in
            let candidates = entries.filter { $0.info.origin == space.origin && ($0.info.realm == nil || $0.info.realm == space.realm) }
            guard let best = candidates.first(where: { $0.info.realm != nil }) ?? candidates.first else { return nil }
            return StoredAnswer(credential: best.credential, state: best.info.failed ? .markedFailed : .usable)
        }
    }

    /// The server refused `user`'s password for `space`: do not send it again until it changes.
    package func markFailed(space: ProtectionSpace, user: String) {
        self.entries.withLockedValue { entries in
            for index in entries.indices
            where entries[index].info.origin == space.origin && entries[index].info.user == user
                && (entries[index].info.realm == nil || entries[index].info.realm == space.realm)
            {
                entries[index].info.failed = true
            }
        }
    }

    package var failedCount: Int {
        self.entries.withLockedValue { $0.filter(\.info.failed).count }
    }
}

/// A stored credential as the challenge broker hands it out.
package struct StoredAnswer: Sendable, Equatable {
    package var credential: PasswordCredential
    package var state: AuthAttemptPolicy.StoredCredential
}
