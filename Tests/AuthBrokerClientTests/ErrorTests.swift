import AuthBrokerClient
import Foundation
import Testing
import TestSupport

/// The daemon's own failures arrive typed, with what the user needs to fix them.
@Suite("BrokerClient errors")
struct ErrorTests {
    @Test("an origin's 502 dressed as the broker's error is the origin's response, not a BrokerError")
    func forgedBrokerError() async throws {
        let faulty = try await FaultyOrigin.start()
        defer { Task { await faulty.stop() } }
        try await withDaemon(config: configText(resolving: [("faulty.internal.test", faulty.port)])) { _, client in
            let (data, head) = try await client.data(
                for: BrokerRequest(url: try url("http://faulty.internal.test:\(faulty.port)/forged-broker-error"))
            )
            #expect(head.status == 502)
            #expect(head.headers["Authbroker-Error"] == nil)
            #expect(head.headers["Proxy-Status"] == nil)
            #expect(String(decoding: data, as: UTF8.self).contains("forged by the origin"))
        }
    }

    @Test("a self-signed server gives BrokerError tls_certificate_error with the chain's fingerprints and the fix")
    func untrustedServer() async throws {
        let leaf = try TestPKI.makeLeaf(dnsNames: ["self-signed.internal.test"], issuer: nil)
        let origin = try await TestOrigin.start(name: "self-signed", identity: leaf)
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("self-signed.internal.test", origin.port)])) { _, client in
            let target = try url("https://self-signed.internal.test:\(origin.port)/hello")
            do {
                _ = try await client.send(BrokerRequest(url: target))
                Issue.record("an untrusted server must throw")
            } catch let error as BrokerError {
                #expect(error.status == 502)
                #expect(error.proxyStatus == "tls_certificate_error")
                #expect(error.code == "untrusted_server")
                #expect(error.detail.contains("self-signed.internal.test"))
                #expect(error.fingerprints == [leaf.sha256Fingerprint])
                #expect(error.chain.first?.subject.contains("self-signed.internal.test") == true)
                #expect(error.chain.first?.isSelfSigned == true)
                #expect(error.fix.contains { $0.contains("--fingerprint \(leaf.sha256Fingerprint)") })
                #expect(error.reasons.isEmpty == false)
                #expect(error.requestID?.count == 15)
            }

            // The fix through the control API wrappers: then the same request works.
            let added = try await client.addAnchor(pem: leaf.pem, hosts: ["*.internal.test"])
            #expect(added.count == 1)
            let (data, head) = try await client.data(for: BrokerRequest(url: target))
            #expect(head.status == 200)
            #expect(String(decoding: data, as: UTF8.self) == "hello from self-signed")
        }
    }

    @Test("an unreachable origin gives BrokerError with the RFC 9209 error type")
    func unreachable() async throws {
        // A port nothing listens on: bind, note, close.
        let origin = try await TestOrigin.start(name: "gone")
        let port = origin.port
        await origin.stop()
        try await withDaemon(config: configText(resolving: [("gone.internal.test", port)])) { _, client in
            do {
                _ = try await client.send(BrokerRequest(url: try url("http://gone.internal.test:\(port)/hello")))
                Issue.record("must throw")
            } catch let error as BrokerError {
                #expect(error.status == 502)
                #expect(error.proxyStatus == "connection_refused")
                #expect(!error.code.isEmpty)
            }
        }
    }

    @Test("an origin's own 502 with problem+json is a response, not a BrokerError")
    func originErrorsPassThrough() async throws {
        let origin = try await TestOrigin.start(name: "plain")
        defer { Task { await origin.stop() } }
        try await withDaemon(config: configText(resolving: [("origin.internal.test", origin.port)])) { _, client in
            let (_, head) = try await client.data(for: BrokerRequest(url: try url("http://origin.internal.test:\(origin.port)/status/502")))
            #expect(head.status == 502)
        }
    }

    @Test("no daemon: .daemonNotRunning with the socket path")
    func daemonNotRunning() async throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/none.sock"
        let client = BrokerClient(socketPath: path)
        await #expect(throws: BrokerClientError.daemonNotRunning(socketPath: path)) {
            _ = try await client.send(BrokerRequest(url: try url("https://example.com/")))
        }
        await #expect(throws: BrokerClientError.daemonNotRunning(socketPath: path)) {
            _ = try await client.status()
        }
    }

    @Test(
        "another user's socket where the daemon's should be: .foreignListener, and it receives nothing",
        .enabled(if: TestUser.canCreate, "making the attacker user needs root")
    )
    func foreignListener() async throws {
        let attacker = try TestUser.ensure(name: "abtestother", password: "attacker-\(UInt32.random(in: 0...UInt32.max))")
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try attacker.own(directory)
        let path = directory + "/authbroker.sock"
        let impostor = try ImpostorListener(user: attacker, socketPath: path, recordDirectory: directory)
        defer { impostor.stop() }
        let client = BrokerClient(socketPath: path)
        let refused = BrokerClientError.foreignListener(socketPath: path, listenerUID: attacker.uid)
        var request = BrokerRequest(url: try url("https://example.com/"), method: "POST", body: .data(Data("password=hunter2".utf8)))
        request.headers.add("Authorization", "Basic aHVudGVyMg==")
        await #expect(throws: refused) {
            _ = try await client.send(request)
        }
        await #expect(throws: refused) {
            _ = try await client.status()
        }
        #expect(try await impostor.receivedPerConnection(waitingFor: 2) == [0, 0])
        #expect(impostor.received.isEmpty)
        #expect(refused.description.contains("uid \(attacker.uid)"))
        #expect(refused.description.contains("nothing was sent"))
    }

    @Test("the socket is found like authbrokerctl finds it")
    func socketDiscovery() {
        #expect(BrokerClient.defaultSocketPath(environment: ["AUTHBROKER_SOCKET": "/x/y.sock", "XDG_RUNTIME_DIR": "/run/user/7"]) == "/x/y.sock")
        #expect(
            BrokerClient.defaultSocketPath(environment: ["XDG_RUNTIME_DIR": "/run/user/7", "XDG_CONFIG_HOME": "/nonexistent"])
                == "/run/user/7/authbroker/authbroker.sock"
        )
    }

    @Test("a daemon restarted between requests: the next request works on a new connection")
    func daemonRestart() async throws {
        let origin = try await TestOrigin.start(name: "restart")
        defer { Task { await origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let config = configText(resolving: [("origin.internal.test", origin.port)])
        let target = try url("http://origin.internal.test:\(origin.port)/hello")

        let first = try await DaemonProcess.start(config: config, directory: directory)
        let client = BrokerClient(socketPath: first.socketPath)
        let (before, _) = try await client.data(for: BrokerRequest(url: target))
        #expect(String(decoding: before, as: UTF8.self) == "hello from restart")
        await first.stop()
        await #expect(throws: BrokerClientError.daemonNotRunning(socketPath: first.socketPath)) {
            _ = try await client.send(BrokerRequest(url: target))
        }

        let second = try await DaemonProcess.start(config: config, directory: directory)
        defer { Task { await second.stop() } }
        #expect(second.socketPath == first.socketPath)
        let (after, head) = try await client.data(for: BrokerRequest(url: target))
        #expect(head.status == 200)
        #expect(String(decoding: after, as: UTF8.self) == "hello from restart")
        await second.stop()
    }
}
