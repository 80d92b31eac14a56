import CPAM

/// A password, or another answer to a PAM prompt, in memory that is wiped when the last copy
/// of it goes away.
///
/// Copies of a `PAMSecret` share one buffer; the buffer is overwritten with zeros when the
/// last copy is released (or `wipe()` drops this copy's reference). Its description, debug
/// description and mirror never show the bytes.
package struct PAMSecret: Sendable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    private var storage: SecretStorage

    /// Copies `bytes` into wiped-on-release storage, then zeroes `bytes` in place.
    package init(wiping bytes: inout [UInt8]) {
        self.storage = SecretStorage(copying: bytes)
        bytes.withUnsafeMutableBytes { cpam_wipe($0.baseAddress, $0.count) }
        bytes.removeAll()
    }

    /// Copies the UTF-8 of `text`.
    /// - Warning: a `String` cannot be wiped; prefer ``init(wiping:)`` for real passwords.
    package init(_ text: String) {
        self.storage = SecretStorage(copying: Array(text.utf8))
    }

    /// The number of bytes.
    package var count: Int { self.storage.count }

    /// Whether the secret contains a NUL byte, which a C string (and so PAM) cannot carry.
    package var containsNUL: Bool { self.withUnsafeBytes { $0.contains(0) } }

    /// Calls `body` with the bytes. Do not let them escape.
    package func withUnsafeBytes<Result>(_ body: (UnsafeRawBufferPointer) throws -> Result) rethrows -> Result {
        try body(UnsafeRawBufferPointer(rebasing: self.storage.bytes[0..<self.storage.count]))
    }

    /// Drops this copy's reference to the bytes; they are wiped once no copy refers to them.
    package mutating func wipe() {
        self.storage = SecretStorage(copying: [])
    }

    package var description: String { "PAMSecret(redacted)" }
    package var debugDescription: String { "PAMSecret(redacted)" }
    package var customMirror: Mirror { Mirror(self, children: []) }
}

/// The buffer behind a `PAMSecret`: written once in `init`, zeroed and freed in `deinit`.
// The bytes are written only in init and deinit, never in between, so sharing is race-free.
private final class SecretStorage: @unchecked Sendable {  // written only in init and deinit (see above)
    let bytes: UnsafeMutableRawBufferPointer

    let count: Int

    init(copying source: [UInt8]) {
        let bytes = UnsafeMutableRawBufferPointer.allocate(byteCount: max(source.count, 1), alignment: 1)
        bytes.initializeMemory(as: UInt8.self, repeating: 0)
        source.withUnsafeBytes { bytes.copyMemory(from: $0) }
        self.bytes = bytes
        self.count = source.count
    }

    deinit {
        cpam_wipe(self.bytes.baseAddress, self.bytes.count)
        self.bytes.deallocate()
    }
}

/// One message of a PAM conversation (pam_conv(3)).
package struct PAMPrompt: Sendable, Hashable, CustomStringConvertible {
    package enum Style: String, Sendable, Hashable {
        /// `PAM_PROMPT_ECHO_OFF`: ask for an answer without echoing it (a password).
        case secret
        /// `PAM_PROMPT_ECHO_ON`: ask for an answer that may be shown (a user name, a code).
        case visible
        /// `PAM_ERROR_MSG`: show an error; no answer.
        case error
        /// `PAM_TEXT_INFO`: show information; no answer.
        case info
    }

    package var style: Style
    /// The module's text, e.g. "Password: ". Not secret.
    package var text: String

    package init(style: Style, text: String) {
        self.style = style
        self.text = text
    }

    /// Whether PAM needs an answer (`.answer`) rather than an acknowledgement.
    package var expectsAnswer: Bool { self.style == .secret || self.style == .visible }

    package var description: String { "\(self.style.rawValue): \(self.text)" }
}

/// A responder's reply to one `PAMPrompt`.
package enum PAMResponse: Sendable {
    /// The answer to a `.secret` or `.visible` prompt. Ignored (and wiped) for messages.
    case answer(PAMSecret)
    /// For `.error` and `.info` messages: shown. For a prompt, a conversation error.
    case acknowledged
    /// The user declined; the transaction ends as `cancelled`.
    case cancel
}

/// Answers the prompts of one PAM transaction, e.g. by relaying them to a remote CLI.
///
/// `respond(to:)` is called once per message, in order, one at a time, from a task (not from
/// the PAM thread). It may suspend as long as it likes: the authenticator's prompt timeout
/// bounds the wait, and the task is cancelled when the timeout passes or the caller is
/// cancelled, so a responder should return promptly once cancelled.
package protocol PAMResponder: Sendable {
    func respond(to prompt: PAMPrompt) async -> PAMResponse
}

/// A responder that answers every secret prompt with one password and acknowledges messages;
/// a visible prompt (something other than a password) is declined.
package struct PAMPasswordResponder: PAMResponder {
    private let password: PAMSecret

    package init(password: PAMSecret) {
        self.password = password
    }

    package func respond(to prompt: PAMPrompt) async -> PAMResponse {
        switch prompt.style {
        case .secret: .answer(self.password)
        case .visible: .cancel
        case .error, .info: .acknowledged
        }
    }
}

/// A responder made from a closure.
package struct PAMClosureResponder: PAMResponder {
    private let body: @Sendable (PAMPrompt) async -> PAMResponse

    package init(_ body: @escaping @Sendable (PAMPrompt) async -> PAMResponse) {
        self.body = body
    }

    package func respond(to prompt: PAMPrompt) async -> PAMResponse {
        await self.body(prompt)
    }
}
