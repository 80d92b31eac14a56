/// Why a secret-store operation failed, and what the user can do about it.
///
/// Equality compares the code only, so that messages can be reworded without breaking callers
/// (the shape of swift-certificates' `CertificateError`).
///
/// - Warning: a message never contains secret bytes; every message is built from paths,
///   attribute names, lengths and library error texts only.
package struct SecretStoreError: Error, CustomStringConvertible, Equatable {
    package enum Code: String, CaseIterable {
        /// The Secret Service keyring (or the item) is locked.
        case locked
        /// No Secret Service answers (no session bus, no keyring daemon, a timeout).
        case serviceUnavailable = "service_unavailable"
        /// The encrypted file is damaged, truncated or not ours.
        case corrupt
        /// The key that encrypts the file is missing.
        case keyMissing = "key_missing"
        /// The key exists but is not a usable key (wrong length), or does not open the file.
        case keyInvalid = "key_invalid"
        /// A file or directory has permissions or an owner that would expose secrets.
        case permission
        /// Reading or writing a file failed.
        case io
        /// Another writer held the lock for longer than the store waits.
        case busy
        /// The caller's attributes, label or secret are not acceptable.
        case invalidInput = "invalid_input"
        /// The Secret Service answered with an error the broker does not know.
        case serviceFailed = "service_failed"
    }

    /// The code as a closed set, for callers that must handle each (the daemon maps each to a
    /// `BrokerErrorCode`).
    package let kind: Code
    /// A stable snake_case code: the control API and the CLI map it to statuses and exit codes.
    package var code: String { self.kind.rawValue }
    /// What happened and what to do.
    package let message: String
    /// What happened only, without the advice (for a sentence that gives its own).
    package let cause: String

    init(_ code: Code, _ message: String, cause: String? = nil) {
        self.kind = code
        self.message = message
        self.cause = cause ?? message
    }

    package var description: String { self.message }

    package static func == (lhs: SecretStoreError, rhs: SecretStoreError) -> Bool {
        lhs.kind == rhs.kind
    }

    // Codes for callers that switch on them (and for tests).
    package static let locked = SecretStoreError(.locked, "locked")
    package static let serviceUnavailable = SecretStoreError(.serviceUnavailable, "service unavailable")
    package static let corrupt = SecretStoreError(.corrupt, "corrupt")
    package static let keyMissing = SecretStoreError(.keyMissing, "key missing")
    package static let keyInvalid = SecretStoreError(.keyInvalid, "key invalid")
    package static let permission = SecretStoreError(.permission, "permission")
    package static let io = SecretStoreError(.io, "io")
    package static let busy = SecretStoreError(.busy, "busy")
    package static let invalidInput = SecretStoreError(.invalidInput, "invalid input")
    package static let serviceFailed = SecretStoreError(.serviceFailed, "service failed")
}
