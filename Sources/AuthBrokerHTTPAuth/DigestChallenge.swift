import AuthBrokerCore

/// A Digest `qop` value the broker can use (RFC 7616 §3.3).
package enum DigestQOP: String, Sendable, Hashable, Codable {
    /// Authentication of the method and URI.
    case auth
    /// Authentication with integrity protection of the body too.
    case authInt = "auth-int"
}

/// A Digest challenge (RFC 7616 §3.3) the broker can answer: read from an `AuthChallenge`
/// whose scheme is `Digest`.
///
/// Unknown parameters are ignored, as §3.3 requires; parameters the broker cannot do without
/// (a nonce, a known algorithm, a known qop when qop is present) make the challenge unusable.
package struct DigestChallenge: Sendable, Hashable {
    /// Case-sensitive; an empty realm when the server sent none (RFC 2069 servers exist).
    package var realm: String
    /// The URIs the protection space covers (`domain`, space-separated); empty when not given.
    package var domain: [String]
    package var nonce: String
    package var opaque: String?
    /// The previous request's nonce had expired but its credentials were right (§3.3): retry
    /// with the new nonce without asking anyone.
    package var stale: Bool
    package var algorithm: DigestAlgorithm
    /// `algorithm` as the server spelled it, echoed in the response; nil when the challenge
    /// named none (MD5 implied, RFC 7616 §3.3) and so none is echoed, as RFC 2069 servers expect.
    package var algorithmParameter: String?
    /// The qop values offered that the broker knows, in the server's order. Empty when the
    /// challenge has no `qop`: then the response is computed the RFC 2069 way, without nc or cnonce.
    package var qopOptions: [DigestQOP]
    /// The server announced `charset=UTF-8` (RFC 7616 §3.3, the only value defined).
    package var charsetUTF8: Bool
    /// The server supports a hashed user name (RFC 7616 §3.4.4).
    package var userhash: Bool

    package init(
        realm: String, domain: [String] = [], nonce: String, opaque: String? = nil, stale: Bool = false,
        algorithm: DigestAlgorithm = .md5, algorithmParameter: String? = nil, qopOptions: [DigestQOP] = [.auth],
        charsetUTF8: Bool = false, userhash: Bool = false
    ) {
        self.realm = realm
        self.domain = domain
        self.nonce = nonce
        self.opaque = opaque
        self.stale = stale
        self.algorithm = algorithm
        self.algorithmParameter = algorithmParameter
        self.qopOptions = qopOptions
        self.charsetUTF8 = charsetUTF8
        self.userhash = userhash
    }

    /// Reads a Digest challenge.
    ///
    /// - Throws: `not_digest`, `missing_parameter` (no nonce), `unsupported_algorithm`,
    ///   `unsupported_qop` (qop present but none of its values known), `session_without_qop`.
    package init(_ challenge: AuthChallenge) throws(HTTPAuthError) {
        guard challenge.lowercasedScheme == "digest" else { throw .notDigest(challenge.scheme) }
        guard challenge.token68 == nil, let nonce = challenge[parameter: "nonce"] else {
            throw .missingParameter("nonce")
        }
        self.nonce = nonce
        self.realm = challenge.realm ?? ""
        self.domain = (challenge[parameter: "domain"] ?? "").split(whereSeparator: { $0 == " " || $0 == "\t" }).map(String.init)
        self.opaque = challenge[parameter: "opaque"]
        self.stale = challenge[parameter: "stale"].map(AuthListSyntax.lowercasedASCII) == "true"
        if let token = challenge[parameter: "algorithm"] {
            guard let algorithm = DigestAlgorithm(token: token) else { throw .unsupportedAlgorithm(token) }
            self.algorithm = algorithm
            self.algorithmParameter = token
        } else {
            self.algorithm = .md5
            self.algorithmParameter = nil
        }
        if let qop = challenge[parameter: "qop"] {
            // A quoted list `"auth,auth-int"`; servers also write spaces, so split on both.
            var options: [DigestQOP] = []
            for item in qop.split(whereSeparator: { $0 == "," || $0 == " " || $0 == "\t" }) {
                if let option = DigestQOP(rawValue: AuthListSyntax.lowercasedASCII(String(item))), !options.contains(option) {
                    options.append(option)
                }
            }
            guard !options.isEmpty else { throw .unsupportedQOP(qop) }
            self.qopOptions = options
        } else {
            self.qopOptions = []
        }
        guard !(algorithm.isSession && qopOptions.isEmpty) else { throw .sessionWithoutQOP(algorithm.rawValue) }
        self.charsetUTF8 = challenge[parameter: "charset"].map(AuthListSyntax.lowercasedASCII) == "utf-8"
        self.userhash = challenge[parameter: "userhash"].map(AuthListSyntax.lowercasedASCII) == "true"
    }

    /// A fresh client nonce: 16 random bytes as hex (RFC 7616 §3.4: unquoted, no spaces, hard to
    /// guess).
    package static func makeClientNonce() -> String {
        var generator = SystemRandomNumberGenerator()
        return makeClientNonce(using: &generator)
    }

    package static func makeClientNonce(using generator: inout some RandomNumberGenerator) -> String {
        DigestBodyHasher.hex((0..<16).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }
}

extension DigestChallenge {
    /// At most this many `domain` entries are kept as paths: a server's list must not crowd out
    /// what the broker remembers of the origin's other spaces.
    package static let maxDomainPaths = 8

    /// The paths on `origin` under which this space's password may be sent up front, once a
    /// request for `requestPath` (without its query) was accepted: RFC 7616 §3.3's `domain`, any
    /// URI with one of its URIs as prefix, or the whole origin when the challenge has none.
    /// Entries naming another origin are not ours to answer up front. The accepted request's own
    /// path is in the space too (it was challenged there), so it is added when no entry covers
    /// it: the path, not its directory, which for `/login` would be the whole origin.
    package func preemptionPaths(origin: CanonicalOrigin, requestPath: String) -> [String] {
        guard !self.domain.isEmpty else { return ["/"] }
        let requestDirectory = requestPath.lastIndex(of: "/").map { String(requestPath[...$0]) } ?? "/"
        var paths: [String] = []
        for entry in self.domain where paths.count < Self.maxDomainPaths {
            let path: String
            if entry.hasPrefix("/") {
                path = entry
            } else if entry.contains("://") {
                guard case .success(.absolute(let named, let pathAndQuery)) = RequestTarget.parse(method: "GET", uri: entry),
                    named == origin
                else { continue }
                path = pathAndQuery
            } else {
                path = requestDirectory + entry
            }
            // A prefix of paths, not of queries or fragments.
            let bare = String(path.prefix { $0 != "?" && $0 != "#" })
            if !paths.contains(bare) { paths.append(bare) }
        }
        if !paths.contains(where: { requestPath.hasPrefix($0) }) { paths.append(requestPath) }
        return paths
    }
}
