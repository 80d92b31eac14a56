/// The body of the message a Digest `auth-int` response covers (RFC 7616 §3.4.3).
package enum DigestEntityBody: Sendable, Hashable {
    /// Not known (it streams and was not buffered): `auth-int` cannot be used.
    case unavailable
    /// The whole body; empty for a request without one.
    case bytes([UInt8])
    /// H(entity-body) as lower-case hex, from a `DigestBodyHasher` of the challenge's hash
    /// function, for a body hashed while it streamed.
    case hash(String)
}

/// A computed Digest response: the header value and the parameters that went into it, which
/// `DigestChallenge.verifyResponseAuth` needs to check the server's `rspauth`.
///
/// Holds no secret: the password and H(A1) are not kept.
package struct DigestAuthorization: Sendable, Hashable {
    /// The value for `Authorization` (or `Proxy-Authorization`): `Digest username=..., ...`.
    package var headerValue: String
    /// The `response` parameter, lower-case hex.
    package var response: String
    package var algorithm: DigestAlgorithm
    package var realm: String
    package var nonce: String
    package var uri: String
    /// nil for an RFC 2069 response (the challenge offered no qop).
    package var qop: DigestQOP?
    /// The `nc` sent; nil without qop.
    package var nonceCount: UInt32?
    /// The `cnonce` sent; nil without qop.
    package var clientNonce: String?
    /// For a `-sess` algorithm, the client nonce hashed into A1 (the first one used with this
    /// server nonce, RFC 7616 §3.4.2); nil otherwise.
    package var sessionClientNonce: String?
}

/// Whether a server's `rspauth` proved that it knows the credentials (RFC 7616 §3.5).
package enum ResponseAuthVerdict: Sendable, Hashable {
    /// The server's `rspauth` matches: it knows the password (or H(A1)).
    case verified
    /// No `rspauth` was sent: nothing is proven either way (servers may omit it).
    case notProvided
    /// `rspauth`, `cnonce`, `nc` or `qop` does not match this request: treat the response as
    /// not from the server the credentials are for.
    case mismatch
    /// `qop=auth-int` covers the response body, which was not available.
    case cannotVerify
}

/// The Digest arithmetic of RFC 7616 §3.4.1-§3.4.3, over an injectable hash so that tests can
/// reproduce the RFC's own (truncated SHA-512) example numbers.
struct DigestMath {
    /// H(bytes) as lower-case hex.
    let hash: ([UInt8]) -> String

    init(_ function: DigestHashFunction) {
        self.hash = { function.hex($0) }
    }

    init(hash: @escaping ([UInt8]) -> String) {
        self.hash = hash
    }

    func h(_ text: String) -> String { hash(Array(text.utf8)) }

    /// KD(secret, data) = H(concat(secret, ":", data)).
    func kd(_ secret: String, _ data: String) -> String { h(secret + ":" + data) }

    /// H(A1): `user:realm:password`, and for `-sess` H(that) `:nonce:cnonce` (§3.4.2).
    func ha1(user: String, realm: String, password: String, session: (nonce: String, clientNonce: String)?) -> String {
        let base = user + ":" + realm + ":" + password
        guard let session else { return h(base) }
        return h(h(base) + ":" + session.nonce + ":" + session.clientNonce)
    }

    /// H(A2): `method:uri`, and for auth-int `:H(body)` (§3.4.3). rspauth uses an empty method (§3.5).
    func ha2(method: String, uri: String, bodyHash: String?) -> String {
        guard let bodyHash else { return h(method + ":" + uri) }
        return h(method + ":" + uri + ":" + bodyHash)
    }

    /// The `response` (§3.4.1), or the RFC 2069 form without nc, cnonce and qop.
    func response(ha1: String, nonce: String, nonceCount: String?, clientNonce: String?, qop: DigestQOP?, ha2: String) -> String {
        guard let qop, let nonceCount, let clientNonce else { return kd(ha1, nonce + ":" + ha2) }
        return kd(ha1, nonce + ":" + nonceCount + ":" + clientNonce + ":" + qop.rawValue + ":" + ha2)
    }

    func bodyHash(_ body: DigestEntityBody) -> String? {
        switch body {
        case .unavailable: nil
        case .bytes(let bytes): hash(bytes)
        case .hash(let hex): AuthListSyntax.lowercasedASCII(hex)
        }
    }
}

extension DigestChallenge {
    /// `nc` as the 8 lower-case hex digits RFC 7616 §3.4 requires.
    package static func formatNonceCount(_ count: UInt32) -> String {
        let hex = String(count, radix: 16)
        return String(repeating: "0", count: 8 - hex.count) + hex
    }

