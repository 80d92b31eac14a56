/// When the broker answers a 401/407 from the credential store, and when it gives up: the rule
/// that keeps a wrong stored password from locking the user's account.
///
/// Servers lock accounts after a few failures, so a broker that retried a refused password in a
/// loop (or on every request) would lock the user out. The rules, for one request:
///
/// 1. A stored credential is sent at most once per request, up front (Basic under a known
///    directory, Digest with a remembered nonce) or in answer to a challenge, plus at most one
///    retry after `stale=true`, which says the credential was right. A refused preemptive
///    Digest answer counts like any other: a server whose nonce merely expired says
///    `stale=true` (RFC 7616 §3.3); a plain 401 means the password was refused, and sending it
///    again to the fresh challenge would be a second failed login on the user's account.
/// 2. If the server refuses it (a non-stale challenge), it is marked failed, and a credential
///    marked failed is never sent again, by any request, until the user changes it (the store
///    clears the mark on change).
/// 3. Whenever the broker does not answer, the 401/407 goes to the client with its Basic and
///    Digest challenges, so the app (or the user) can answer; a credential the client sent
///    itself is never replaced by a stored one.
///
/// One exception to rule 2: a refusal is no evidence against the password when the server
/// accepted the same stored credential from another request after this one was sent. Concurrent
/// requests share a Digest nonce, so their `nc` values can reach the server out of order, and a
/// server that insists on rising counts refuses the late ones with a plain 401. Such a refusal
/// gets a bounded number of fresh answers (`maxRetriesAfterAcceptance`) instead of the mark. With
/// a wrong password no request is ever accepted, so rule 2 still holds for it in full.
///
/// Each answer needs an earlier answer to have been refused, and the number of answers is
/// bounded, so a request never loops: it ends with a response or a 401 for the client.
package enum AuthAttemptPolicy {
    /// The store's view of the credential for the protection space.
    package enum StoredCredential: Sendable, Hashable {
        case none
        case usable
        /// Refused by the server earlier; not sent again until changed.
        case markedFailed
    }

    /// Who supplied the `Authorization` of the attempt that just got the 401/407.
    package enum LastAttempt: Sendable, Hashable {
        /// No credentials were sent.
        case noCredentials
        /// The broker sent the stored credential in answer to a challenge (or Basic preemptively).
        case storedCredential
        /// The broker sent a Digest authorization computed from a remembered nonce, before any
        /// challenge. Decided like `storedCredential` (a refusal without `stale=true` is a
        /// refusal); kept apart for the log and the tests that say so.
        case preemptiveDigest
        /// The client sent its own.
        case clientCredential
    }

    package enum Decision: Sendable, Hashable {
        /// Answer the challenge with the stored credential and resend the request.
        case answerFromStore
        /// Give the client the 401/407 (filtered to Basic and Digest).
        case passToClient
        /// The stored credential was refused: mark it failed, then give the client the 401/407.
        case markStoredFailedAndPassToClient
    }

    /// Fresh answers a request may make after refusals the server contradicted by accepting the
    /// same credential from another request meanwhile.
    package static let maxRetriesAfterAcceptance = 2

    /// What to do with a 401/407.
    ///
    /// - Parameters:
    ///   - previousFailures: how many 401/407 responses this request already got before this one.
    ///   - lastAttempt: who supplied the credentials this 401/407 refused.
    ///   - stored: the store's credential for the protection space.
    ///   - challengeIsStale: the broker's chosen challenge says `stale=true`.
    ///   - staleRetries: how many stale retries this request already made.
    ///   - acceptedSinceSent: the server accepted the same stored credential from another request
    ///     after this request's refused attempt was sent.
    ///   - retriesAfterAcceptance: how many answers this request already made on that ground.
    /// - Returns: fails closed: anything unexpected passes the 401/407 to the client.
    package static func decide(
        previousFailures: Int, lastAttempt: LastAttempt, stored: StoredCredential, challengeIsStale: Bool,
        staleRetries: Int, acceptedSinceSent: Bool = false, retriesAfterAcceptance: Int = 0
    ) -> Decision {
        switch lastAttempt {
        case .clientCredential:
            return .passToClient
        case .storedCredential, .preemptiveDigest:
            if challengeIsStale {
                // The credential was right; one fresh nonce is all a correct server needs.
                return staleRetries == 0 && stored == .usable ? .answerFromStore : .passToClient
            }
            if acceptedSinceSent {
                // The password is right (the server just took it); the refusal was about the
                // nonce or count. Never a mark; a bounded number of fresh answers.
                return retriesAfterAcceptance < Self.maxRetriesAfterAcceptance && stored == .usable ? .answerFromStore : .passToClient
            }
            return .markStoredFailedAndPassToClient
        case .noCredentials:
            return previousFailures == 0 && stored == .usable ? .answerFromStore : .passToClient
        }
    }

    /// Whether a request may carry the stored credential before any 401 (preemptive reuse of a
    /// known nonce or of Basic): only a usable one.
    package static func mayPreempt(stored: StoredCredential) -> Bool {
        stored == .usable
    }
}
