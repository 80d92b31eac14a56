/// Why an authentication header could not be used or produced, and what to do about it.
///
/// One error type for the module, in the shape of `RequestTargetError`: a stable `code` for
/// scripts, logs and the problem+json mapping, and a `message` for people. Equal when the codes
/// are equal, so messages can be reworded without breaking callers.
package struct HTTPAuthError: Error, Equatable, CustomStringConvertible {
    private enum Code: String {
        case notDigest = "not_digest"
        case missingParameter = "missing_parameter"
        case unsupportedAlgorithm = "unsupported_algorithm"
        case unsupportedQOP = "unsupported_qop"
        case sessionWithoutQOP = "session_without_qop"
        case bodyRequired = "body_required"
        case invalidUserID = "invalid_user_id"
        case invalidCharacter = "invalid_character"
        case nonceCountExhausted = "nonce_count_exhausted"
    }

    private let kind: Code
    /// What happened and what to do about it.
    package let message: String

    /// `not_digest`, `missing_parameter`, `unsupported_algorithm`, `unsupported_qop`,
    /// `session_without_qop`, `body_required`, `invalid_user_id`, `invalid_character`,
    /// `nonce_count_exhausted`.
    package var code: String { kind.rawValue }

    package var description: String { "\(code): \(message)" }

    private init(_ kind: Code, _ message: String) {
        self.kind = kind
        self.message = message
    }

    package static func == (lhs: Self, rhs: Self) -> Bool { lhs.kind == rhs.kind }

    static func notDigest(_ scheme: String) -> Self {
        Self(.notDigest, "The challenge uses the `\(shown(scheme))` scheme, not Digest; only a Digest challenge can be answered with a Digest response.")
    }

    static func missingParameter(_ name: String) -> Self {
        Self(
            .missingParameter,
            "The server's Digest challenge has no usable `\(name)` parameter (RFC 7616 §3.3); it cannot be answered. The server is misconfigured; use Basic if it also offers it."
        )
    }

    static func unsupportedAlgorithm(_ value: String) -> Self {
        Self(
            .unsupportedAlgorithm,
            "The Digest algorithm `\(shown(value))` is not supported; the broker answers MD5, SHA-256 and SHA-512-256 and their -sess forms (RFC 7616 §3.3)."
        )
    }

    static func unsupportedQOP(_ value: String) -> Self {
        Self(
            .unsupportedQOP,
            "The Digest challenge offers qop `\(shown(value))`, none of which the broker knows; it answers `auth` and `auth-int` (RFC 7616 §3.3)."
        )
    }

    static func sessionWithoutQOP(_ algorithm: String) -> Self {
        Self(
            .sessionWithoutQOP,
            "The Digest challenge asks for `\(algorithm)` but offers no qop: a session algorithm needs a client nonce, which only exists with qop (RFC 7616 §3.4.2). The server is misconfigured."
        )
    }

    static func bodyRequired() -> Self {
        Self(
            .bodyRequired,
            "The server only accepts qop=auth-int, which covers the request body, but the body is not available (it is streamed). Send the request with a body the broker may buffer, or pass its hash."
        )
    }

    static func invalidUserID() -> Self {
        Self(
            .invalidUserID,
            "The user name contains ':' or a control character, which Basic authentication cannot carry (RFC 7617 §2). Use a user name without them."
        )
    }

    static func invalidCharacter(_ what: String) -> Self {
        Self(
            .invalidCharacter,
            "The \(what) contains a control character or a character that cannot appear in an authorization header; remove it."
        )
    }

    static func nonceCountExhausted() -> Self {
        Self(
            .nonceCountExhausted,
            "The nonce count for this nonce reached its 8-hex-digit maximum; drop the session and let the server send a fresh challenge."
        )
    }

    /// Peer text quoted in a message: printable ASCII kept, the rest as `\xNN`, cut at 60 bytes.
    private static func shown(_ text: String) -> String {
        var out = ""
        for byte in text.utf8.prefix(60) {
            if (0x20..<0x7F).contains(byte), byte != UInt8(ascii: "`") {
                out.unicodeScalars.append(Unicode.Scalar(byte))
            } else {
                let digits = Array("0123456789ABCDEF")
                out += "\\x" + String([digits[Int(byte >> 4)], digits[Int(byte & 0xF)]])
            }
        }
        return text.utf8.count > 60 ? out + "…" : out
    }
}
