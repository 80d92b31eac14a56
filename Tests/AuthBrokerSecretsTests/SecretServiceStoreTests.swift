import AuthBrokerSecrets
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Against a real gnome-keyring on a private session bus (scripts/with-test-keyring); these kill
/// and restart that daemon, so they run one at a time.
@Suite("Secret Service store", .serialized, .enabled(if: SecretServiceTestEnvironment.enabled, "AUTHBROKER_SKIP_SECRET_SERVICE=1"))
struct SecretServiceStoreTests {
    static let busName = "org.freedesktop.secrets"

    @Test func anEntryMadeBySecretToolIsFound() throws {
        let fixture = try StoreFixture(.secretService)
        let secret = "from secret-tool \(UUID())"
        let made = try run(
            ["secret-tool", "store", "--label=x", "server", fixture.host, "user", "bob", "protocol", "https"],
            input: secret
        )
        try #require(made.status == 0, "secret-tool store failed; is libsecret-tools installed?")
        let attributes = ["server": fixture.host, "user": "bob", "protocol": "https"]
        #expect(try fixture.store.lookup(kind: .password, attributes: attributes)?.stringValue() == secret)
        #expect(try fixture.store.lookup(kind: .password, attributes: ["server": fixture.host])?.stringValue() == secret)
        #expect(try fixture.store.list(kind: .password, matching: ["server": fixture.host]) == [SecretItemMetadata(kind: .password, attributes: attributes, label: "x")])
        #expect(try fixture.store.delete(kind: .password, attributes: attributes) == 1)
        #expect(try run(["secret-tool", "lookup", "server", fixture.host]).output.isEmpty)
    }

    @Test func ourEntryIsFoundBySecretTool() throws {
        let fixture = try StoreFixture(.secretService)
        let secret = "ours \(UUID())"
        try fixture.store.store(
            kind: .password,
            attributes: ["server": fixture.host, "user": "alice", "protocol": "https", "port": "8443"],
            label: "alice at \(fixture.host)",
            secret: SecretValue(secret)
        )
        let search = try run(["secret-tool", "search", "--all", "server", fixture.host])
        #expect(search.status == 0)
        #expect(search.output.contains("attribute.server = \(fixture.host)"))
        #expect(search.output.contains("attribute.user = alice"))
        #expect(search.output.contains("attribute.port = 8443"))
        #expect(search.output.contains("schema = org.gnome.keyring.NetworkPassword"))
        #expect(search.output.contains("label = alice at \(fixture.host)"))
        #expect(try run(["secret-tool", "lookup", "server", fixture.host, "user", "alice"]).output == secret)
    }

    @Test func identityKeysUseTheirOwnSchema() throws {
        let fixture = try StoreFixture(.secretService)
        try fixture.store.store(kind: .identityKey, attributes: ["name": fixture.name], label: "laptop key", secret: SecretValue(bytes: [0, 1, 2]))
        let search = try run(["secret-tool", "search", "--all", "name", fixture.name])
        #expect(search.output.contains("schema = org.authbroker.Identity"))
    }

    @Test func aLockedKeyringIsALockedErrorNotAPrompt() throws {
        let fixture = try StoreFixture(.secretService)
        let attributes = ["server": fixture.host, "user": "alice"]
        try fixture.store.store(kind: .password, attributes: attributes, label: "x", secret: SecretValue("s"))
        let locked = try run([
            "dbus-send", "--session", "--print-reply", "--dest=\(Self.busName)", "/org/freedesktop/secrets",
            "org.freedesktop.Secret.Service.Lock", "array:objpath:/org/freedesktop/secrets/collection/login",
        ])
        try #require(locked.status == 0, "could not lock the test keyring")
        defer { try? Self.restartKeyring() }
        let clock = ContinuousClock()
        let started = clock.now
        #expect(throws: SecretStoreError.locked) { try fixture.store.lookup(kind: .password, attributes: attributes) }
        #expect(throws: SecretStoreError.locked) { try fixture.store.delete(kind: .password, attributes: attributes) }
        #expect(clock.now - started < .seconds(5))
        do throws(SecretStoreError) {
            _ = try fixture.store.lookup(kind: .password, attributes: attributes)
        } catch {
            #expect(error.message.contains("gnome-keyring-daemon --unlock"))
        }
        // Listing needs no secret, so it still works.
        #expect(try fixture.store.list(kind: .password, matching: ["server": fixture.host]).count == 1)
    }

