import Foundation

/// A user name and password for Basic or Digest.
///
/// The password never appears in `description`, `debugDescription`, a mirror or string
/// interpolation, so that logging a credential by mistake leaks nothing but the user name.
package struct PasswordCredential: Sendable, Hashable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    package var user: String
    package var password: String

    package init(user: String, password: String) {
        self.user = user
        self.password = password
    }

    package var description: String { "PasswordCredential(user: \(user), password: <redacted>)" }
    package var debugDescription: String { description }
    package var customMirror: Mirror { Mirror(self, children: ["user": user, "password": "<redacted>"]) }

    /// User name and password in Unicode Normalization Form C, as RFC 7617 §2.1 and RFC 7616 §4
    /// ask when the server announced `charset=UTF-8` (the RFC 7613 profiles start with NFC):
    /// a password typed on a system that produces decomposed characters then still matches.
    var normalized: PasswordCredential {
        PasswordCredential(
            user: user.precomposedStringWithCanonicalMapping,
            password: password.precomposedStringWithCanonicalMapping
        )
    }
}
