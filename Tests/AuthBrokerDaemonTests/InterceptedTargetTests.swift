import AuthBrokerCore
@testable import AuthBrokerDaemon
import NIOHTTP1
import Testing

/// Targets inside an intercepted connection: made absolute for the CONNECT's origin, or refused
/// when they name anything else.
struct InterceptedTargetTests {
    static let origin = try! CanonicalOrigin(scheme: .https, host: "git.corp.example", port: 443)  // a valid literal origin
    static let odd = try! CanonicalOrigin(scheme: .https, host: "10.0.0.5", port: 8443)  // a valid literal origin

    @Test(arguments: [
        ("/", "https://git.corp.example/"),
        ("/repo.git/info/refs?service=git-upload-pack", "https://git.corp.example/repo.git/info/refs?service=git-upload-pack"),
        // A path that looks like an authority stays a path of this origin.
        ("//evil.example/x", "https://git.corp.example//evil.example/x"),
        ("/v1/status", "https://git.corp.example/v1/status"),
        ("https://git.corp.example/a", "https://git.corp.example/a"),
        ("https://GIT.corp.example:443/a", "https://GIT.corp.example:443/a"),
    ])
    func madeAbsolute(uri: String, expected: String) throws {
        #expect(try InterceptedTarget.absolute(uri, method: .GET, origin: Self.origin).get() == expected)
    }

    @Test(arguments: [
        "https://evil.example/", "http://git.corp.example/", "https://git.corp.example:8443/", "git.corp.example:443", "*",
        "", "a/b", "https://git.corp.example@evil.example/", "\u{0}/x", "https://[::1]/",
    ])
    func refused(uri: String) {
        #expect(throws: InterceptedTargetRefused.self) { try InterceptedTarget.absolute(uri, method: .GET, origin: Self.origin).get() }
    }

    @Test func connectInsideIsRefused() {
        #expect(throws: InterceptedTargetRefused.self) { try InterceptedTarget.absolute("/x", method: .CONNECT, origin: Self.origin).get() }
        #expect(throws: InterceptedTargetRefused.self) {
            try InterceptedTarget.absolute("git.corp.example:443", method: .CONNECT, origin: Self.origin).get()
        }
    }

    @Test func nonDefaultPortAndIPAddress() throws {
        #expect(try InterceptedTarget.absolute("/a", method: .POST, origin: Self.odd).get() == "https://10.0.0.5:8443/a")
        let refusal = #expect(throws: InterceptedTargetRefused.self) { try InterceptedTarget.absolute("https://10.0.0.5/a", method: .GET, origin: Self.odd).get() }
        #expect(refusal?.description.contains("10.0.0.5:8443") == true)
    }
}
