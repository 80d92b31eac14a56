import Foundation
import Testing
import TestSupport

/// Trust material scoped to a public suffix would reach servers of unrelated owners: anchors,
/// client identities and exceptions refuse such wildcards, through the API and the CLI alike,
/// and the error names the suffix. (Debian's publicsuffix package is installed by
/// scripts/install-deps, so the daemon reads the real list.)
@Suite("Host patterns that cover a public suffix")
struct PublicSuffixScopeTests {
    @Test("anchors add, identities import and exceptions add refuse *.co.uk, *.com, *.github.io; *.corp.co.uk is fine")
    func refused() async throws {
        let ca = try TestPKI.makeCA(commonName: "Suffix Test CA")
        let client = try TestPKI.makeClient(commonName: "suffix-client", issuer: ca)
        try await withDaemon { daemon in
            let anchor = try addAnchor(daemon, pem: ca.pem, hosts: ["*.co.uk"])
            #expect(anchor.status == 400, "\(anchor.text)")
            #expect(anchor.json["code"] as? String == "public_suffix_pattern")
            #expect((anchor.json["detail"] as? String)?.contains("co.uk") == true)
            let anchors = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/anchors")
            #expect((anchors.json["anchors"] as? [Any])?.isEmpty == true, "the refused anchor was stored")

            let exception = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/exceptions", headers: [("Content-Type", "application/json")],
                body: jsonBody(["host": "*.github.io", "sha256": String(repeating: "ab", count: 32)])
            )
            #expect(exception.status == 400, "\(exception.text)")
            #expect(exception.json["code"] as? String == "public_suffix_pattern")

            // The CLI shows the daemon's words and exits 7.
            let pemPath = daemon.directory + "/ca.pem"
            try ca.pem.write(toFile: pemPath, atomically: true, encoding: .utf8)
            let cli = try CLIAndClientsTests.ctl(daemon, ["anchors", "add", pemPath, "--hosts", "*.com"])
            #expect(cli.status == 7, "\(cli.stderr)")
            #expect(cli.stderr.contains("public suffix com"), "\(cli.stderr)")

            let cert = daemon.directory + "/id.crt", key = daemon.directory + "/id.key"
            try client.pem.write(toFile: cert, atomically: true, encoding: .utf8)
            try client.privateKeyPEM.write(toFile: key, atomically: true, encoding: .utf8)
            let identity = try CLIAndClientsTests.ctl(
                daemon, ["identities", "import", "--cert", cert, "--key", key, "--name", "wide", "--hosts", "*.co.uk"]
            )
            #expect(identity.status == 7, "\(identity.stderr)")
            #expect(identity.stderr.contains("co.uk"))

            // Below a registrable name is fine.
            #expect(try addAnchor(daemon, pem: ca.pem, hosts: ["*.corp.co.uk", "*.internal.test"]).status == 201)
            let scoped = try CLIAndClientsTests.ctl(
                daemon, ["identities", "import", "--cert", cert, "--key", key, "--name", "narrow", "--hosts", "*.corp.co.uk"]
            )
            #expect(scoped.status == 0, "\(scoped.stderr)")
        }
    }
}
