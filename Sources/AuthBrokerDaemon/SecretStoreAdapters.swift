import AuthBrokerCore
import AuthBrokerHTTPAuth
import AuthBrokerSecrets

/// Identity keys in the secret store, under our own schema (`org.authbroker.Identity`, `name`).
package struct SecretStoreIdentityKeys: IdentityKeyStore {
    package let store: any SecretStore

    package init(store: any SecretStore) {
        self.store = store
    }

    package func storeKey(name: String, material: [UInt8]) throws {
        try self.store.store(
            kind: .identityKey, attributes: ["name": name], label: "authbroker client identity \(name)",
            secret: SecretValue(bytes: material)
        )
    }

    package func key(name: String) throws -> [UInt8]? {
        try self.store.lookup(kind: .identityKey, attributes: ["name": name])?.withUnsafeBytes { Array($0) }
    }

    package func removeKey(name: String) throws {
        try self.store.delete(kind: .identityKey, attributes: ["name": name])
    }
}

/// Passwords kept permanently, as libsecret's `org.gnome.keyring.NetworkPassword` items:
/// `server`, `port`, `protocol` (the URL scheme), `user`, and the realm in `domain` — so
/// `secret-tool search server HOST` and Seahorse show them, and an entry another tool saved for
/// the server is found too.
package struct SecretStorePasswords: Sendable {
    package let store: any SecretStore

    package init(store: any SecretStore) {
        self.store = store
    }

    static func attributes(origin: CanonicalOrigin, realm: String?, user: String?) -> [String: String] {
        var attributes = ["server": origin.host, "protocol": origin.scheme.rawValue, "port": String(origin.port)]
        if let realm { attributes["domain"] = realm }
        if let user { attributes["user"] = user }
        return attributes
    }

    /// A password for any realm is stored with an empty `domain`: gnome-keyring replaces any item
    /// that carries all of a new item's attributes, so one stored without a `domain` would
    /// replace the realms' own passwords for the same user.
    package func add(origin: CanonicalOrigin, realm: String?, credential: PasswordCredential) throws {
        var attributes = Self.attributes(origin: origin, realm: realm ?? "", user: credential.user)
        attributes["authtype"] = "http"
        let realmText = realm.map { " (\($0))" } ?? ""
        try self.store.store(
            kind: .password, attributes: attributes, label: "\(credential.user)@\(origin)\(realmText)",
            secret: SecretValue(credential.password)
        )
        // The same password as an earlier build stored it (no domain at all) is replaced too.
        if realm == nil { try self.removeDomainless(origin: origin, user: credential.user) }
    }

    /// Without a realm, only the item stored for any realm (with an empty `domain`, or, as
    /// earlier builds and other tools stored it, none): the realms' own stay.
    @discardableResult
    package func remove(origin: CanonicalOrigin, realm: String?, user: String) throws -> Int {
        let removed = try self.store.delete(kind: .password, attributes: Self.attributes(origin: origin, realm: realm ?? "", user: user))
        return removed + (realm == nil ? try self.removeDomainless(origin: origin, user: user) : 0)
    }

    /// The any-realm item as earlier builds and other tools stored it: no `domain` at all.
    private static func domainless(origin: CanonicalOrigin, user: String) -> (attributes: [String: String], absent: Set<String>) {
        (Self.attributes(origin: origin, realm: nil, user: user), ["domain"])
    }

    @discardableResult
    private func removeDomainless(origin: CanonicalOrigin, user: String) throws -> Int {
        let query = Self.domainless(origin: origin, user: user)
        return try self.store.delete(kind: .password, attributes: query.attributes, absent: query.absent)
    }

    /// The stored items for an origin (metadata only): user and realm of each.
    package func entries(origin: CanonicalOrigin) throws -> [(user: String, realm: String?)] {
        try self.store.list(kind: .password, matching: ["server": origin.host]).compactMap { item in
            guard let user = item.attributes["user"] else { return nil }
            if let scheme = item.attributes["protocol"], scheme != origin.scheme.rawValue { return nil }
            if let port = item.attributes["port"], port != String(origin.port) { return nil }
            return (user, PasswordVault.realm(item.attributes["domain"]))
        }
    }

    /// Every item that names a server this broker could reach (metadata only).
    package func allEntries() throws -> [(origin: CanonicalOrigin, user: String, realm: String?)] {
        try self.store.list(kind: .password, matching: [:]).compactMap { item in
            guard let host = item.attributes["server"], let user = item.attributes["user"] else { return nil }
            let scheme = UpstreamScheme(rawValue: item.attributes["protocol"] ?? "https") ?? .https
            let port = item.attributes["port"].flatMap(Int.init) ?? (scheme == .https ? 443 : 80)
            guard let origin = try? CanonicalOrigin(scheme: scheme, host: host, port: port) else { return nil }
            return (origin, user, PasswordVault.realm(item.attributes["domain"]))
        }
    }

    package func password(origin: CanonicalOrigin, realm: String?, user: String) throws -> String? {
        if let found = try self.store.lookup(kind: .password, attributes: Self.attributes(origin: origin, realm: realm ?? "", user: user)) {
            return found.stringValue()
        }
        guard realm == nil else { return nil }
        let query = Self.domainless(origin: origin, user: user)
        return try self.store.lookup(kind: .password, attributes: query.attributes, absent: query.absent)?.stringValue()
    }
}
