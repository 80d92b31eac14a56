/// Which challenges of a 401/407 a client may see, and which one the broker answers itself.
///
/// DESIGN.md: the client sees only the standard challenges it can answer (Basic and Digest);
/// Negotiate, NTLM, Bearer and the rest are stripped (and logged by the caller).
package enum ChallengeSelection {
    /// A challenge the broker can answer, already read.
    package enum Choice: Sendable, Hashable {
        case digest(DigestChallenge, AuthChallenge)
        case basic(AuthChallenge)

        /// The challenge as received.
        package var challenge: AuthChallenge {
            switch self {
            case .digest(_, let challenge), .basic(let challenge): challenge
            }
        }
    }

    /// The challenges to forward to the client, in the server's order: every Basic challenge,
    /// and every Digest challenge the broker could answer too (a Digest challenge with an unknown
    /// algorithm or qop, or without a nonce, is dropped: no one could answer it with the
    /// credentials the broker holds, and forwarding it would invite an answer that cannot work).
    package static func clientVisible(_ challenges: [AuthChallenge]) -> [AuthChallenge] {
        challenges.filter { challenge in
            switch challenge.lowercasedScheme {
            case "basic": return challenge.token68 == nil
            case "digest": return (try? DigestChallenge(challenge)) != nil
            default: return false
            }
        }
    }

    /// Rewrites the values of a 401's `WWW-Authenticate` (or a 407's `Proxy-Authenticate`) fields
    /// for the client: one value per challenge it may see, in the server's order, and the
    /// lower-cased schemes that were stripped (for the log). A field with nothing usable yields
    /// no values: the response reaches the client with no challenge at all.
    package static func forClient(fieldValues: [String]) -> (values: [String], stripped: [String]) {
        let challenges = AuthChallenge.parse(fieldValues: fieldValues)
        let visible = Self.clientVisible(challenges)
        let values = visible.compactMap { $0.serialized() }
        var stripped = challenges.filter { !visible.contains($0) }.map(\.lowercasedScheme)
        if challenges.isEmpty, fieldValues.contains(where: { !$0.allSatisfy(\.isWhitespace) }) {
            stripped.append("(unparsable)")
        }
        return (values, stripped)
    }

    /// The challenge the broker answers from a stored credential: Digest over Basic (Basic sends
    /// the password itself), the strongest hash among Digest challenges (SHA-512-256 > SHA-256 >
    /// MD5, a `-sess` form ranking with its base), a challenge with qop over an RFC 2069 one,
    /// and the server's order on ties (RFC 7616 §3.7: servers list their preference first).
    /// nil when nothing is answerable.
    package static func preferred(_ challenges: [AuthChallenge]) -> Choice? {
        var best: (choice: Choice, rank: Int)?
        for challenge in challenges {
            let choice: Choice
            let rank: Int
            switch challenge.lowercasedScheme {
            case "digest":
                guard let digest = try? DigestChallenge(challenge) else { continue }
                choice = .digest(digest, challenge)
                rank = 10 + digest.algorithm.strength * 2 + (digest.qopOptions.isEmpty ? 0 : 1)
            case "basic":
                guard challenge.token68 == nil else { continue }
                choice = .basic(challenge)
                rank = 1
            default:
                continue
            }
            if best == nil || rank > best?.rank ?? 0 {
                best = (choice, rank)
            }
        }
        return best?.choice
    }
}
