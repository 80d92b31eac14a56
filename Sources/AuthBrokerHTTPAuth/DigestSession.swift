/// The Digest state the broker keeps per protection space, so that repeat requests can carry
/// an `Authorization` preemptively and skip the 401 round trip (RFC 7616 §3.4: a client may
/// reuse a nonce with an increasing nonce count).
///
/// A value with no I/O and no credential inside: the caller (one actor owning all sessions)
/// passes the credential to each call and serialises the calls, which keeps `nc` strictly
/// increasing per nonce.
///
/// - Warning: requests counted here may reach the server out of order when they travel on
///   different connections; servers that insist on strictly increasing `nc` then refuse the late
///   one with a fresh (usually stale) challenge, which `challenge(_:)` and `AuthAttemptPolicy`
///   turn into one retry, never into a marked-failed credential.
package struct DigestSession: Sendable {
    /// What a new 401/407 for a request that carried this session's authorization means.
    package enum Rechallenge: Sendable, Hashable {
        /// `stale=true` in the same realm: the nonce expired but the credentials were right;
        /// retry with the new nonce without asking anyone (RFC 7616 §3.3).
        case staleNonce
        /// Not stale (or a different realm): the server refused the credentials.
        case credentialsRejected
    }

    package let protectionSpace: ProtectionSpace
    /// The challenge whose nonce, realm, algorithm and qop the next request uses.
    package private(set) var challenge: DigestChallenge
    /// The `nc` the next request sends; 1 after every nonce change. Unchanged by RFC 2069
    /// responses (no qop), which carry no nc.
    package private(set) var nextNonceCount: UInt32 = 1
    /// For `-sess`: the client nonce of the first request under the current nonce, which A1 keeps.
    private var sessionClientNonce: String?

    package init(protectionSpace: ProtectionSpace, challenge: DigestChallenge) {
        self.protectionSpace = protectionSpace
        self.challenge = challenge
    }

    /// The authorization for the next request, counting it: `nc` goes up by one per call.
    ///
    /// - Throws: as `DigestChallenge.authorization`, and `nonce_count_exhausted` after 2^32-1
    ///   requests on one nonce (drop the session then; the next 401 starts a new one).
    package mutating func authorization(
        credential: PasswordCredential, method: String, uri: String, body: DigestEntityBody = .unavailable,
        clientNonce: String = DigestChallenge.makeClientNonce(), preferAuthInt: Bool = false
    ) throws(HTTPAuthError) -> DigestAuthorization {
        guard nextNonceCount != 0 else { throw .nonceCountExhausted() }
        let result = try challenge.authorization(
            credential: credential, method: method, uri: uri, body: body, nonceCount: nextNonceCount,
            clientNonce: clientNonce, sessionClientNonce: sessionClientNonce, preferAuthInt: preferAuthInt
        )
        if result.qop != nil {
            // Wraps to 0 after UInt32.max, which the guard above then refuses.
            nextNonceCount &+= 1
        }
        if challenge.algorithm.isSession, sessionClientNonce == nil {
            sessionClientNonce = clientNonce
        }
        return result
    }

    /// Takes the server's `nextnonce` (RFC 7616 §3.5), if it sent one: the next request uses it,
    /// with `nc` starting again at 1.
    package mutating func accept(authenticationInfo info: AuthenticationInfo) {
        guard let next = info.nextNonce, !next.isEmpty, next != challenge.nonce else { return }
        challenge.nonce = next
        challenge.stale = false
        resetCount()
    }

    /// A new challenge for this space arrived on a response to a request this session authorised.
    /// The session adopts it either way (new nonce, `nc` from 1); the result says whether the
    /// same credentials may be retried without asking anyone.
    package mutating func challenge(_ new: DigestChallenge) -> Rechallenge {
        let sameRealm = new.realm == challenge.realm
        challenge = new
        resetCount()
        return new.stale && sameRealm ? .staleNonce : .credentialsRejected
    }

    private mutating func resetCount() {
        nextNonceCount = 1
        sessionClientNonce = nil
    }
}
