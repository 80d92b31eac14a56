import AuthBrokerHTTPAuth
import Foundation
import NIOHTTP1

/// The authentication schemes an app is ever asked about: the daemon passes only these on
/// (DESIGN.md: Negotiate, NTLM, Bearer and the rest are stripped before the app sees a 401).
public enum BrokerAuthenticationScheme: String, Sendable, Hashable {
    case basic = "Basic"
    case digest = "Digest"
}

/// Where a credential applies (RFC 9110 §11.5), like URLProtectionSpace.
public struct BrokerProtectionSpace: Sendable, Hashable, CustomStringConvertible {
    /// `http` or `https`.
    public var urlScheme: String
    public var host: String
    public var port: Int
    /// Case-sensitive; empty when the server named none.
    public var realm: String
    public var authenticationScheme: BrokerAuthenticationScheme

    public var description: String {
        "\(urlScheme)://\(host):\(port) \(authenticationScheme.rawValue) realm=\"\(realm)\""
    }
}

/// A Basic or Digest challenge the daemon could not answer itself, for the app to answer.
public struct BrokerAuthenticationChallenge: Sendable {
    public var protectionSpace: BrokerProtectionSpace
    /// How many credentials for this space have already failed on this request (0 at first).
    public var previousFailureCount: Int
    /// The 401's head (its `WWW-Authenticate` lists only Basic and Digest challenges).
    public var failureResponse: BrokerResponseHead
    /// The URL that was requested.
    public var url: URL
}

/// How the app answers a challenge, like URLSession.AuthChallengeDisposition.
public enum BrokerChallengeDisposition: Sendable, CustomStringConvertible {
    /// Send the request again with this credential. The library computes the `Authorization`
    /// (Basic, RFC 7617, or Digest, RFC 7616) itself; `persistence` other than `.none` asks the
    /// daemon to keep the credential (`Authbroker-Persist`).
    case useCredential(user: String, password: String, persistence: CredentialPersistence)
    /// Return the 401 as the response.
    case performDefaultHandling
    /// Fail the request with `BrokerClientError.challengeCancelled`.
    case cancel
    /// Try the response's next challenge; when none is left, return the 401.
    case rejectProtectionSpace

    public var description: String {
        switch self {
        case .useCredential(let user, _, let persistence): "useCredential(user: \(user), password: <redacted>, persistence: \(persistence))"
        case .performDefaultHandling: "performDefaultHandling"
        case .cancel: "cancel"
        case .rejectProtectionSpace: "rejectProtectionSpace"
        }
    }
}

/// Answers Basic/Digest challenges the daemon passes through. Called on the task that called
/// `send`, one challenge at a time, never on an event loop: it may await a prompt.
public typealias BrokerChallengeHandler = @Sendable (BrokerAuthenticationChallenge) async -> BrokerChallengeDisposition

/// The state of one request's challenge dialogue across its attempts.
struct ChallengeDialogue {
    enum Decision {
        /// Send again with these extra header fields.
        case resend(authorization: String, persist: String?)
        case returnResponse
        case cancel
    }

    /// Attempts after which the 401 is returned whatever the handler says, so a handler that
    /// never gives up cannot loop forever.
    static let maxRounds = 16

    private var failures: [BrokerProtectionSpace: Int] = [:]
    private var lastAttempt: (space: BrokerProtectionSpace, credential: PasswordCredential, persistence: CredentialPersistence)?
    private var rounds = 0

    /// What to do about a 401 with this head.
    mutating func decide(
        after head: HTTPResponseHead, request: BrokerRequest, target: BrokerRequest.Target, handler: BrokerChallengeHandler
    ) async throws(BrokerClientError) -> Decision {
        rounds += 1
        guard rounds <= Self.maxRounds else { return .returnResponse }
        let ordered = Self.preferenceOrder(ChallengeSelection.clientVisible(AuthChallenge.parse(fieldValues: head.headers["WWW-Authenticate"])))

        if let last = lastAttempt {
            lastAttempt = nil
            // Right credentials on an expired nonce (RFC 7616 §3.3 stale=true): again, asking no one.
            if let stale = ordered.first(where: { choice in
                if case .digest(let digest, _) = choice, digest.stale, space(of: choice, target: target) == last.space { return true }
                return false
            }) {
                lastAttempt = last
                return .resend(
                    authorization: try authorization(for: stale, credential: last.credential, request: request, target: target),
                    persist: last.persistence.directive
                )
            }
            failures[last.space, default: 0] += 1
        }

        for choice in ordered {
            let space = space(of: choice, target: target)
            let challenge = BrokerAuthenticationChallenge(
                protectionSpace: space, previousFailureCount: failures[space] ?? 0,
                failureResponse: BrokerResponseHead(head), url: request.url
            )
            switch await handler(challenge) {
            case .useCredential(let user, let password, let persistence):
                let credential = PasswordCredential(user: user, password: password)
                let value = try authorization(for: choice, credential: credential, request: request, target: target)
                lastAttempt = (space, credential, persistence)
                return .resend(authorization: value, persist: persistence.directive)
            case .performDefaultHandling:
                return .returnResponse
            case .cancel:
                return .cancel
            case .rejectProtectionSpace:
                continue
            }
        }
        return .returnResponse
    }

    /// Strongest first: Digest over Basic, stronger hashes first, the server's order on ties.
    static func preferenceOrder(_ challenges: [AuthChallenge]) -> [ChallengeSelection.Choice] {
        var remaining = challenges
        var ordered: [ChallengeSelection.Choice] = []
        while let best = ChallengeSelection.preferred(remaining) {
            ordered.append(best)
            if let index = remaining.firstIndex(of: best.challenge) { remaining.remove(at: index) } else { break }
        }
        return ordered
    }

    private func space(of choice: ChallengeSelection.Choice, target: BrokerRequest.Target) -> BrokerProtectionSpace {
        let scheme: BrokerAuthenticationScheme
        switch choice {
        case .digest: scheme = .digest
        case .basic: scheme = .basic
        }
        return BrokerProtectionSpace(
            urlScheme: target.scheme, host: target.host, port: target.port, realm: choice.challenge.realm ?? "",
            authenticationScheme: scheme
        )
    }

    private func authorization(
        for choice: ChallengeSelection.Choice, credential: PasswordCredential, request: BrokerRequest, target: BrokerRequest.Target
    ) throws(BrokerClientError) -> String {
        do {
            switch choice {
            case .basic(let challenge):
                return try BasicAuthorization.headerValue(for: credential, challenge: challenge)
            case .digest(let digest, _):
                let body: DigestEntityBody
                switch request.body.storage {
                case .empty: body = .bytes([])
                case .bytes(let bytes): body = .bytes(bytes)
                case .stream: body = .unavailable
                }
                return try digest.authorization(
                    credential: credential, method: request.method, uri: target.originForm, body: body, nonceCount: 1,
                    clientNonce: DigestChallenge.makeClientNonce()
                ).headerValue
            }
        } catch {
            throw .invalidRequest(reason: "cannot answer the challenge with that credential: \(error)")
        }
    }
}
