import AuthBrokerHTTPAuth

/// Answers a Digest challenge with the broker's own Digest code (`DigestChallenge`), so tests
/// that only import TestSupport can talk to `TestAuthOrigin` or Apache byte by byte, choosing
/// nc, cnonce and replays themselves.
package struct TestDigestAnswerer: Sendable {
    private var challenge: DigestChallenge
    private let credential: PasswordCredential
    private var last: DigestAuthorization?

    /// Reads the first Digest challenge in `wwwAuthenticate` (a field value).
    package init(wwwAuthenticate: String, user: String, password: String) throws {
        guard let parsed = AuthChallenge.parse(fieldValue: wwwAuthenticate).first(where: { $0.lowercasedScheme == "digest" }) else {
            throw TestSupportError("no Digest challenge in \(wwwAuthenticate)")
        }
        do {
            self.challenge = try DigestChallenge(parsed)
        } catch {
            throw TestSupportError("unusable Digest challenge \(wwwAuthenticate): \(error)")
        }
        self.credential = PasswordCredential(user: user, password: password)
    }

    package var nonce: String { self.challenge.nonce }
    package var realm: String { self.challenge.realm }
    package var stale: Bool { self.challenge.stale }
    package var userhash: Bool { self.challenge.userhash }
    package var opaque: String? { self.challenge.opaque }
    /// The algorithm's canonical name (`MD5`, `SHA-512-256-sess`, ...).
    package var algorithm: String { self.challenge.algorithm.rawValue }
    /// The qop values offered, as written in RFC 7616; empty for RFC 2069.
    package var qopOptions: [String] { self.challenge.qopOptions.map(\.rawValue) }

    /// The `Authorization` value for one request; remembered for `verify(authenticationInfo:)`.
    ///
    /// - Parameters:
    ///   - body: the request body; given, `auth-int` is used when offered.
    ///   - sessionClientNonce: for `-sess`, the cnonce of the first request with this nonce.
    package mutating func authorization(
        method: String = "GET", uri: String, body: [UInt8]? = nil, nonceCount: UInt32 = 1,
        clientNonce: String = DigestChallenge.makeClientNonce(), sessionClientNonce: String? = nil
    ) throws -> String {
        do {
            let result = try self.challenge.authorization(
                credential: self.credential, method: method, uri: uri, body: body.map { .bytes($0) } ?? .unavailable,
                nonceCount: nonceCount, clientNonce: clientNonce, sessionClientNonce: sessionClientNonce,
                preferAuthInt: body != nil
            )
            self.last = result
            return result.headerValue
        } catch {
            throw TestSupportError("cannot answer the Digest challenge: \(error)")
        }
    }

    /// Whether `Authentication-Info` proves the server knows the password, for the last
    /// authorization made: `verified`, `notProvided`, `mismatch` or `cannotVerify`.
    package func verify(authenticationInfo field: String, responseBody: [UInt8]) -> String {
        guard let last = self.last else { return "noAuthorization" }
        let verdict = self.challenge.verifyResponseAuth(
            AuthenticationInfo(parsing: field), credential: self.credential, authorization: last, responseBody: .bytes(responseBody)
        )
        return "\(verdict)"
    }

    /// Adopts the `nextnonce` an `Authentication-Info` carries; false when it carries none.
    package mutating func adoptNextNonce(from field: String) -> Bool {
        guard let next = AuthenticationInfo(parsing: field).nextNonce else { return false }
        self.challenge.nonce = next
        return true
    }
}
