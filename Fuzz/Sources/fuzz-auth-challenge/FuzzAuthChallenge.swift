import AuthBrokerCore
import AuthBrokerHTTPAuth
import FuzzSupport

/// Fuzzes the parsers of what an origin sends about authentication and what a client sends as
/// Basic credentials. The input is split into field lines at newlines, so that one input is the
/// values of several `WWW-Authenticate` (or `Authentication-Info`, or `Authorization`) lines.
///
/// Invariants: limits hold; every parsed challenge serialises and parses back to itself; Digest
/// interpretation, answering and `rspauth` checking never trap; a Negotiate offer's token
/// round-trips and Negotiate never reaches a client; a decoded Basic credential encodes back to
/// a value that decodes to the same credential.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAuthChallenge(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    let lines = bytes.split(separator: 0x0A, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }

    let challenges = AuthChallenge.parse(fieldValues: lines)
    Fuzz.check(challenges.count <= AuthChallenge.maxChallenges, "more than maxChallenges")
    for challenge in challenges {
        Fuzz.check(challenge.parameters.count <= AuthChallenge.maxParametersPerChallenge, "more than maxParametersPerChallenge")
        Fuzz.check(challenge.token68 == nil || challenge.parameters.isEmpty, "token68 and parameters together")
        let names = challenge.parameters.map(\.lowercasedName)
        Fuzz.check(Set(names).count == names.count, "a parameter name repeated")
        guard let text = challenge.serialized() else {
            Fuzz.check(false, "a parsed challenge does not serialise: \(challenge.scheme)")
            continue
        }
        Fuzz.check(AuthChallenge.parse(fieldValue: text) == [challenge], "serialise then parse changed the challenge: \(text)")
        _ = challenge.description

        if let digest = try? DigestChallenge(challenge) {
            answer(digest, info: AuthenticationInfo(parsing: lines))
        }
    }
    _ = ChallengeSelection.forClient(fieldValues: lines)
    _ = ChallengeSelection.preferred(challenges)
    // A server's Negotiate offer: only a bare challenge or a base64 token, and never visible to clients.
    if let offer = NegotiatePolicy.offer(in: challenges), let token = offer.serverToken {
        Fuzz.check(NegotiatePolicy.offer(in: AuthChallenge.parse(fieldValue: NegotiatePolicy.authorization(token: token))) == offer, "a Negotiate token does not round-trip")
    }
    Fuzz.check(!ChallengeSelection.clientVisible(challenges).contains { $0.lowercasedScheme == "negotiate" }, "Negotiate visible to a client")

    let info = AuthenticationInfo(parsing: lines)
    Fuzz.check(info.parameters.count <= AuthChallenge.maxParametersPerChallenge, "Authentication-Info: too many parameters")
    _ = (info.nextNonce, info.qop, info.responseAuth, info.clientNonce, info.nonceCount)

    for line in lines.prefix(4) {
        guard let credential = BasicAuthorization.credential(fromHeaderValue: line) else { continue }
        // The decoder refuses what the encoder refuses (':' in the user, control characters).
        guard let encoded = try? BasicAuthorization.headerValue(for: credential, charsetUTF8: false) else {
            Fuzz.check(false, "a decoded Basic credential does not encode")
            continue
        }
        Fuzz.check(BasicAuthorization.credential(fromHeaderValue: encoded) == credential, "Basic encode then decode changed the credential")
    }
    return 0
}

private let credential = PasswordCredential(user: "Mufasa", password: "Circle of Life")

/// Answers the challenge as the broker would, then checks the server's `rspauth` from the same input.
private func answer(_ digest: DigestChallenge, info: AuthenticationInfo) {
    Fuzz.check(!(digest.algorithm.isSession && digest.qopOptions.isEmpty), "a -sess challenge without qop was accepted")
    for body in [DigestEntityBody.unavailable, .bytes(Array("body".utf8))] {
        guard
            let authorization = try? digest.authorization(
                credential: credential, method: "GET", uri: "/dir/index.html", body: body, nonceCount: 1,
                clientNonce: "0a4f113b"
            )
        else { continue }
        let parsed = AuthChallenge.parse(fieldValue: authorization.headerValue)
        Fuzz.check(parsed.count == 1 && parsed.first?.lowercasedScheme == "digest", "our Authorization value does not parse: \(authorization.headerValue)")
        _ = digest.verifyResponseAuth(info, credential: credential, authorization: authorization, responseBody: body)
    }
}
