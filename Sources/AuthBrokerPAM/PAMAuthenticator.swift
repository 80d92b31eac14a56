import CPAM
import Dispatch
import Foundation
import Logging
import NIOConcurrencyHelpers

/// Re-authenticates a user through PAM (`pam_authenticate`, then `pam_acct_mgmt`).
///
/// Each transaction runs on a dedicated thread of its own, never on the Swift cooperative
/// pool or an event loop, because PAM modules block (they read files, run `unix_chkpwd`,
/// sleep after a failure). Each prompt is handed to the caller's `PAMResponder` in a task,
/// and the PAM thread waits for the answer until the prompt timeout passes.
///
/// The daemon runs as its user and authenticates that same user; pam_unix checks the user's
/// own password through its setgid helper `unix_chkpwd`.
package struct PAMAuthenticator: Sendable {
    package struct Configuration: Sendable {
        /// The PAM service: `/etc/pam.d/<service>` (or `<configDirectory>/<service>`).
        package var service: String
        /// A directory to read service files from instead of `/etc/pam.d`
        /// (`pam_start_confdir`, Linux-PAM ≥ 1.4). For tests.
        package var configDirectory: String?
        /// How long the responder has to answer each prompt.
        package var promptTimeout: Duration

        package init(service: String = "authbroker", configDirectory: String? = nil, promptTimeout: Duration = .seconds(60)) {
            self.service = service
            self.configDirectory = configDirectory
            self.promptTimeout = promptTimeout
        }
    }

    package let configuration: Configuration
    private let logger: Logger

    package init(configuration: Configuration = Configuration(), logger: Logger = Logger(label: "authbroker.pam")) {
        self.configuration = configuration
        self.logger = logger
    }

    /// Runs one PAM transaction for `user`, answering its prompts with `responder`.
    ///
    /// Cancelling the calling task ends the transaction: a prompt being waited for is
    /// abandoned (its responder task is cancelled) and the result is `cancelled`, once PAM
    /// has returned and `pam_end` has run. A cancellation that comes after the answer was
    /// given still yields `cancelled`, never `success` (fail closed). Never throws; every
    /// failure is a `PAMOutcome.failure` whose message names no answer.
    package func authenticate(user: String, responder: some PAMResponder) async -> PAMOutcome {
        let transaction = PAMTransaction(user: user, configuration: self.configuration, responder: responder)
        let outcome = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<PAMOutcome, Never>) in
                transaction.start(continuation)
            }
        } onCancel: {
            transaction.cancel()
        }
        switch outcome {
        case .success:
            self.logger.info(
                "PAM re-authentication succeeded",
                metadata: ["user": "\(user)", "service": "\(self.configuration.service)"]
            )
        case .failure(let error):
            var metadata: Logger.Metadata = ["user": "\(user)", "service": "\(self.configuration.service)", "code": "\(error.code)"]
            if let status = error.pamStatus { metadata["pam_status"] = "\(status)" }
            self.logger.notice("PAM re-authentication failed: \(error.message)", metadata: metadata)
        }
        return outcome
    }

    /// The name of the user this process runs as (`getpwuid(getuid())`), or nil if the
    /// password database has no entry for it.
    package static func currentUserName() -> String? {
        var entry = passwd()
        var result: UnsafeMutablePointer<passwd>?
        var buffer = [CChar](repeating: 0, count: 16_384)
        let status = getpwuid_r(getuid(), &entry, &buffer, buffer.count, &result)
        guard status == 0, result != nil, let name = entry.pw_name else { return nil }
        return String(cString: name)
    }
}

/// The state shared by one transaction's PAM thread, its prompt tasks and its caller.
final class PAMTransaction: Sendable {
    private enum Pending {
        case idle
        case waiting(id: UInt64, task: Task<Void, Never>?)
        case answered(id: UInt64, PAMResponse)
    }

    private struct State {
        var cancelled = false
        /// Why the conversation failed, when it was our side that failed it.
        var conversationFailure: PAMError?
        var nextPromptID: UInt64 = 0
        var pending = Pending.idle
        var continuation: CheckedContinuation<PAMOutcome, Never>?
    }

    private enum Wait {
        case response(PAMResponse)
        case timedOut
        case cancelled
    }

