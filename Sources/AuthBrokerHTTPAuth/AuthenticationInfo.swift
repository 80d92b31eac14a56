/// The `Authentication-Info` (or `Proxy-Authentication-Info`) field of a response (RFC 7615),
/// with the parameters Digest defines for it (RFC 7616 §3.5).
package struct AuthenticationInfo: Sendable, Hashable {
    /// Every well-formed parameter, in order; a name given twice is ambiguous and left out.
    package var parameters: [AuthParameter]

    package init(parameters: [AuthParameter]) {
        self.parameters = parameters
    }

    /// Parses the values of the field's lines.
    ///
    /// Total, in the style of `AuthChallenge.parse`: the field is a bare `#auth-param` list
    /// (RFC 7615 §3), so an element that is not a parameter is skipped, a parameter named twice
    /// is dropped (both copies: which one the server meant is unknowable), and the same byte
    /// limits apply before any parsing.
    package init(parsing fieldValues: some Sequence<String>) {
        var seen: [String: Int] = [:]
        var collected: [AuthParameter] = []
        var budget = AuthChallenge.maxTotalBytes
        for line in fieldValues {
            let count = line.utf8.count
            guard count <= AuthChallenge.maxFieldLineBytes, count <= budget else { break }
            budget -= count
            for element in AuthListSyntax.splitList(Array(line.utf8)[...]) where !element.isEmpty {
                guard case .parameter(let name, let value) = AuthListSyntax.classify(element) else { continue }
                let parameter = AuthParameter(name: name, value: value)
                seen[parameter.lowercasedName, default: 0] += 1
                if collected.count < AuthChallenge.maxParametersPerChallenge {
                    collected.append(parameter)
                }
            }
        }
        self.parameters = collected.filter { seen[$0.lowercasedName] == 1 }
    }

    package init(parsing fieldValue: String) {
        self.init(parsing: CollectionOfOne(fieldValue))
    }

    package subscript(parameter name: String) -> String? {
        let wanted = AuthListSyntax.lowercasedASCII(name)
        return parameters.first { $0.lowercasedName == wanted }?.value
    }

    /// The nonce the server wants the next request to use (RFC 7616 §3.5).
    package var nextNonce: String? { self[parameter: "nextnonce"] }
    /// The qop of the request this answers, lower-cased.
    package var qop: String? { self[parameter: "qop"].map(AuthListSyntax.lowercasedASCII) }
    /// The server's proof that it knows the credentials.
    package var responseAuth: String? { self[parameter: "rspauth"] }
    package var clientNonce: String? { self[parameter: "cnonce"] }
    /// `nc` read as 8 hex digits; nil when absent or not 8 hex digits.
    package var nonceCount: UInt32? {
        guard let text = self[parameter: "nc"], text.utf8.count == 8,
            text.utf8.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 | 0x20 >= 0x61 && $0 | 0x20 <= 0x66) })
        else { return nil }
        return UInt32(text, radix: 16)
    }
}