    @Test func aKilledKeyringIsAClearErrorAndARestartedOneWorksAgain() throws {
        let fixture = try StoreFixture(.secretService)
        let attributes = ["server": fixture.host, "user": "alice"]
        try fixture.store.store(kind: .password, attributes: attributes, label: "x", secret: SecretValue("before"))
        try Self.killKeyring()
        let clock = ContinuousClock()
        let started = clock.now
        for _ in 0..<2 {
            do throws(SecretStoreError) {
                _ = try fixture.store.lookup(kind: .password, attributes: attributes)
                Issue.record("a lookup with no keyring daemon succeeded")
            } catch {
                #expect(error == .serviceUnavailable, "\(error)")
                #expect(error.message.contains("set store = \"file\""))
            }
        }
        #expect(throws: SecretStoreError.serviceUnavailable) {
            try fixture.store.store(kind: .password, attributes: attributes, label: "x", secret: SecretValue("during"))
        }
        #expect(clock.now - started < .seconds(5))
        try Self.startKeyring()
        // The keyring file survives the daemon; the same store object works again.
        #expect(try fixture.store.lookup(kind: .password, attributes: attributes)?.stringValue() == "before")
        try fixture.store.store(kind: .password, attributes: attributes, label: "x", secret: SecretValue("after"))
        #expect(try fixture.store.lookup(kind: .password, attributes: attributes)?.stringValue() == "after")
    }

    @Test("a keyring daemon restarted under a connected store: the very next call works, on a new connection")
    func aRestartedKeyringIsReconnectedWithinTheCall() throws {
        let fixture = try StoreFixture(.secretService)
        let attributes = ["server": fixture.host, "user": "alice"]
        try fixture.store.store(kind: .password, attributes: attributes, label: "x", secret: SecretValue("before"))
        try Self.restartKeyring()
        #expect(try fixture.store.lookup(kind: .password, attributes: attributes)?.stringValue() == "before")
    }

    @Test func aKeyringThatStopsAnsweringTimesOutAndIsUsedAgainAfterwards() throws {
        let fixture = try StoreFixture(.secretService)
        let store = SecretServiceStore(timeout: .seconds(1))
        let attributes = ["server": fixture.host, "user": "alice"]
        try store.store(kind: .password, attributes: attributes, label: "x", secret: SecretValue("s"))
        guard let pid = try Self.ownerPID() else { throw SetupFailure("no keyring daemon owns \(Self.busName)") }
        kill(pid, SIGSTOP)
        let clock = ContinuousClock()
        let started = clock.now
        do throws(SecretStoreError) {
            _ = try store.lookup(kind: .password, attributes: attributes)
            Issue.record("a lookup against a stopped keyring daemon succeeded")
        } catch {
            #expect(error == .serviceUnavailable, "\(error)")
            #expect(error.message.contains("did not answer within"))
        }
        kill(pid, SIGCONT)
        #expect(clock.now - started < .seconds(5))
        #expect(try store.lookup(kind: .password, attributes: attributes)?.stringValue() == "s")
    }

    @Test func autoSelectsTheSecretServiceWhenItAnswers() throws {
        try SecretServiceTestEnvironment.require()
        let directory = try makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let selected = selectSecretStore(.auto, filePath: "\(directory)/secrets.bin", keyFilePath: "\(directory)/secrets.key")
        #expect(selected.store.backendName == "secret-service")
        #expect(selected.reason == "auto: the Secret Service answered on the session bus")
    }

    // MARK: - The test keyring daemon

    static func ownerPID() throws -> pid_t? {
        let reply = try run([
            "dbus-send", "--session", "--print-reply", "--dest=org.freedesktop.DBus", "/org/freedesktop/DBus",
            "org.freedesktop.DBus.GetConnectionUnixProcessID", "string:\(busName)",
        ])
        guard reply.status == 0, let last = reply.output.split(separator: " ").last else { return nil }
        return pid_t(last.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    static func waitForOwner(present: Bool) throws {
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline {
            if (try ownerPID() != nil) == present { return }
            usleep(50_000)
        }
        throw SetupFailure("the keyring daemon did not \(present ? "appear on" : "leave") the session bus within 10 s")
    }

    static func killKeyring() throws {
        guard let pid = try ownerPID() else { throw SetupFailure("no keyring daemon owns \(busName)") }
        kill(pid, SIGKILL)
        try waitForOwner(present: false)
    }

    static func startKeyring() throws {
        let password = ProcessInfo.processInfo.environment["AUTHBROKER_TEST_KEYRING_PASSWORD"] ?? "test-keyring-password"
        // The daemon forks, and its child keeps its stdout and stderr: give it /dev/null, so
        // that reading the shell's output ends.
        let started = try run([
            "sh", "-c", "printf %s \"$0\" | gnome-keyring-daemon --unlock --components=secrets >/dev/null 2>&1", password,
        ])
        guard started.status == 0 else { throw SetupFailure("gnome-keyring-daemon --unlock failed: \(started.output)") }
        try waitForOwner(present: true)
    }

    static func restartKeyring() throws {
        try killKeyring()
        try startKeyring()
    }
}

@Suite("Secret store selection")
struct SecretStoreSelectionTests {
    @Test func fileIsUsedWhenAsked() throws {
        let selected = selectSecretStore(.file, filePath: "/nonexistent/secrets.bin", keyFilePath: "/nonexistent/key", environment: [:])
        #expect(selected.store.backendName == "file")
        #expect(selected.reason.contains("/nonexistent/secrets.bin"))
    }

    @Test func autoFallsBackToTheFileWithoutASessionBus() throws {
        let selected = selectSecretStore(.auto, filePath: "/nonexistent/secrets.bin", keyFilePath: "/nonexistent/key", environment: [:])
        #expect(selected.store.backendName == "file")
        #expect(selected.reason.hasPrefix("auto: no Secret Service on the session bus (DBUS_SESSION_BUS_ADDRESS is unset"))
        #expect(!selected.reason.contains("set store"))
        #expect(selected.reason.contains("using the encrypted file /nonexistent/secrets.bin"))
    }

    @Test func anExplicitSecretServiceIsKeptAndTheReasonSaysWhatIsWrong() throws {
        let selected = selectSecretStore(.secretService, filePath: "/x", keyFilePath: "/y", environment: [:])
        #expect(selected.store.backendName == "secret-service")
        #expect(selected.reason.contains("does not answer now"))
        #expect(throws: SecretStoreError.serviceUnavailable) {
            try selected.store.lookup(kind: .password, attributes: ["server": "example.org"])
        }
    }

    @Test func choicesParseFromTheSetting() {
        #expect(SecretStoreChoice(rawValue: "auto") == .auto)
        #expect(SecretStoreChoice(rawValue: "secret-service") == .secretService)
        #expect(SecretStoreChoice(rawValue: "file") == .file)
        #expect(SecretStoreChoice(rawValue: "kwallet") == nil)
    }
}
