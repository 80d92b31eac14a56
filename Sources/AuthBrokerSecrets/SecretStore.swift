/// What a stored secret is for; each kind has its own attribute schema.
package enum SecretKind: String, Sendable, Hashable, CaseIterable {
    /// A password for a protection space. Attributes use libsecret's
    /// `org.gnome.keyring.NetworkPassword` names, so `secret-tool search server HOST` shows the
    /// entry and entries other tools saved with those names are found.
    case password
    /// A client identity's private key, under AuthBroker's own `org.authbroker.Identity` schema.
    case identityKey = "identity_key"

    /// The attribute names this kind accepts.
    package var attributeNames: Set<String> {
        switch self {
        case .password: ["user", "domain", "server", "object", "protocol", "authtype", "port"]
        case .identityKey: ["name"]
        }
    }

    /// The Secret Service schema name (`xdg:schema`).
    package var schemaName: String {
        switch self {
        case .password: "org.gnome.keyring.NetworkPassword"
        case .identityKey: "org.authbroker.Identity"
        }
    }
}

/// What `list` returns about an item: never the secret.
package struct SecretItemMetadata: Sendable, Hashable {
    package var kind: SecretKind
    package var attributes: [String: String]
    package var label: String

    package init(kind: SecretKind, attributes: [String: String], label: String) {
        self.kind = kind
        self.attributes = attributes
        self.label = label
    }
}

/// Where the broker keeps passwords and identity keys.
///
/// Items are addressed by their kind and attributes:
/// - `store` adds an item, replacing the one whose attributes are exactly the same (gnome-keyring
///   replaces any item that carries all of them: items of a kind that must stay apart need a
///   value for every attribute name any of them uses, as passwords' `domain` does);
/// - `lookup` and `delete` take attributes that an item must all carry (an item may carry more,
///   as entries made by other tools do), and names an item must not carry (`absent`: a password
///   stored for any realm is the item with no `domain`, not any realm's); `lookup` prefers an
///   item whose attributes are exactly those given, else the most recently changed match;
/// - `list` returns metadata only.
///
/// - Warning: every call blocks (file I/O with `fsync` and a lock; D-Bus round trips to the
///   Secret Service, bounded by a timeout). Call it from a dedicated thread pool
///   (`NIOThreadPool`), never from an event loop or Swift's cooperative pool.
package protocol SecretStore: Sendable {
    /// A short name for logs and status ("secret-service", "file").
    var backendName: String { get }

    func store(kind: SecretKind, attributes: [String: String], label: String, secret: SecretValue) throws(SecretStoreError)

    func lookup(kind: SecretKind, attributes: [String: String], absent: Set<String>) throws(SecretStoreError) -> SecretValue?

    /// Deletes every item of `kind` carrying all of `attributes` and none of `absent`; returns
    /// how many were deleted.
    @discardableResult
    func delete(kind: SecretKind, attributes: [String: String], absent: Set<String>) throws(SecretStoreError) -> Int

    /// Metadata of the items of `kind` carrying all of `matching`. Empty `matching`: every item
    /// of `kind` the broker stored (the Secret Service backend then leaves out entries other
    /// tools saved without the NetworkPassword schema; a filter finds those too).
    func list(kind: SecretKind, matching: [String: String]) throws(SecretStoreError) -> [SecretItemMetadata]
}

extension SecretStore {
    package func lookup(kind: SecretKind, attributes: [String: String]) throws(SecretStoreError) -> SecretValue? {
        try self.lookup(kind: kind, attributes: attributes, absent: [])
    }

    @discardableResult
    package func delete(kind: SecretKind, attributes: [String: String]) throws(SecretStoreError) -> Int {
        try self.delete(kind: kind, attributes: attributes, absent: [])
    }
}

/// Limits that both backends enforce, checked before anything is touched.
package enum SecretStoreLimits {
    /// Largest secret accepted (a private key or a password is far smaller).
    package static let maxSecretBytes = 1 << 20
    /// Largest attribute value or label.
    package static let maxTextBytes = 4096

    /// Checks that `attributes` fit `kind`'s schema; `requireSome` for store, lookup and delete.
    package static func validate(
        kind: SecretKind,
        attributes: [String: String],
        requireSome: Bool
    ) throws(SecretStoreError) {
        if requireSome && attributes.isEmpty {
            throw SecretStoreError(
                .invalidInput,
                "No attributes were given for the \(kind.rawValue) item. Give at least one of: \(kind.attributeNames.sorted().joined(separator: ", "))."
            )
        }
        for (name, value) in attributes {
            guard kind.attributeNames.contains(name) else {
                throw SecretStoreError(
                    .invalidInput,
                    "'\(name.prefix(64))' is not an attribute of \(kind.rawValue) items (schema \(kind.schemaName)). Use one of: \(kind.attributeNames.sorted().joined(separator: ", "))."
                )
            }
            guard value.utf8.count <= maxTextBytes, !value.utf8.contains(0) else {
                throw SecretStoreError(
                    .invalidInput,
                    "The value of attribute '\(name)' is longer than \(maxTextBytes) bytes or contains a NUL byte. Shorten it."
                )
            }
            if kind == .password && name == "port" {
                guard let port = UInt32(value), port <= 65535, String(port) == value else {
                    throw SecretStoreError(
                        .invalidInput,
                        "The port attribute must be a number from 0 to 65535 (it is an integer in the NetworkPassword schema), not '\(value.prefix(32))'."
                    )
                }
            }
        }
    }

    package static func validate(label: String, secret: SecretValue) throws(SecretStoreError) {
        guard label.utf8.count <= maxTextBytes, !label.utf8.contains(0) else {
            throw SecretStoreError(
                .invalidInput,
                "The label is longer than \(maxTextBytes) bytes or contains a NUL byte. Shorten it."
            )
        }
        guard secret.count <= maxSecretBytes else {
            throw SecretStoreError(
                .invalidInput,
                "The secret is \(secret.count) bytes; at most \(maxSecretBytes) are stored."
            )
        }
    }

    /// Whether `candidate` carries every pair of `query` and none of the names in `absent`.
    package static func matches(_ candidate: [String: String], _ query: [String: String], absent: Set<String> = []) -> Bool {
        query.allSatisfy { candidate[$0.key] == $0.value } && absent.allSatisfy { candidate[$0] == nil }
    }
}
