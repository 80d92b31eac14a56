import NIOHTTP1

/// Which requests the client connection's direct relay may take, judged by the request head
/// alone (the daemon then checks the origin, the route and the pool).
///
/// The direct relay forwards a request and its response with channel handlers only, so it takes
/// only what needs none of the broker's decisions: a body-less HTTP/1.1 keep-alive `GET` or
/// `HEAD` with no credential of its own, no `Authbroker-*` directive, no `Expect` and no
/// `Upgrade`. Everything else takes the full path, which handles all of these.
package enum DirectRelayPolicy {
    /// Fields that need the full path: credentials (kept, persisted or answered there),
    /// `Expect` (100-continue), `Upgrade`, and any body framing.
    private static let fieldsNeedingFullPath = [
        "authorization", "proxy-authorization", "expect", "upgrade", "content-length", "transfer-encoding",
    ]

    package static func headAllows(_ head: HTTPRequestHead) -> Bool {
        // A switch: `HTTPMethod`'s `==` compares the methods' names as strings.
        switch head.method {
        case .GET, .HEAD: break
        default: return false
        }
        guard head.version == .http1_1, head.isKeepAlive else { return false }
        for (name, _) in head.headers {
            if ProxyHeaders.isDirective(name) || Self.fieldsNeedingFullPath.contains(where: { ProxyHeaders.fieldName(name, is: $0) }) {
                return false
            }
        }
        return true
    }
}
