import AuthBrokerCore
import Testing

/// A route's hash is computed once; equality and dictionary look-ups must still follow every field.
@Suite("UpstreamRoute")
struct UpstreamRouteTests {
    @Test func equalExactlyWhenEveryFieldIs() throws {
        let origin = try CanonicalOrigin(scheme: .https, host: "api.corp.test", port: 443)
        let other = try CanonicalOrigin(scheme: .https, host: "api.corp.test", port: 8443)
        let proxy = try CanonicalOrigin(scheme: .http, host: "proxy.corp.test", port: 3128)
        let routes = [
            UpstreamRoute(origin), UpstreamRoute(other), UpstreamRoute(origin, clientIdentity: "work"),
            UpstreamRoute(origin, clientIdentity: "home"), UpstreamRoute(origin, proxy: proxy),
            UpstreamRoute(origin, clientIdentity: "work", proxy: proxy),
            UpstreamRoute(origin, keyLogged: true), UpstreamRoute(origin, clientIdentity: "work", keyLogged: true),
        ]
        for (i, a) in routes.enumerated() {
            for (j, b) in routes.enumerated() {
                #expect((a == b) == (i == j), "\(a) vs \(b)")
            }
        }
        #expect(UpstreamRoute(origin, clientIdentity: "work") == UpstreamRoute(origin, clientIdentity: "work"))
        #expect(UpstreamRoute(origin).hashValue == UpstreamRoute(origin).hashValue)
        var pool: [UpstreamRoute: Int] = [:]
        for (index, route) in routes.enumerated() { pool[route] = index }
        #expect(pool.count == routes.count)
        #expect(pool[UpstreamRoute(origin, clientIdentity: "work", proxy: proxy)] == 5)
        #expect(pool[UpstreamRoute(origin, clientIdentity: "other")] == nil)
    }
}
