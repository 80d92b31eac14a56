import NIOHTTP1

/// `[[rewrite]]`: a matching request goes somewhere else, or with other header fields.
///
/// - `to`: another URL: the origin is replaced and the matched path prefix with the URL's path
///   (`/api/` to `https://new.example/v2/` makes `/api/items` `/v2/items`). The new origin's
///   trust, identities and passwords apply, as for any request to it.
/// - `connect_to`: the same URL and `Host`, connections to another address (like curl's
///   `--connect-to`); a server there must still prove it is the original host. Host-wide rules
///   only (no method or path), since it changes where the host's connections go.
/// - Request and response header fields set or removed (never framing fields, `Host` or the
///   broker's own `Authbroker-*`).
///
/// The first matching rule applies.
package struct RewriteRule: Sendable, Equatable {
    package var match: RequestMatch
    package var target: Target?
    package var setRequestHeaders: [CannedResponse.Field] = []
    /// Lower-case names.
    package var removeRequestHeaders: [String] = []
    package var setResponseHeaders: [CannedResponse.Field] = []
    package var removeResponseHeaders: [String] = []
    /// Where the rule is in config.toml.
    package var line: Int

    package enum Target: Sendable, Equatable {
        /// `to`: this origin, with `path` in place of the matched prefix.
        case url(CanonicalOrigin, path: String)
        /// `connect_to`: connections go to `host:port` instead.
        case connectTo(host: String, port: Int)
    }

    package init(match: RequestMatch, target: Target? = nil, line: Int) {
        self.match = match
        self.target = target
        self.line = line
    }

    /// Where the request goes after the rule: its origin and path and query.
    package func rewritten(origin: CanonicalOrigin, pathAndQuery: String) -> (origin: CanonicalOrigin, pathAndQuery: String) {
        guard case .url(let newOrigin, let path)? = self.target else { return (origin, pathAndQuery) }
        return (newOrigin, path + pathAndQuery.dropFirst(self.match.pathPrefix.count))
    }

    package func editRequest(_ headers: inout HTTPHeaders) {
        Self.edit(&headers, set: self.setRequestHeaders, remove: self.removeRequestHeaders)
    }

    package func editResponse(_ headers: inout HTTPHeaders) {
        Self.edit(&headers, set: self.setResponseHeaders, remove: self.removeResponseHeaders)
    }

    private static func edit(_ headers: inout HTTPHeaders, set: [CannedResponse.Field], remove: [String]) {
        for name in remove { headers.remove(name: name) }
        for field in set { headers.replaceOrAdd(name: field.name, value: field.value) }
    }

    /// A header name a rule may remove: a token that is not a framing field, `Host`, or the
    /// broker's own.
    package static func removableName(_ text: String) -> Result<String, CannedResponse.FieldError> {
        guard !text.isEmpty, text.utf8.allSatisfy(HTTPSyntax.isTChar) else { return .failure(.badName) }
        let lowered = text.lowercased()
        guard !Self.reserved.contains(lowered), !lowered.hasPrefix("authbroker-") else { return .failure(.reserved(text)) }
        return .success(lowered)
    }

    /// Fields a rule may neither set nor remove.
    static let reserved: Set<String> = ["content-length", "transfer-encoding", "connection", "host"]
}

/// Whether a rule applies to requests to `host`: such requests take the full path, and a
/// CONNECT to the host is intercepted so the rule can apply to what is inside.
extension BrokerRules {
    package func cover(host: String) -> Bool {
        self.responses.contains { $0.match.host.matches(host) } || self.rewrites.contains { $0.match.host.matches(host) }
    }

    /// Where connections to `host` go instead, by a host-wide `connect_to` rule.
    package func connectTarget(for host: String) -> (host: String, port: Int)? {
        for rule in self.rewrites where rule.match.host.matches(host) {
            if case .connectTo(let target, let port)? = rule.target { return (target, port) }
        }
        return nil
    }
}
