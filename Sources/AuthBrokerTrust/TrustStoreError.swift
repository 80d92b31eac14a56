/// Why a trust-store operation failed, and what the user can do about it.
///
/// Equality compares the code only, so that messages can be reworded without breaking callers
/// (the shape of swift-certificates' `CertificateError`).
package struct TrustStoreError: Error, CustomStringConvertible, Equatable {
    package enum Code: String, CaseIterable {
        case notFound = "not_found"
        case ambiguous
        case invalidPrefix = "invalid_prefix"
        case invalidCertificate = "invalid_certificate"
        case notACertificate = "not_a_certificate"
        case inputTooLarge = "input_too_large"
        case invalidPin = "invalid_pin"
        case corruptFile = "corrupt_file"
        /// The file changed outside the broker and cannot be read now: nothing is written over it.
        case changedOnDisk = "changed_on_disk"
        case ioError = "io_error"
        case invalidIdentityName = "invalid_identity_name"
        case identityExists = "identity_exists"
        case unknownIdentity = "unknown_identity"
        case identityNotForHost = "identity_not_for_host"
        case identityExpired = "identity_expired"
        case invalidIdentity = "invalid_identity"
        case invalidHost = "invalid_host"
        case invalidFingerprint = "invalid_fingerprint"
    }

    /// The code as a closed set, for callers that must handle each (the daemon maps each to a
    /// `BrokerErrorCode`).
    package let kind: Code
    /// A stable snake_case code: the control API and the CLI map it to statuses and exit codes.
    package var code: String { self.kind.rawValue }
    /// What happened and what to do.
    package let message: String

    init(_ code: Code, _ message: String) {
        self.kind = code
        self.message = message
    }

    package var description: String { self.message }

    package static func == (lhs: TrustStoreError, rhs: TrustStoreError) -> Bool {
        lhs.kind == rhs.kind
    }
}
