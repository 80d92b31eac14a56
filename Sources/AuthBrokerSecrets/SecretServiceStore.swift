import CLibsecret
import Dispatch
import Foundation
import NIOConcurrencyHelpers
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// Secrets in the user's Secret Service (GNOME Keyring, KWallet, KeePassXC) through libsecret.
///
/// Passwords are stored under libsecret's `org.gnome.keyring.NetworkPassword` schema and found
/// by its attribute names whatever schema their item has (entries saved with `secret-tool`, which
/// marks them `org.freedesktop.Secret.Generic`, included); identity keys use
/// `org.authbroker.Identity`. Searches never unlock (no `SECRET_SEARCH_UNLOCK`): a locked item is
/// a `locked` error, never a prompt.
///
/// Every call is bounded by `timeout` (a `GCancellable` cancelled from a timer), one call runs at
/// a time, and after a D-Bus failure the shared connection is dropped
/// (`secret_service_disconnect`), so that a keyring daemon that dies gives clear errors and a
/// restarted one is used again by the next call.
package final class SecretServiceStore: SecretStore {
    package let timeout: Duration
    private let environment: [String: String]
    /// libsecret's default service is shared process-wide; calls are serialised through it.
    private let serial = NIOLock()
    /// The last failed call found the shared connection stale (the keyring daemon restarted
    /// since, so its bus name is gone), rather than a service that is slow or absent. Read and
    /// written under `serial`.
    private let droppedStaleConnection = NIOLockedValueBox(false)

    package var backendName: String { "secret-service" }

    package init(timeout: Duration = .seconds(10), environment: [String: String] = ProcessInfo.processInfo.environment) {
        self.timeout = timeout
        self.environment = environment
    }

    /// Checks that a Secret Service answers: connects, opens a session and runs a search.
    package func probe() throws(SecretStoreError) {
        try self.serialised { () throws(SecretStoreError) in
            try self.withCancellable("reach the Secret Service") { (cancellable, error) throws(SecretStoreError) in
                let service = secret_service_get_sync(SECRET_SERVICE_OPEN_SESSION, cancellable, &error)
                if let service { authbroker_object_unref(service) }
            }
            _ = try self.search(kind: .identityKey, attributes: ["name": "authbroker-probe-\(UInt64.random(in: 0...UInt64.max))"])
        }
    }

    // MARK: - SecretStore

    package func store(kind: SecretKind, attributes: [String: String], label: String, secret: SecretValue) throws(SecretStoreError) {
        try SecretStoreLimits.validate(kind: kind, attributes: attributes, requireSome: true)
        try SecretStoreLimits.validate(label: label, secret: secret)
        try self.serialised { () throws(SecretStoreError) in
            let table = Self.table(attributes)
            defer { g_hash_table_unref(table) }
            let contentType = kind == .password ? "text/plain" : "application/octet-stream"
            guard let value = secret.withUnsafeBytes({ authbroker_value_new($0.baseAddress, $0.count, contentType) }) else {
                throw SecretStoreError(.serviceFailed, "libsecret could not hold the secret (out of memory?).")
            }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            let schema = kind == .password ? authbroker_network_schema() : authbroker_identity_schema()
            try self.withCancellable("store the \(kind.rawValue) item") { (cancellable, error) throws(SecretStoreError) in
                _ = secret_service_store_sync(nil, schema, table, "default", label, value, cancellable, &error)
            }
        }
    }

    package func lookup(kind: SecretKind, attributes: [String: String], absent: Set<String>) throws(SecretStoreError) -> SecretValue? {
        try SecretStoreLimits.validate(kind: kind, attributes: attributes, requireSome: true)
        return try self.serialised { () throws(SecretStoreError) -> SecretValue? in
            let found = try self.search(kind: kind, attributes: attributes)
            defer { found.release() }
            // Prefer the exact match, then the most recently changed.
            let ordered = found.items.filter { Self.lacks($0.attributes, absent) }.sorted { $0.modified > $1.modified }
            guard let chosen = ordered.first(where: { $0.attributes == attributes }) ?? ordered.first else { return nil }
            guard !chosen.locked else { throw Self.lockedError("read the \(kind.rawValue) item") }
            try self.withCancellable("read the \(kind.rawValue) item") { (cancellable, error) throws(SecretStoreError) in
                _ = secret_item_load_secret_sync(chosen.item, cancellable, &error)
            }
            guard let value = secret_item_get_secret(chosen.item) else {
                throw Self.lockedError("read the \(kind.rawValue) item")
            }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            var length = 0
            guard let bytes = secret_value_get(value, &length) else { return SecretValue(bytes: []) }
            return SecretValue(copying: UnsafeRawBufferPointer(start: bytes, count: length))
        }
    }

    @discardableResult
    package func delete(kind: SecretKind, attributes: [String: String], absent: Set<String>) throws(SecretStoreError) -> Int {
        try SecretStoreLimits.validate(kind: kind, attributes: attributes, requireSome: true)
        return try self.serialised { () throws(SecretStoreError) -> Int in
            let found = try self.search(kind: kind, attributes: attributes)
            defer { found.release() }
            let doomed = found.items.filter { Self.lacks($0.attributes, absent) }
            if doomed.contains(where: \.locked) {
                throw Self.lockedError("delete the \(kind.rawValue) item")
            }
            for entry in doomed {
                try self.withCancellable("delete the \(kind.rawValue) item") { (cancellable, error) throws(SecretStoreError) in
                    _ = secret_item_delete_sync(entry.item, cancellable, &error)
                }
            }
            return doomed.count
        }
    }

    /// Whether an item's attributes carry none of the names in `absent`.
    private static func lacks(_ attributes: [String: String], _ absent: Set<String>) -> Bool {
        absent.allSatisfy { attributes[$0] == nil }
    }

    package func list(kind: SecretKind, matching: [String: String]) throws(SecretStoreError) -> [SecretItemMetadata] {
        try SecretStoreLimits.validate(kind: kind, attributes: matching, requireSome: false)
        return try self.serialised { () throws(SecretStoreError) -> [SecretItemMetadata] in
            let found = try self.search(kind: kind, attributes: matching)
            defer { found.release() }
            return found.items.map { SecretItemMetadata(kind: kind, attributes: $0.attributes, label: $0.label) }
        }
    }

    // MARK: - Searching

    struct Found {
        var list: UnsafeMutablePointer<GList>?
        var items: [Entry]

        func release() {
            if let list { authbroker_item_list_free(list) }
        }
    }

    struct Entry {
        var item: UnsafeMutablePointer<SecretItem>
        var attributes: [String: String]
        var label: String
        var locked: Bool
        var modified: UInt64
    }

    static let genericSchemaName = "org.freedesktop.Secret.Generic"

    /// The items of `kind` carrying `attributes`, locked ones included (never unlocking).
    private func search(kind: SecretKind, attributes: [String: String]) throws(SecretStoreError) -> Found {
        let table = Self.table(attributes)
        defer { g_hash_table_unref(table) }
        // An empty query matches nothing in gnome-keyring, so listing every password searches
        // by the schema name: entries of other tools show up once a filter is given.
        let schema: UnsafePointer<SecretSchema>? =
            switch kind {
            case .password: attributes.isEmpty ? authbroker_network_schema() : authbroker_network_schema_any_name()
            case .identityKey: authbroker_identity_schema()
            }
        var list: UnsafeMutablePointer<GList>?
        try self.withCancellable("search the keyring") { (cancellable, error) throws(SecretStoreError) in
            list = secret_service_search_sync(nil, schema, table, SECRET_SEARCH_ALL, cancellable, &error)
        }
        var items: [Entry] = []
        var link = list
        while let current = link {
            link = current.pointee.next
            guard let item = authbroker_list_item(current) else { continue }
            var all = Self.dictionary(secret_item_get_attributes(item))
            let schemaName = all.removeValue(forKey: "xdg:schema")
            switch kind {
            case .password:
                // Ours, or another tool's entry for a server (no schema, or secret-tool's generic one).
                guard schemaName == kind.schemaName
                    || ((schemaName == nil || schemaName == Self.genericSchemaName) && all["server"] != nil)
                else { continue }
            case .identityKey:
                guard schemaName == kind.schemaName else { continue }
            }
            guard SecretStoreLimits.matches(all, attributes) else { continue }
            let known = all.filter { kind.attributeNames.contains($0.key) }
            var label = ""
            if let raw = secret_item_get_label(item) {
                label = String(cString: raw)
                g_free(raw)
            }
            items.append(
                Entry(
                    item: item,
                    attributes: known,
                    label: label,
                    locked: secret_item_get_locked(item) != 0,
                    modified: UInt64(secret_item_get_modified(item))
                )
            )
        }
        return Found(list: list, items: items)
    }

    // MARK: - GLib plumbing

    private func serialised<Result>(_ body: () throws(SecretStoreError) -> Result) throws(SecretStoreError) -> Result {
        if let problem = Self.sessionBusProblem(self.environment) {
            throw Self.unavailableError(problem)
        }
        self.serial.lock()
        defer { self.serial.unlock() }
        self.droppedStaleConnection.withLockedValue { $0 = false }
        do {
            return try body()
        } catch where self.droppedStaleConnection.withLockedValue({ $0 }) {
            // A keyring daemon restarted since the last call: the connection was dropped, and
            // this call goes again on a new one (store and delete are idempotent, lookups read).
            return try body()
        }
    }

    /// Why no session bus can be reached, or nil when one may be. Checked before GLib is asked,
    /// because GLib would otherwise try to autolaunch a bus through X11.
    package static func sessionBusProblem(_ environment: [String: String]) -> String? {
        if let address = environment["DBUS_SESSION_BUS_ADDRESS"], !address.isEmpty { return nil }
        if let runtime = environment["XDG_RUNTIME_DIR"], !runtime.isEmpty, access("\(runtime)/bus", F_OK) == 0 {
            return nil
        }
        return "DBUS_SESSION_BUS_ADDRESS is unset and there is no $XDG_RUNTIME_DIR/bus"
    }

    /// Holds a reference on a `GCancellable` so the timer can cancel it after the call returned.
    private final class Canceller: @unchecked Sendable {  // GCancellable is thread-safe; the pointer is set once in init
        // @unchecked: g_cancellable_cancel is thread-safe, and the pointer itself never changes.
        let cancellable: UnsafeMutablePointer<GCancellable>
        let fired = Synchronization.Atomic<Bool>(false)

        init(_ cancellable: UnsafeMutablePointer<GCancellable>) { self.cancellable = cancellable }

        func cancel() {
            self.fired.store(true, ordering: .sequentiallyConsistent)
            g_cancellable_cancel(self.cancellable)
        }

        deinit { authbroker_object_unref(self.cancellable) }
    }

    /// Runs one libsecret call with a cancellable that fires after `timeout`, and turns its
    /// `GError` into a `SecretStoreError`.
    private func withCancellable(
        _ what: String,
        _ body: (UnsafeMutablePointer<GCancellable>, inout UnsafeMutablePointer<GError>?) throws(SecretStoreError) -> Void
    ) throws(SecretStoreError) {
        guard let raw = g_cancellable_new() else {
            throw SecretStoreError(.serviceFailed, "GLib could not make a cancellable (out of memory?).")
        }
        let canceller = Canceller(raw)
        let timer = DispatchWorkItem { canceller.cancel() }
        let (seconds, attoseconds) = self.timeout.components
        let nanoseconds = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
        DispatchQueue.global().asyncAfter(deadline: .now() + .nanoseconds(nanoseconds), execute: timer)
        defer { timer.cancel() }
        var error: UnsafeMutablePointer<GError>?
        try body(raw, &error)
        guard let failure = error else { return }
        defer { g_error_free(failure) }
        let timedOut = canceller.fired.load(ordering: .sequentiallyConsistent)
        let mapped = Self.map(failure, doing: what, timedOut: timedOut, timeout: self.timeout)
        if mapped != SecretStoreError.locked {
            // Drop the shared connection and session: a restarted daemon does not know them.
            secret_service_disconnect()
            if mapped.kind == .serviceUnavailable, !timedOut { self.droppedStaleConnection.withLockedValue { $0 = true } }
        }
        throw mapped
    }

    static func map(_ error: UnsafeMutablePointer<GError>, doing what: String, timedOut: Bool, timeout: Duration) -> SecretStoreError {
        let domain = error.pointee.domain
        let code = error.pointee.code
        let text = error.pointee.message.map { String(cString: $0) } ?? "no details"
        let remote: String? = {
            guard let name = g_dbus_error_get_remote_error(error) else { return nil }
            defer { g_free(name) }
            return String(cString: name)
        }()
        if timedOut {
            return unavailableError("the Secret Service did not answer within \(timeout) while trying to \(what)")
        }
        if (domain == authbroker_secret_error_quark() && code == Int32(SECRET_ERROR_IS_LOCKED.rawValue))
            || remote == "org.freedesktop.Secret.Error.IsLocked"
        {
            return lockedError(what)
        }
        if domain == authbroker_dbus_error_quark() {
            let unavailable: [GDBusError] = [
                G_DBUS_ERROR_SERVICE_UNKNOWN, G_DBUS_ERROR_NAME_HAS_NO_OWNER, G_DBUS_ERROR_NO_REPLY,
                G_DBUS_ERROR_DISCONNECTED, G_DBUS_ERROR_NO_SERVER, G_DBUS_ERROR_TIMEOUT, G_DBUS_ERROR_TIMED_OUT,
                G_DBUS_ERROR_FILE_NOT_FOUND, G_DBUS_ERROR_NO_NETWORK, G_DBUS_ERROR_SPAWN_EXEC_FAILED,
                G_DBUS_ERROR_SPAWN_CHILD_EXITED, G_DBUS_ERROR_UNKNOWN_OBJECT, G_DBUS_ERROR_UNKNOWN_METHOD,
            ]
            if unavailable.contains(where: { Int32($0.rawValue) == code }) || remote == "org.freedesktop.Secret.Error.NoSession" {
                return unavailableError(text)
            }
        }
        if domain == authbroker_io_error_quark() {
            // Connecting to the bus or the bus going away: the service is not there.
            return unavailableError(text)
        }
        return SecretStoreError(
            .serviceFailed,
            "The Secret Service failed to \(what): \(text). Check the keyring daemon's log (journalctl --user -u gnome-keyring-daemon), or set store = \"file\" in config.toml."
        )
    }

    static func lockedError(_ what: String) -> SecretStoreError {
        SecretStoreError(
            .locked,
            "The keyring is locked, so the broker cannot \(what). Unlock it (log in to the desktop, or run `gnome-keyring-daemon --unlock` and type the keyring password), then try again."
        )
    }

    static func unavailableError(_ why: String) -> SecretStoreError {
        SecretStoreError(
            .serviceUnavailable,
            "No Secret Service on the session bus (\(why)). Start gnome-keyring (or another Secret Service such as KeePassXC) in your session, or set store = \"file\" in config.toml.",
            cause: why
        )
    }

    private static func table(_ attributes: [String: String]) -> OpaquePointer {
        let table = authbroker_attributes_new()!  // g_hash_table_new_full aborts rather than return NULL
        for (name, value) in attributes { authbroker_attributes_insert(table, name, value) }
        return table
    }

    private static func dictionary(_ table: OpaquePointer?) -> [String: String] {
        guard let table else { return [:] }
        defer { g_hash_table_unref(table) }
        var result: [String: String] = [:]
        var iterator = GHashTableIter()
        g_hash_table_iter_init(&iterator, table)
        var key: gpointer?
        var value: gpointer?
        while g_hash_table_iter_next(&iterator, &key, &value) != 0 {
            guard let key, let value else { continue }
            result[String(cString: key.assumingMemoryBound(to: CChar.self))] =
                String(cString: value.assumingMemoryBound(to: CChar.self))
        }
        return result
    }
}
