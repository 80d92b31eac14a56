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
        try headerValue(for: credential, charsetUTF8: Self.charsetIsUTF8(challenge))
    }

    /// Whether a Basic challenge says `charset="UTF-8"` (the only charset RFC 7617 §2.1 allows).
    package static func charsetIsUTF8(_ challenge: AuthChallenge) -> Bool {
        challenge[parameter: "charset"].map(AuthListSyntax.lowercasedASCII) == "utf-8"
    }

    /// Largest `Authorization` value read back (a Basic credential of sane size fits easily).
    package static let maxHeaderValueBytes = 8192

    /// The credential in a `Basic` `Authorization` value, or nil when it is not one: another
    /// scheme, not base64, not UTF-8, no ':' separating user and password, control characters,
    /// or longer than `maxHeaderValueBytes`. Total: every input gives a credential or nil.
    package static func credential(fromHeaderValue value: String) -> PasswordCredential? {
        guard value.utf8.count <= Self.maxHeaderValueBytes else { return nil }
        let parts = value.split(separator: " ", maxSplits: 1, omittingEmptySubsequences: true)
        guard parts.count == 2, AuthListSyntax.lowercasedASCII(String(parts[0])) == "basic",
            let decoded = Data(base64Encoded: String(parts[1]).trimmingCharacters(in: .whitespaces)),
            let pair = String(data: decoded, encoding: .utf8), let colon = pair.firstIndex(of: ":")
        else { return nil }
        let credential = PasswordCredential(user: String(pair[..<colon]), password: String(pair[pair.index(after: colon)...]))
        guard !containsControl(credential.user), !containsControl(credential.password) else { return nil }
        return credential
    }

    /// C0 controls and DEL (RFC 5234 CTL).
    static func containsControl(_ text: String) -> Bool {
        text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
    }
}
