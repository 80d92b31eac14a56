import Foundation
import Testing
import TestSupport

/// The Apache httpd fixture: a production server's Basic and Digest, reached with curl and with
/// the broker's own Digest code.
@Suite(
    "ApacheAuthServer fixture",
    .enabled(if: ApacheAuthServer.isInstalled, "apache2 is not installed: apt-get install -y apache2 apache2-utils (scripts/install-deps test)")
)
struct ApacheAuthServerTests {
    static func curl(_ arguments: [String]) throws -> (status: Int, body: String) {
        let result = try ExternalCommand.run("/usr/bin/curl", ["-sS", "-w", "\n%{http_code}"] + arguments)
        let lines = result.stdout.split(separator: "\n", omittingEmptySubsequences: false)
        return (Int(lines.last ?? "") ?? -1, lines.dropLast().joined(separator: "\n"))
    }

    /// Runs `body` with a started Apache, and always stops it.
    static func withApache(_ body: (ApacheAuthServer) async throws -> Void) async throws {
        let apache = try await ApacheAuthServer.start(user: "alice", password: "secret")
        do {
            try await body(apache)
        } catch {
            print("apache2 error log for the failed test:\n\(apache.errorLog)")
            await apache.stop()
            throw error
        }
        await apache.stop()
    }

    @Test("curl: Basic and Digest answered give 200; no or wrong credentials give 401; /public/ is open")
    func curlBasicAndDigest() async throws {
        try await Self.withApache { apache async throws in
            #expect(try Self.curl(["-u", "alice:secret", apache.url("/basic/")]) == (200, "basic ok\n"))
            #expect(try Self.curl([apache.url("/basic/")]).status == 401)
            #expect(try Self.curl(["-u", "alice:guess", apache.url("/basic/")]).status == 401)

            #expect(try Self.curl(["--digest", "-u", "alice:secret", apache.url("/digest/")]) == (200, "digest ok\n"))
            #expect(try Self.curl([apache.url("/digest/")]).status == 401)
            #expect(try Self.curl(["--digest", "-u", "alice:guess", apache.url("/digest/")]).status == 401)
            #expect(apache.errorLog.contains("password mismatch"))

            #expect(try Self.curl([apache.url("/public/")]) == (200, "public ok\n"))
        }
    }

    @Test("the broker's Digest code: Apache's challenge, rspauth verified, nc 2 accepted, a replayed nc refused; stop() frees the port")
    func brokerDigestAgainstApache() async throws {
        let apache = try await ApacheAuthServer.start(user: "alice", password: "secret")
        let target = "/digest/"
        let connection = try UnixSocketConnection(tcpPort: apache.port)
        let bare = try connection.request("GET", target)
        #expect(bare.status == 401)
        let basic = try UnixSocketConnection(tcpPort: apache.port).request("GET", "/basic/")
        #expect(basic.header("WWW-Authenticate") == #"Basic realm="basic@apache""#)

        let field = try #require(bare.header("WWW-Authenticate"))
        var answerer = try TestDigestAnswerer(wwwAuthenticate: field, user: "alice", password: "secret")
        #expect(answerer.realm == ApacheAuthServer.digestRealm)
        #expect(answerer.algorithm == "MD5")
        #expect(answerer.qopOptions == ["auth"])

        let first = try answerer.authorization(uri: target, nonceCount: 1)
        let ok = try connection.request("GET", target, headers: [("Authorization", first)])
        #expect(ok.status == 200)
        #expect(ok.text == "digest ok\n")
        let info = try #require(ok.header("Authentication-Info"))
        #expect(answerer.verify(authenticationInfo: info, responseBody: ok.body) == "verified")

        let second = try answerer.authorization(uri: target, nonceCount: 2)
        #expect(try connection.request("GET", target, headers: [("Authorization", second)]).status == 200)
        // AuthDigestNcCheck On: the first header again is a replay.
        #expect(try connection.request("GET", target, headers: [("Authorization", first)]).status == 401)
        connection.close()

        await apache.stop()
        #expect((try? UnixSocketConnection(tcpPort: apache.port)) == nil)
        #expect(!FileManager.default.fileExists(atPath: apache.directory))
    }
}