    /// The qop the broker uses with this challenge: `auth` when offered (it needs no body),
    /// unless `preferAuthInt` and the body is known; `auth-int` when it is the only choice;
    /// nil (RFC 2069) when the server offered none.
    package func chooseQOP(body: DigestEntityBody, preferAuthInt: Bool = false) throws(HTTPAuthError) -> DigestQOP? {
        guard !qopOptions.isEmpty else { return nil }
        let bodyKnown = body != .unavailable
        if qopOptions.contains(.authInt), bodyKnown, preferAuthInt || !qopOptions.contains(.auth) {
            return .authInt
        }
        if qopOptions.contains(.auth) { return .auth }
        throw .bodyRequired()
    }

    /// Computes the `Authorization` (or `Proxy-Authorization`) value for one request.
    ///
    /// - Parameters:
    ///   - method: the request method, exactly as sent.
    ///   - uri: the request-target exactly as sent (origin-form for a server, absolute-form to a
    ///     proxy): the server compares it with the request line (§3.4.6).
    ///   - body: the request body, for `auth-int`.
    ///   - nonceCount: how many requests, this one included, have used this nonce (from 1).
    ///   - clientNonce: the `cnonce`; `DigestChallenge.makeClientNonce()` makes a good one.
    ///   - sessionClientNonce: for `-sess`, the cnonce of the first request with this nonce;
    ///     nil means this request's.
    /// - Throws: `body_required` (only auth-int offered, body unknown), `invalid_character`
    ///   (a method, URI, nonce or client nonce that cannot be written into the header).
    package func authorization(
        credential: PasswordCredential, method: String, uri: String, body: DigestEntityBody = .unavailable,
        nonceCount: UInt32 = 1, clientNonce: String, sessionClientNonce: String? = nil, preferAuthInt: Bool = false
    ) throws(HTTPAuthError) -> DigestAuthorization {
        try authorization(
            credential: credential, method: method, uri: uri, body: body, nonceCount: nonceCount,
            clientNonce: clientNonce, sessionClientNonce: sessionClientNonce, preferAuthInt: preferAuthInt,
            math: DigestMath(algorithm.hashFunction)
        )
    }

    func authorization(
        credential: PasswordCredential, method: String, uri: String, body: DigestEntityBody,
        nonceCount: UInt32, clientNonce: String, sessionClientNonce: String?, preferAuthInt: Bool, math: DigestMath
    ) throws(HTTPAuthError) -> DigestAuthorization {
        guard AuthListSyntax.isToken(method.utf8) else { throw .invalidCharacter("request method") }
        guard !uri.isEmpty, !BasicAuthorization.containsControl(uri), let quotedURI = AuthListSyntax.quoted(uri) else {
            throw .invalidCharacter("request URI")
        }
        guard !clientNonce.isEmpty, !BasicAuthorization.containsControl(clientNonce),
            let quotedClientNonce = AuthListSyntax.quoted(clientNonce)
        else { throw .invalidCharacter("client nonce") }
        guard let quotedRealm = AuthListSyntax.quoted(realm), let quotedNonce = AuthListSyntax.quoted(nonce) else {
            throw .invalidCharacter("challenge")
        }
        let credential = charsetUTF8 ? credential.normalized : credential
        let qop = try chooseQOP(body: body, preferAuthInt: preferAuthInt)
        let sessionNonce = algorithm.isSession ? (sessionClientNonce ?? clientNonce) : nil

        let ha1 = math.ha1(
            user: credential.user, realm: realm, password: credential.password,
            session: sessionNonce.map { (nonce, $0) }
        )
        let ha2 = math.ha2(method: method, uri: uri, bodyHash: qop == .authInt ? math.bodyHash(body) : nil)
        let nc = qop == nil ? nil : Self.formatNonceCount(nonceCount)
        let cnonce = qop == nil ? nil : clientNonce
        let response = math.response(ha1: ha1, nonce: nonce, nonceCount: nc, clientNonce: cnonce, qop: qop, ha2: ha2)

        var parts: [String] = []
        if userhash {
            parts.append("username=\"" + math.h(credential.user + ":" + realm) + "\"")
        } else if credential.user.unicodeScalars.allSatisfy({ (0x20...0x7E).contains($0.value) }),
            let quotedUser = AuthListSyntax.quoted(credential.user)
        {
            parts.append("username=" + quotedUser)
        } else {
            // Not expressible as a plain quoted-string: RFC 7616 §3.4.4 with RFC 8187 encoding.
            parts.append("username*=" + Self.extValue(credential.user))
        }
        parts.append("realm=" + quotedRealm)
        parts.append("uri=" + quotedURI)
        if let algorithmParameter, AuthListSyntax.isToken(algorithmParameter.utf8) {
            parts.append("algorithm=" + algorithmParameter)
        } else if algorithmParameter != nil {
            parts.append("algorithm=" + algorithm.rawValue)
        }
        parts.append("nonce=" + quotedNonce)
        if let qop, let nc {
            parts.append("nc=" + nc)
            parts.append("cnonce=" + quotedClientNonce)
            parts.append("qop=" + qop.rawValue)
        }
        parts.append("response=\"" + response + "\"")
        if let opaque {
            guard let quotedOpaque = AuthListSyntax.quoted(opaque) else { throw .invalidCharacter("challenge") }
            parts.append("opaque=" + quotedOpaque)
        }
        if userhash { parts.append("userhash=true") }

        return DigestAuthorization(
            headerValue: "Digest " + parts.joined(separator: ", "), response: response, algorithm: algorithm,
            realm: realm, nonce: nonce, uri: uri, qop: qop, nonceCount: qop == nil ? nil : nonceCount,
            clientNonce: cnonce, sessionClientNonce: sessionNonce
        )
    }

