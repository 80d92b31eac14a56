import Foundation
import Testing
import TestSupport

/// The daemon behind Debian's Squid as its upstream proxy: http and https (CONNECT) targets,
/// Squid's Basic and Digest 407s answered from a stored password, a wrong one refused once.
@Suite("Squid as the upstream proxy", .enabled(if: SquidProxy.isInstalled, "squid-openssl is not installed (scripts/install-deps test)"))
struct SquidInteropTests {
    static let user = "squid-user"
    static let password = "Squid-Secret-5"

    static func config(_ squid: SquidProxy) -> String {
        "[upstream]\nproxy = \"http://127.0.0.1:\(squid.port)\"\n"
    }

    @Test("Squid's 407 is answered from the store for http and https; 1000 requests take one 407", arguments: [SquidProxy.Scheme.basic, .digest])
    func storedPassword(scheme: SquidProxy.Scheme) async throws {
        let squid = try await SquidProxy.start(
            scheme: scheme, user: Self.user, password: Self.password, hosts: ["web.internal.test", "secure.internal.test"]
        )
        let origin = try await TestOrigin.start(name: "web")
        let ca = try TestPKI.makeCA(commonName: "Squid Test CA")
        let secure = try await TestOrigin.start(
            name: "tls", identity: try TestPKI.makeLeaf(dnsNames: ["secure.internal.test"], issuer: ca)
        )
        defer { Task { await squid.stop(); await origin.stop(); await secure.stop() } }
        try await withDaemon(config: Self.config(squid)) { daemon in
            #expect(try UpstreamProxyTests.storeProxyPassword(daemon, url: "http://127.0.0.1:\(squid.port)", user: Self.user, password: Self.password).status == 201)
            #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["secure.internal.test"]).status == 201)
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for index in 0..<1000 {
                let response = try connection.request("GET", "http://web.internal.test:\(origin.port)/hello?\(index)")
                guard response.status == 200, response.text == "hello from web" else {
                    Issue.record("request \(index) got \(response.status): \(response.text)\n\(squid.accessLog.suffix(2000))")
                    return
                }
            }
            let afterPlain = squid.proxyAuthenticationRequiredCount
            print("Squid \(scheme.rawValue), 1000 http requests: \(afterPlain) 407 round trips")
            #expect(afterPlain == 1)

            for _ in 0..<3 {
                let response = try connection.request("GET", "https://secure.internal.test:\(secure.port)/hello")
                #expect(response.status == 200, "\(response.text)")
                #expect(response.text == "hello from tls")
            }
            // The tunnel's CONNECT went with the known credential up front.
            #expect(squid.proxyAuthenticationRequiredCount == afterPlain, "\(squid.accessLog.suffix(2000))")
        }
    }

    @Test("a wrong stored password gets one 407 from Squid, is marked REFUSED, and the client gets the 407")
    func wrongPassword() async throws {
        let squid = try await SquidProxy.start(scheme: .basic, user: Self.user, password: Self.password, hosts: ["web.internal.test"])
        let origin = try await TestOrigin.start(name: "web")
        defer { Task { await squid.stop(); await origin.stop() } }
        try await withDaemon(config: Self.config(squid)) { daemon in
            try UpstreamProxyTests.storeProxyPassword(daemon, url: "http://127.0.0.1:\(squid.port)", user: Self.user, password: "wrong")
            let connection = try UnixSocketConnection(path: daemon.socketPath)
            for _ in 0..<3 {
                let response = try connection.request("GET", "http://web.internal.test:\(origin.port)/hello")
                #expect(response.status == 407)
                #expect(response.header("Proxy-Authenticate")?.hasPrefix("Basic ") == true)
            }
            // The first request: a 407, the stored password, its refusal; the next two: one 407
            // each, which goes to the client (the password would have made each two).
            #expect(squid.proxyAuthenticationRequiredCount == 4, "\(squid.accessLog)")
        }
    }
}