    let user: String
    let configuration: PAMAuthenticator.Configuration
    let responder: any PAMResponder
    private let state = NIOLockedValueBox(State())
    /// Signalled when an answer arrives or the transaction is cancelled. A stale signal only
    /// costs the PAM thread one more look at `state`.
    private let wakeup = DispatchSemaphore(value: 0)

    init(user: String, configuration: PAMAuthenticator.Configuration, responder: any PAMResponder) {
        self.user = user
        self.configuration = configuration
        self.responder = responder
    }

    /// Starts the PAM thread; `continuation` is resumed exactly once, when it ends.
    func start(_ continuation: CheckedContinuation<PAMOutcome, Never>) {
        self.state.withLockedValue { $0.continuation = continuation }
        let thread = Thread { [self] in
            let outcome = self.run()
            let continuation = self.state.withLockedValue { state in
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume(returning: outcome)
        }
        thread.name = "authbroker-pam"
        thread.start()
    }

    /// Ends the transaction as `cancelled`: a prompt being waited for is abandoned.
    func cancel() {
        let task = self.state.withLockedValue { state -> Task<Void, Never>? in
            state.cancelled = true
            if case .waiting(_, let task) = state.pending { return task }
            return nil
        }
        task?.cancel()
        self.wakeup.signal()
    }

    // MARK: - On the PAM thread

    private func run() -> PAMOutcome {
        if self.state.withLockedValue({ $0.cancelled }) {
            return .failure(Self.cancelledError)
        }
        // On the heap for the whole transaction: pam_start(3) keeps what it is given, and an
        // inout pointer (`&value`) is only valid during the call.
        let conversation = UnsafeMutablePointer<pam_conv>.allocate(capacity: 1)
        conversation.initialize(
            to: pam_conv(
                conv: pamConversation,
                // `self` outlives the transaction: the thread's closure holds it until run() returns.
                appdata_ptr: Unmanaged.passUnretained(self).toOpaque()
            )
        )
        defer { conversation.deallocate() }
        var handle: OpaquePointer?
        let started: Int32
        if let directory = self.configuration.configDirectory {
            started = pam_start_confdir(self.configuration.service, self.user, conversation, directory, &handle)
        } else {
            started = pam_start(self.configuration.service, self.user, conversation, &handle)
        }
        guard started == PAM_SUCCESS, let handle else {
            return .failure(
                PAMError(
                    .systemError,
                    "PAM could not start service '\(self.configuration.service)' (\(Self.statusName(started, nil))). "
                        + "Check that \(self.serviceFile) exists (see etc/pam.d/authbroker) and that libpam is installed.",
                    pamStatus: started
                )
            )
        }
        // A user with an empty password must not pass re-authentication.
        var status = pam_authenticate(handle, Int32(PAM_DISALLOW_NULL_AUTHTOK))
        let stage: Stage
        if status == PAM_SUCCESS {
            status = pam_acct_mgmt(handle, Int32(PAM_DISALLOW_NULL_AUTHTOK))
            stage = .account
        } else {
            stage = .authentication
        }
        let statusText = Self.statusName(status, handle)
        pam_end(handle, status)

        let (cancelled, conversationFailure) = self.state.withLockedValue { ($0.cancelled, $0.conversationFailure) }
        if cancelled {
            return .failure(Self.cancelledError)
        }
        if status == PAM_SUCCESS {
            return .success
        }
        if let conversationFailure {
            return .failure(conversationFailure)
        }
        return .failure(self.error(for: status, stage: stage, statusText: statusText))
    }

    /// The service file PAM reads, for messages.
    private var serviceFile: String {
        (self.configuration.configDirectory ?? "/etc/pam.d") + "/" + self.configuration.service
    }

    private enum Stage {
        case authentication
        case account
    }

    private static let cancelledError = PAMError(
        .cancelled, "Authentication was cancelled before it finished. Run the command again to retry."
    )

    private func error(for status: Int32, stage: Stage, statusText: String) -> PAMError {
        let user = self.user
        switch (status, stage) {
        case (PAM_USER_UNKNOWN, _):
            return PAMError(
                .userUnknown,
                "PAM does not know the user '\(user)' (\(statusText)). Check the account exists in the password database.",
                pamStatus: status
            )
        // pam_acct_mgmt(3) may refuse with any of these (pam_deny says PAM_AUTH_ERR): the
        // password was accepted, the account was not.
        case (PAM_AUTH_ERR, .account), (PAM_PERM_DENIED, .account), (PAM_ACCT_EXPIRED, .account),
            (PAM_NEW_AUTHTOK_REQD, .account), (PAM_AUTHTOK_EXPIRED, .account):
            return PAMError(
                .accountUnavailable,
                "The password was accepted but the account '\(user)' may not be used now (\(statusText)): "
                    + "it may be expired or locked, or its password must be changed. Change the password or ask an administrator.",
                pamStatus: status
            )
        case (PAM_ACCT_EXPIRED, .authentication), (PAM_NEW_AUTHTOK_REQD, .authentication), (PAM_AUTHTOK_EXPIRED, .authentication):
            return PAMError(
                .accountUnavailable,
                "The account '\(user)' may not be used now (\(statusText)): it may be expired or locked, or its password "
                    + "must be changed. Change the password or ask an administrator.",
                pamStatus: status
            )
        case (PAM_AUTH_ERR, .authentication), (PAM_MAXTRIES, _), (PAM_CRED_INSUFFICIENT, _), (PAM_PERM_DENIED, .authentication):
            return PAMError(
                .authenticationFailed,
                "Authentication failed for '\(user)': the password was not accepted (\(statusText)). Check it and try again.",
                pamStatus: status
            )
        case (PAM_CONV_ERR, _):
            return PAMError(
                .conversationFailed,
                "The PAM conversation failed (\(statusText)). Run the command again from a terminal that can answer prompts.",
                pamStatus: status
            )
        case (PAM_AUTHINFO_UNAVAIL, _):
            return PAMError(
                .systemError,
                "PAM could not check the password for '\(user)' (\(statusText)). "
                    + "Check that /usr/sbin/unix_chkpwd is installed setgid shadow and that the PAM configuration for "
                    + "'\(self.configuration.service)' is valid; the system log has details.",
                pamStatus: status
            )
        default:
            return PAMError(
                .systemError,
                "PAM failed for '\(user)' with \(statusText). Check \(self.serviceFile) "
                    + "and the system log (journalctl) for details.",
                pamStatus: status
            )
        }
    }

    private static func statusName(_ status: Int32, _ handle: OpaquePointer?) -> String {
        if let text = pam_strerror(handle, status) {
            return "PAM status \(status): \(String(cString: text))"
        }
        return "PAM status \(status)"
    }

    /// Answers one conversation call (pam_conv(3)): every message in order, or none at all.
    fileprivate func converse(
        count: Int32,
        messages: UnsafeMutablePointer<UnsafePointer<pam_message>?>,
        responses: UnsafeMutablePointer<UnsafeMutablePointer<pam_response>?>
    ) -> Int32 {
        guard let replies = cpam_allocate_responses(count) else { return PAM_BUF_ERR }
        func fail(_ status: Int32, _ error: PAMError?) -> Int32 {
            cpam_free_responses(replies, count)
            if let error {
                self.state.withLockedValue { state in
                    if state.conversationFailure == nil { state.conversationFailure = error }
                }
            }
            return status
        }
        for index in 0..<count {
            guard let message = cpam_message_at(messages, index) else { return fail(PAM_CONV_ERR, nil) }
            let text = message.pointee.msg.map { String(cString: $0) } ?? ""
            let style: PAMPrompt.Style
            switch message.pointee.msg_style {
            case PAM_PROMPT_ECHO_OFF: style = .secret
            case PAM_PROMPT_ECHO_ON: style = .visible
            case PAM_ERROR_MSG: style = .error
            case PAM_TEXT_INFO: style = .info
            default:
                return fail(
                    PAM_CONV_ERR,
                    PAMError(
                        .conversationFailed,
                        "A PAM module sent a message of unknown style \(message.pointee.msg_style). "
                            + "Check the modules in \(self.serviceFile)."
                    )
                )
            }
            let prompt = PAMPrompt(style: style, text: text)
            switch self.ask(prompt) {
            case .cancelled:
                return fail(PAM_CONV_ERR, Self.cancelledError)
            case .timedOut:
                return fail(
                    PAM_CONV_ERR,
                    PAMError(
                        .timedOut,
                        "No answer to the PAM prompt '\(text)' came within \(self.configuration.promptTimeout). "
                            + "Run the command again and answer the prompt sooner."
                    )
                )
            case .response(.cancel):
                return fail(PAM_CONV_ERR, Self.cancelledError)
            case .response(.acknowledged):
                if prompt.expectsAnswer {
                    return fail(
                        PAM_CONV_ERR,
                        PAMError(
                            .conversationFailed,
                            "The PAM prompt '\(text)' needs an answer, but none was given. Run the command again and answer it."
                        )
                    )
                }
            case .response(.answer(var secret)):
                defer { secret.wipe() }
                guard prompt.expectsAnswer else { continue }
                if secret.containsNUL {
                    return fail(
                        PAM_CONV_ERR,
                        PAMError(
                            .conversationFailed,
                            "The answer to the PAM prompt '\(text)' contains a NUL byte, which PAM cannot take. Type it again."
                        )
                    )
                }
                let copy = secret.withUnsafeBytes { bytes in
                    cpam_copy_response(bytes.baseAddress?.assumingMemoryBound(to: UInt8.self), bytes.count)
                }
                guard let copy else { return fail(PAM_BUF_ERR, nil) }
                replies[Int(index)].resp = copy
                replies[Int(index)].resp_retcode = 0
            }
        }
        responses.pointee = replies
        return PAM_SUCCESS
    }

    /// Hands `prompt` to the responder in a task and waits for its answer, the prompt
    /// timeout, or cancellation, whichever comes first.
    private func ask(_ prompt: PAMPrompt) -> Wait {
        let deadline = DispatchTime.now() + Self.dispatchInterval(self.configuration.promptTimeout)
        let id = self.state.withLockedValue { state -> UInt64? in
            if state.cancelled { return nil }
            state.nextPromptID += 1
            state.pending = .waiting(id: state.nextPromptID, task: nil)
            return state.nextPromptID
        }
        guard let id else { return .cancelled }
        let responder = self.responder
        let task = Task { [self] in
            let response = await responder.respond(to: prompt)
            self.deliver(response, for: id)
        }
        self.state.withLockedValue { state in
            if case .waiting(id, nil) = state.pending { state.pending = .waiting(id: id, task: task) }
        }
        while true {
            let timedOut = self.wakeup.wait(timeout: deadline) == .timedOut
            let result = self.state.withLockedValue { state -> Wait? in
                if state.cancelled {
                    state.pending = .idle
                    return .cancelled
                }
                if case .answered(id, let response) = state.pending {
                    state.pending = .idle
                    return .response(response)
                }
                if timedOut {
                    state.pending = .idle
                    return .timedOut
                }
                return nil
            }
            if let result {
                if case .response = result {} else { task.cancel() }
                return result
            }
        }
    }

    /// Called by a prompt's task with the responder's answer. A late answer (after a timeout
    /// or cancellation) is dropped.
    private func deliver(_ response: PAMResponse, for id: UInt64) {
        let accepted = self.state.withLockedValue { state -> Bool in
            guard !state.cancelled, case .waiting(id, _) = state.pending else { return false }
            state.pending = .answered(id: id, response)
            return true
        }
        if accepted { self.wakeup.signal() }
    }

    private static func dispatchInterval(_ duration: Duration) -> DispatchTimeInterval {
        let (seconds, attoseconds) = duration.components
        let nanoseconds = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        guard !nanoseconds.overflow, seconds >= 0 else { return seconds < 0 ? .nanoseconds(0) : .never }
        let total = nanoseconds.partialValue.addingReportingOverflow(attoseconds / 1_000_000_000)
        return total.overflow ? .never : .nanoseconds(Int(total.partialValue))
    }
}

/// The conversation function given to PAM: no captures, the transaction through `appdata_ptr`.
private func pamConversation(
    count: Int32,
    messages: UnsafeMutablePointer<UnsafePointer<pam_message>?>?,
    responses: UnsafeMutablePointer<UnsafeMutablePointer<pam_response>?>?,
    appdata: UnsafeMutableRawPointer?
) -> Int32 {
    guard let messages, let responses, let appdata, count > 0, count <= PAM_MAX_NUM_MSG else { return PAM_CONV_ERR }
    let transaction = Unmanaged<PAMTransaction>.fromOpaque(appdata).takeUnretainedValue()
    return transaction.converse(count: count, messages: messages, responses: responses)
}
