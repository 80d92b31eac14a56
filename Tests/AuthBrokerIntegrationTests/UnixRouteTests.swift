import Foundation
import Testing
import TestSupport

/// `[[route]]`: an origin reached over a Unix socket (a Docker-style API), by the socket's data
/// plane and by unmodified programs through the proxy port; TLS over the socket for https://.
@Suite("Unix-socket routes", .serialized)
struct UnixRouteTests {
    @Test("http:// and https:// to a routed host reach the server on the Unix socket; trust still applies to the host")
    func routedHostsOverUnixSockets() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let plain = try await TestOrigin.start(name: "docker", unixSocketPath: directory + "/docker.sock")
        defer { Task { await plain.stop() } }
        let ca = try TestPKI.makeCA(commonName: "Socket CA")
        let secure = try await TestOrigin.start(
            name: "secure-socket", identity: try TestPKI.makeLeaf(dnsNames: ["vault.local"], issuer: ca), unixSocketPath: directory + "/vault.sock"
        )
        defer { Task { await secure.stop() } }
        let config = """
            [upstream]
            # A proxy that does not exist: routed hosts never go through it.
            proxy = "http://127.0.0.1:9"

            [[route]]
            host = "docker.local"
            unix = "\(directory)/docker.sock"

            [[route]]
            host = "vault.local"
            unix = "\(directory)/vault.sock"

            [[route]]
            host = "gone.local"
            unix = "\(directory)/nothing-here.sock"
            """
        try await withDaemon(config: config) { daemon in
            let socket = try UnixSocketConnection(path: daemon.socketPath)
            let containers = try socket.request("GET", "http://docker.local/hello")
            #expect(containers.status == 200)
            #expect(containers.text == "hello from docker")
            // An unmodified program through the proxy port.
            let curl = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "http://docker.local/hello"])
            #expect(curl.status == 0 && curl.stdout == "hello from docker", "\(curl.stderr)")

            // TLS over the socket, judged for the host: refused until its CA is an anchor.
            let untrusted = try socket.request("GET", "https://vault.local/hello")
            #expect(untrusted.status == 502)
            #expect(untrusted.header("Authbroker-Error") == "untrusted_server")
            let anchor = try UnixSocketConnection(path: daemon.socketPath).request(
                "POST", "/v1/anchors", headers: [("Content-Type", "application/json")], body: jsonBody(["pem": ca.pem, "hosts": ["vault.local"]])
            )
            #expect(anchor.status == 201)
            let trusted = try UnixSocketConnection(path: daemon.socketPath).request("GET", "https://vault.local/hello")
            #expect(trusted.status == 200 && trusted.text == "hello from secure-socket")

            // A route to a socket nobody made: the broker's error names it.
            let gone = try UnixSocketConnection(path: daemon.socketPath).request("GET", "http://gone.local/")
            #expect(gone.status == 502)
            #expect((gone.json["detail"] as? String)?.contains("nothing-here.sock") == true, "\(gone.json)")
            #expect((gone.json["detail"] as? String)?.contains("does not exist") == true)
        }
    }
}
