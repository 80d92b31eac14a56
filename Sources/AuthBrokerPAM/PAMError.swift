/// Why a PAM re-authentication did not succeed, and what the user can do about it.
///
/// Equality compares the code only, so that messages can be reworded without breaking callers
/// (the shape of swift-certificates' `CertificateError`). No message ever contains an answer
/// given to a prompt.
package struct PAMError: Error, CustomStringConvertible, Equatable {
    package enum Code: String, CaseIterable {
        case authenticationFailed = "authentication_failed"
        case accountUnavailable = "account_unavailable"
        case userUnknown = "user_unknown"
        case timedOut = "timed_out"
        case cancelled
        case conversationFailed = "conversation_failed"
        case systemError = "system_error"
    }

    /// The code as a closed set, for callers that must handle each (the daemon maps each to a
    /// `BrokerErrorCode`).
    package let kind: Code
    /// A stable snake_case code: the control API and the CLI map it to statuses and exit codes.
    package var code: String { self.kind.rawValue }
    /// What happened and what to do.
    package let message: String
    /// The PAM status that ended the transaction, when PAM produced one (for logs).
    package let pamStatus: Int32?

    init(_ code: Code, _ message: String, pamStatus: Int32? = nil) {
        self.kind = code
        self.message = message
        self.pamStatus = pamStatus
    }

    package var description: String { self.message }

    package static func == (lhs: PAMError, rhs: PAMError) -> Bool {
        lhs.kind == rhs.kind
    }

    // One value per code, for comparisons (`outcome.error == .timedOut`); their messages are empty.

    /// The password (or another answer) was wrong.
    package static let authenticationFailed = PAMError(.authenticationFailed, "")
    /// The account may not be used now (expired, locked, password change required).
    package static let accountUnavailable = PAMError(.accountUnavailable, "")
    /// PAM does not know the user.
    package static let userUnknown = PAMError(.userUnknown, "")
    /// A prompt was not answered before its deadline.
    package static let timedOut = PAMError(.timedOut, "")
    /// The caller's task was cancelled, or the responder cancelled a prompt.
    package static let cancelled = PAMError(.cancelled, "")
    /// The responder gave an answer PAM cannot use.
    package static let conversationFailed = PAMError(.conversationFailed, "")
    /// PAM itself could not run (missing service file or module, unreadable shadow file, …).
    package static let systemError = PAMError(.systemError, "")
}

/// How a PAM re-authentication ended.
package enum PAMOutcome: Sendable, Equatable, CustomStringConvertible {
    /// `pam_authenticate` and `pam_acct_mgmt` both succeeded.
    case success
    case failure(PAMError)

    package var isSuccess: Bool { self == .success }

    /// The error, or nil on success.
    package var error: PAMError? {
        if case .failure(let error) = self { return error }
        return nil
    }

    /// `success`, or the error's code.
    package var code: String { self.error?.code ?? "success" }

    package var description: String {
        switch self {
        case .success: "success"
        case .failure(let error): "\(error.code): \(error.message)"
        }
    }
}
