/// Which requests a rule (`[[respond]]`, `[[rewrite]]`) applies to: the method (if named, exactly),
/// the scheme (if named), the host (a host pattern) and a plain prefix of the path and query
/// (`/v1/` for a directory).
package struct RequestMatch: Sendable, Equatable {
    package var method: String?
    package var scheme: UpstreamScheme?
    package var host: HostPattern
    package var pathPrefix: String

    package init(method: String? = nil, scheme: UpstreamScheme? = nil, host: HostPattern, pathPrefix: String = "/") {
        self.method = method
        self.scheme = scheme
        self.host = host
        self.pathPrefix = pathPrefix
    }

    package func matches(method: String, origin: CanonicalOrigin, pathAndQuery: String) -> Bool {
        if let own = self.method, own != method { return false }
        if let scheme = self.scheme, scheme != origin.scheme { return false }
        return self.host.matches(origin.host) && pathAndQuery.hasPrefix(self.pathPrefix)
    }

    /// Whether it names only a host (and maybe a scheme): what a connection-level rule needs.
    package var isHostOnly: Bool { self.method == nil && self.pathPrefix == "/" }
}

/// `[[respond]]`: requests that match are answered from the config, without the network (for
/// tests, and for stubbing a service that is down). The first matching rule answers.
package struct CannedResponse: Sendable, Equatable {
    package var match: RequestMatch
    package var status: Int
    /// Fields sent with the body; never framing fields (the broker frames the body itself).
    package var headers: [Field]
    package var body: Body
    /// Where the rule is in config.toml, for the log and the `Authbroker-Rule` mark.
    package var line: Int

    /// The body: given inline, or read from a file at each answer (so it can be edited).
    package enum Body: Sendable, Equatable {
        case inline([UInt8])
        case file(String)
    }

    package struct Field: Sendable, Equatable {
        package var name: String
        package var value: String

        package init(name: String, value: String) {
            self.name = name
            self.value = value
        }
    }

    package init(match: RequestMatch, status: Int = 200, headers: [Field] = [], body: Body = .inline([]), line: Int) {
        self.match = match
        self.status = status
        self.headers = headers
        self.body = body
        self.line = line
    }

    /// The largest body a rule answers with (inline, or read from its file).
    package static let maxBodyBytes = 1 << 20

    package func matches(method: String, origin: CanonicalOrigin, pathAndQuery: String) -> Bool {
        self.match.matches(method: method, origin: origin, pathAndQuery: pathAndQuery)
    }

    /// `Name: value`, or why not: a token name, a value without CR, LF or NUL, and not a field
    /// the broker sets itself.
    package static func parseField(_ text: String) -> Result<Field, FieldError> {
        guard let colon = text.firstIndex(of: ":") else { return .failure(.noColon) }
        let name = String(text[..<colon])
        let value = String(text[text.index(after: colon)...]).trimmingSpacesAndTabs()
        guard !name.isEmpty, name.utf8.allSatisfy(HTTPSyntax.isTChar) else { return .failure(.badName) }
        guard !value.utf8.contains(where: { $0 == 0x0D || $0 == 0x0A || $0 == 0 }) else { return .failure(.badValue) }
        let lowered = name.lowercased()
        guard !RewriteRule.reserved.contains(lowered), !lowered.hasPrefix("authbroker-") else {
            return .failure(.reserved(name))
        }
        return .success(Field(name: name, value: value))
    }

    package enum FieldError: Error, Equatable {
        case noColon, badName, badValue
        case reserved(String)

        package var message: String {
            switch self {
            case .noColon: "write each header as \"Name: value\""
            case .badName: "the header name must be a token (letters, digits, and !#$%&'*+-.^_`|~)"
            case .badValue: "the header value may not hold a line break or NUL"
            case .reserved(let name): "\(name) is set by the broker itself; leave it out"
            }
        }
    }
}

extension String {
    /// Without leading and trailing spaces and tabs (HTTP's optional whitespace).
    fileprivate func trimmingSpacesAndTabs() -> String {
        var scalars = Substring(self)
        while let first = scalars.first, first == " " || first == "\t" { scalars.removeFirst() }
        while let last = scalars.last, last == " " || last == "\t" { scalars.removeLast() }
        return String(scalars)
    }
}
