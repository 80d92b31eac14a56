import Foundation

/// Basic authentication (RFC 7617).
///
/// - Warning: Basic sends the password itself, only base64-encoded: over `http` anyone on the
///   path reads it. Whether the broker may answer a Basic challenge from a plain-HTTP origin is
///   the caller's decision; `ChallengeSelection.preferred` already ranks any Digest above Basic.
package enum BasicAuthorization {
    /// The `Authorization` (or `Proxy-Authorization`) value: `Basic base64(user ":" password)`.
    ///
    /// Always UTF-8: RFC 7617 §2.1 defines no other charset, and servers that announce none
    /// mostly expect UTF-8 today. With `charsetUTF8` (the challenge said `charset="UTF-8"`)
    /// both parts are first normalised to NFC, as §2.1 requires.
    ///
    /// - Throws: `invalid_user_id` when the user name contains ':' (the server would split the
    ///   pair there, RFC 7617 §2) or a control character; `invalid_character` when the password
    ///   contains a control character (RFC 7617 §2 excludes them).
    package static func headerValue(for credential: PasswordCredential, charsetUTF8: Bool = true) throws(HTTPAuthError) -> String {
        let credential = charsetUTF8 ? credential.normalized : credential
        guard !credential.user.contains(":"), !containsControl(credential.user) else {
            throw .invalidUserID()
        }
        guard !containsControl(credential.password) else { throw .invalidCharacter("password") }
        let pair = Array((credential.user + ":" + credential.password).utf8)
        return "Basic " + Data(pair).base64EncodedString()
    }

    /// The value for the challenge the broker picked: `charset` is honoured when present.
    package static func headerValue(for credential: PasswordCredential, challenge: AuthChallenge) throws(HTTPAuthError) -> String {
        let charset = challenge[parameter: "charset"].map(AuthListSyntax.lowercasedASCII)
        return try headerValue(for: credential, charsetUTF8: charset == "utf-8")
    }

    /// C0 controls and DEL (RFC 5234 CTL).
    static func containsControl(_ text: String) -> Bool {
        text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
    }
}