    /// Checks the server's `rspauth` (RFC 7616 §3.5): the response computed with an empty
    /// method in A2, which only a server that knows H(A1) can produce.
    ///
    /// - Parameter responseBody: the response's body, needed only for `auth-int`.
    package func verifyResponseAuth(
        _ info: AuthenticationInfo, credential: PasswordCredential, authorization: DigestAuthorization,
        responseBody: DigestEntityBody = .unavailable
    ) -> ResponseAuthVerdict {
        verifyResponseAuth(info, credential: credential, authorization: authorization, responseBody: responseBody, math: DigestMath(algorithm.hashFunction))
    }

    func verifyResponseAuth(
        _ info: AuthenticationInfo, credential: PasswordCredential, authorization: DigestAuthorization,
        responseBody: DigestEntityBody, math: DigestMath
    ) -> ResponseAuthVerdict {
        guard let rspauth = info.responseAuth else { return .notProvided }
        if let cnonce = info.clientNonce, cnonce != authorization.clientNonce { return .mismatch }
        if info[parameter: "nc"] != nil, info.nonceCount != authorization.nonceCount { return .mismatch }
        if let qop = info.qop, qop != authorization.qop?.rawValue { return .mismatch }
        let credential = charsetUTF8 ? credential.normalized : credential
        var bodyHash: String? = nil
        if authorization.qop == .authInt {
            guard let hash = math.bodyHash(responseBody) else { return .cannotVerify }
            bodyHash = hash
        }
        let ha1 = math.ha1(
            user: credential.user, realm: authorization.realm, password: credential.password,
            session: authorization.sessionClientNonce.map { (authorization.nonce, $0) }
        )
        let ha2 = math.ha2(method: "", uri: authorization.uri, bodyHash: bodyHash)
        let expected = math.response(
            ha1: ha1, nonce: authorization.nonce, nonceCount: authorization.nonceCount.map(Self.formatNonceCount),
            clientNonce: authorization.clientNonce, qop: authorization.qop, ha2: ha2
        )
        return Self.constantTimeEqual(expected, AuthListSyntax.lowercasedASCII(rspauth)) ? .verified : .mismatch
    }

    /// RFC 8187 `ext-value`: `UTF-8''` and the UTF-8 bytes, percent-encoding all but attr-char.
    static func extValue(_ text: String) -> String {
        let digits = Array("0123456789ABCDEF".utf8)
        var out = Array("UTF-8''".utf8)
        for byte in text.utf8 {
            let isAttrChar: Bool
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "!"), UInt8(ascii: "#"), UInt8(ascii: "$"),
                UInt8(ascii: "&"), UInt8(ascii: "+"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "^"),
                UInt8(ascii: "_"), UInt8(ascii: "`"), UInt8(ascii: "|"), UInt8(ascii: "~"):
                isAttrChar = true
            default:
                isAttrChar = false
            }
            if isAttrChar {
                out.append(byte)
            } else {
                out += [UInt8(ascii: "%"), digits[Int(byte >> 4)], digits[Int(byte & 0xF)]]
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Compares without an early exit, so timing does not reveal how much of a guess matched.
    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8)
        let y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for index in x.indices { difference |= x[index] ^ y[index] }
        return difference == 0
    }
}
