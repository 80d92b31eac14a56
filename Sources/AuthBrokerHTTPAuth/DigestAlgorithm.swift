import Crypto

/// A Digest `algorithm` value the broker can answer (RFC 7616 §3.3, §6.1).
///
/// The `-sess` forms hash the nonce and client nonce into A1, so the session key changes with
/// every server nonce (RFC 7616 §3.4.2).
///
/// - Warning: MD5 is kept only for backward compatibility (RFC 7616 §3.3 and §5.12); a captured
///   MD5 response allows an offline guess of the password. The broker prefers the SHA-2 forms
///   whenever a server offers them.
package enum DigestAlgorithm: String, Sendable, Hashable, CaseIterable, Codable {
    case md5 = "MD5"
    case md5Session = "MD5-sess"
    case sha256 = "SHA-256"
    case sha256Session = "SHA-256-sess"
    case sha512_256 = "SHA-512-256"
    case sha512_256Session = "SHA-512-256-sess"

    /// The algorithm a token names, case-insensitively; nil for one the broker does not know.
    package init?(token: String) {
        let lower = AuthListSyntax.lowercasedASCII(token)
        guard let match = Self.allCases.first(where: { AuthListSyntax.lowercasedASCII($0.rawValue) == lower }) else {
            return nil
        }
        self = match
    }

    /// Whether this is a `-sess` variant.
    package var isSession: Bool {
        switch self {
        case .md5Session, .sha256Session, .sha512_256Session: true
        case .md5, .sha256, .sha512_256: false
        }
    }

    /// The hash function underneath.
    package var hashFunction: DigestHashFunction {
        switch self {
        case .md5, .md5Session: .md5
        case .sha256, .sha256Session: .sha256
        case .sha512_256, .sha512_256Session: .sha512_256
        }
    }

    /// Higher is stronger: the order in which the broker prefers algorithms when a server offers
    /// several challenges (SHA-512-256 > SHA-256 > MD5; a `-sess` form ranks with its base).
    package var strength: Int {
        switch hashFunction {
        case .md5: 1
        case .sha256: 2
        case .sha512_256: 3
        }
    }
}

/// The hash functions behind the Digest algorithms.
package enum DigestHashFunction: Sendable, Hashable {
    case md5
    case sha256
    case sha512_256

    /// H(data) as lower-case hex, the form Digest feeds into the next hash (RFC 7616 §3.4).
    package func hex(_ bytes: some Sequence<UInt8>) -> String {
        var hasher = DigestBodyHasher(self)
        hasher.update(bytes)
        return hasher.finalizeHex()
    }

    package func hex(_ text: String) -> String { hex(text.utf8) }
}

/// Hashes an entity body as it streams, for `qop=auth-int` (RFC 7616 §3.4.3), so that the
/// daemon need not keep the body around just to hash it.
package struct DigestBodyHasher: Sendable {
    private enum State: Sendable {
        case md5(Insecure.MD5)
        case sha256(SHA256)
        case sha512_256(SHA512_256)
    }

    private var state: State

    package init(_ function: DigestHashFunction) {
        switch function {
        case .md5: state = .md5(Insecure.MD5())
        case .sha256: state = .sha256(SHA256())
        case .sha512_256: state = .sha512_256(SHA512_256())
        }
    }

    package mutating func update(_ bytes: some Sequence<UInt8>) {
        let array = Array(bytes)
        switch state {
        case .md5(var hasher):
            hasher.update(data: array)
            state = .md5(hasher)
        case .sha256(var hasher):
            hasher.update(data: array)
            state = .sha256(hasher)
        case .sha512_256(var hasher):
            hasher.update(array)
            state = .sha512_256(hasher)
        }
    }

    /// The digest as lower-case hex.
    package func finalizeHex() -> String {
        switch state {
        case .md5(let hasher): Self.hex(hasher.finalize())
        case .sha256(let hasher): Self.hex(hasher.finalize())
        case .sha512_256(let hasher): Self.hex(hasher.finalize())
        }
    }

    static func hex(_ bytes: some Sequence<UInt8>) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0xF)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}
