import AuthBrokerDaemon
import NIOConcurrencyHelpers

/// Identity keys in memory, for the import path without a keyring.
package final class MemoryKeyStore: IdentityKeyStore {
    private let keys = NIOLockedValueBox<[String: [UInt8]]>([:])

    package init() {}

    package func storeKey(name: String, material: [UInt8]) throws { self.keys.withLockedValue { $0[name] = material } }
    package func key(name: String) throws -> [UInt8]? { self.keys.withLockedValue { $0[name] } }
    package func removeKey(name: String) throws { _ = self.keys.withLockedValue { $0.removeValue(forKey: name) } }
}
