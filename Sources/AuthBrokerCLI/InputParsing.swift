import AuthBrokerCore
import Foundation

/// Why a command-line value was rejected, in words fit for the user.
package struct InputError: Error, Sendable, Equatable, CustomStringConvertible {
    package var message: String
    package init(_ message: String) { self.message = message }
    package var description: String { message }
}

/// An `http`/`https` URL checked and put in absolute form (RFC 9112 §3.2.2), ready to be the
/// request target of a data-plane request.
///
/// Parsed by the daemon's own `RequestTarget` parser, so the CLI refuses exactly what the
/// daemon would refuse, with the same words. The fragment is dropped first, as curl does: it
/// is never sent (RFC 9110 §4.2.5).
package struct FetchTarget: Sendable, Equatable {
    package var origin: CanonicalOrigin
    /// `/` for an empty path, otherwise the path and query as typed.
    package var pathAndQuery: String

    /// `scheme://host[:port]/path?query`, the request target sent to the daemon.
    package var absoluteForm: String { origin.description + pathAndQuery }

    package init(parsing input: String, allowedSchemes: Set<UpstreamScheme> = [.http, .https]) throws {
        let withoutFragment = String(input.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false)[0])
        switch RequestTarget.parse(method: "GET", uri: withoutFragment) {
        case .success(.absolute(let origin, let pathAndQuery)):
            guard allowedSchemes.contains(origin.scheme) else {
                let allowed = allowedSchemes.map(\.rawValue).sorted().joined(separator: " or ")
                throw InputError("'\(origin.description)' is an \(origin.scheme.rawValue) URL; only \(allowed) URLs are accepted here")
            }
            self.origin = origin
            self.pathAndQuery = pathAndQuery
        case .success:
            throw InputError(
                "'\(HumanFormat.sanitized(input))' is not an absolute URL; write it as https://host/path"
            )
        case .failure(let error):
            throw InputError(error.message)
        }
    }
}

/// One `-H 'Name: value'` request header, checked against RFC 9110 §5.
package struct HeaderLine: Sendable, Equatable {
    package var name: String
    package var value: String

    /// Headers whose framing or routing role belongs to authbrokerctl and the broker, not the user.
    private static let reserved: [String: String] = [
        "host": "it is taken from the URL",
        "content-length": "authbrokerctl frames the body itself",
        "transfer-encoding": "authbrokerctl frames the body itself",
        "connection": "it is hop-by-hop and authbrokerctl manages the connection",
        "upgrade": "protocol upgrades are not supported",
        "keep-alive": "it is hop-by-hop",
        "te": "it is hop-by-hop",
        "proxy-connection": "it is hop-by-hop",
    ]

    package init(parsing line: String) throws {
        guard let colon = line.firstIndex(of: ":") else {
            throw InputError("header '\(HumanFormat.sanitized(line))' has no ':'; write it as 'Name: value'")
        }
        let name = String(line[..<colon])
        guard !name.isEmpty, name.unicodeScalars.allSatisfy(Self.isTokenCharacter) else {
            throw InputError(
                "header name '\(HumanFormat.sanitized(name))' is not a valid field name (RFC 9110 §5.1: letters, digits and !#$%&'*+-.^_`|~ only)"
            )
        }
        let rawValue = line[line.index(after: colon)...]
        let value = String(Substring(rawValue).trimmingASCIIWhitespace())
        guard value.unicodeScalars.allSatisfy({ $0 == "\t" || ($0.value >= 0x20 && $0.value != 0x7F) }) else {
            throw InputError("header '\(name)' has a control character (such as a line break) in its value")
        }
        if let reason = Self.reserved[name.lowercased()] {
            throw InputError("header '\(name)' cannot be set with -H: \(reason)")
        }
        self.name = name
        self.value = value
    }

    static func isTokenCharacter(_ scalar: Unicode.Scalar) -> Bool {
        switch scalar {
        case "a"..."z", "A"..."Z", "0"..."9": true
        case "!", "#", "$", "%", "&", "'", "*", "+", "-", ".", "^", "_", "`", "|", "~": true
        default: false
        }
    }
}

/// An HTTP method given with `-X`: any RFC 9110 §9.1 token.
package enum MethodName {
    package static func validate(_ method: String) throws -> String {
        guard !method.isEmpty, method.unicodeScalars.allSatisfy(HeaderLine.isTokenCharacter) else {
            throw InputError("'\(HumanFormat.sanitized(method))' is not an HTTP method (a token such as GET or POST)")
        }
        return method
    }
}

/// SHA-256 certificate fingerprints as users type them: hex with or without colons, any case.
package enum Fingerprint {
    /// 64 lower-case hex digits, or nil when `text` is not a SHA-256 fingerprint.
    package static func normalizedHex(_ text: String) -> String? {
        let hex = text.filter { $0 != ":" && !$0.isWhitespace }.lowercased()
        guard hex.count == 64, hex.allSatisfy(\.isHexDigit) else { return nil }
        return hex
    }

    /// Whether two fingerprints name the same certificate, whatever their punctuation.
    package static func matches(_ a: String, _ b: String) -> Bool {
        guard let a = normalizedHex(a), let b = normalizedHex(b) else { return false }
        return a == b
    }
}

/// An anchor id or a prefix of one, as `anchors remove` accepts it.
package enum AnchorID {
    /// Lower-case hex without colons; at least 8 digits so a prefix is unlikely to be ambiguous.
    package static func normalize(_ text: String) throws -> String {
        let hex = text.filter { $0 != ":" && !$0.isWhitespace }.lowercased()
        guard hex.count >= 8, hex.count <= 64, hex.allSatisfy(\.isHexDigit) else {
            throw InputError(
                "'\(HumanFormat.sanitized(text))' is not an anchor id; give at least 8 hex digits of the id that 'authbrokerctl anchors list' shows"
            )
        }
        return hex
    }
}

/// Host patterns from repeated and comma-separated `--hosts` values.
package enum HostPatterns {
    /// Each pattern, split at commas and trimmed, checked with the daemon's `HostPattern`
    /// parser so a typo fails before anything is sent.
    package static func parse(_ values: [String]) throws -> [String] {
        let patterns = values.flatMap { $0.split(separator: ",") }
            .map { String($0.trimmingASCIIWhitespace()) }
            .filter { !$0.isEmpty }
        for pattern in patterns {
            do {
                _ = try HostPattern(parsing: pattern)
            } catch {
                throw InputError("--hosts: \(error.message)")
            }
        }
        return patterns
    }
}

/// An SPKI pin value: the base64 SHA-256 of a SubjectPublicKeyInfo (RFC 7469 §2.4 form).
package enum SPKIPin {
    /// The canonical base64 of the 32-byte digest; accepts curl's `sha256//` prefix.
    package static func normalize(_ text: String) throws -> String {
        var value = text.trimmingCharacters(in: .whitespaces)
        if value.lowercased().hasPrefix("sha256//") { value = String(value.dropFirst("sha256//".count)) }
        guard let digest = Data(base64Encoded: value), digest.count == 32 else {
            throw InputError(
                "'\(HumanFormat.sanitized(text))' is not a base64 SHA-256 of a public key (44 characters ending in '='); "
                    + "'authbrokerctl anchors trust-server URL' shows the value for each certificate a server presents"
            )
        }
        return digest.base64EncodedString()
    }
}
