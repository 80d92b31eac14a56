import Foundation
import Logging

/// The `store` setting: which backend keeps the secrets.
package enum SecretStoreChoice: String, Sendable, CaseIterable {
    /// The Secret Service when one answers on the session bus, else the encrypted file.
    case auto
    case secretService = "secret-service"
    case file
}

/// The store the broker will use, and why, in words for the log and `authbrokerctl status`.
package struct SelectedSecretStore: Sendable {
    package let store: any SecretStore
    package let reason: String
}

/// Picks the secret store for `choice`.
///
/// `auto` asks the Secret Service to answer (connect, open a session, run one search) within
/// `probeTimeout`, and falls back to the encrypted file when it does not. An explicit choice is
/// used as it is, even when its backend is unavailable now, so that a keyring started later
/// works without a restart; the reason then says what is wrong.
///
/// - Warning: blocks for up to `probeTimeout`; call it off the event loops.
package func selectSecretStore(
    _ choice: SecretStoreChoice,
    filePath: String,
    keyFilePath: String,
    environment: [String: String] = ProcessInfo.processInfo.environment,
    probeTimeout: Duration = .seconds(2),
    operationTimeout: Duration = .seconds(10),
    logger: Logger? = nil
) -> SelectedSecretStore {
    let file = EncryptedFileSecretStore(path: filePath, keyFilePath: keyFilePath, environment: environment)
    let fileDescription = "the encrypted file \(filePath) (key: \(file.keySourceDescription))"
    let selected: SelectedSecretStore
    switch choice {
    case .file:
        selected = SelectedSecretStore(store: file, reason: "store = \"file\": using \(fileDescription)")
    case .secretService:
        let service = SecretServiceStore(timeout: operationTimeout, environment: environment)
        let status: String
        do {
            try SecretServiceStore(timeout: probeTimeout, environment: environment).probe()
            status = "the Secret Service answered on the session bus"
        } catch {
            status = "the Secret Service does not answer now (\(error.cause)), so secret operations fail until it does"
        }
        selected = SelectedSecretStore(store: service, reason: "store = \"secret-service\": \(status)")
    case .auto:
        do {
            try SecretServiceStore(timeout: probeTimeout, environment: environment).probe()
            selected = SelectedSecretStore(
                store: SecretServiceStore(timeout: operationTimeout, environment: environment),
                reason: "auto: the Secret Service answered on the session bus"
            )
        } catch {
            selected = SelectedSecretStore(
                store: file,
                reason: "auto: no Secret Service on the session bus (\(error.cause)); using \(fileDescription)"
            )
        }
    }
    logger?.info("secret store selected", metadata: ["backend": "\(selected.store.backendName)", "reason": "\(selected.reason)"])
    return selected
}
