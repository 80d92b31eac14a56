import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import NIOConcurrencyHelpers
import TestSupport
import Testing

/// Changes save the file one at a time, and the lock readers take (every TLS evaluation, on an
/// event loop) is never held while they do.
@Suite("TrustStore: saving and readers")
struct TrustStoreConcurrencyTests {
    /// A save held just before it writes, released by the test; later saves go through.
    final class HeldSave: Sendable {
        let reached = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        private let held = NIOLockedValueBox(false)

        func hook() {
            let first = self.held.withLockedValue { held in
                defer { held = true }
                return !held
            }
            guard first else { return }
            self.reached.signal()
            self.release.wait()
        }
    }

    /// Runs `body` on a thread of its own; the returned semaphore is signalled when it is done.
    static func onThread(_ body: @escaping @Sendable () -> Void) -> DispatchSemaphore {
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            body()
            done.signal()
        }
        return done
    }

    @Test("while a change saves, readers go on and see the store as it was; after, they see the change; a session change made meanwhile stays")
    func readersGoOnDuringSave() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let held = HeldSave()
        let store = try TrustStore(path: directory.file("trust.json"), willSave: { held.hook() })
        let ca = try TestPKI.makeCA(commonName: "Held Save CA")
        let generation = store.generation
        let failure = NIOLockedValueBox<String?>(nil)

        let saved = Self.onThread {
            do {
                try store.addAnchors(pem: ca.pem, hosts: [])
            } catch {
                failure.withLockedValue { $0 = "\(error)" }
            }
        }
        held.reached.wait()
        // The change is about to write the file and holds the writers' lock. Readers are not
        // held up (were they, this test would never get past them), and see nothing unsaved.
        #expect(store.anchors().isEmpty)
        #expect(store.pins().isEmpty)
        #expect(store.identities().isEmpty)
        #expect(store.generation == generation)
        #expect(store.automaticClientIdentity(for: "a.example.test").identity == nil)
        // Session ("trust once") exceptions live in memory only and never wait for a save.
        let once = try store.addException(
            host: pattern("once.example.test"), port: nil, sha256: String(repeating: "ab", count: 32), persistent: false
        )
        held.release.signal()
        saved.wait()

        #expect(failure.withLockedValue { $0 } == nil)
        #expect(store.anchors().count == 1)
        #expect(store.exceptions().session == [once], "the change's publication dropped a session exception made meanwhile")
        #expect(store.generation > generation)
        #expect(try TrustStore(path: directory.file("trust.json")).anchors().count == 1)
    }

    @Test("changes made on many threads at once are all saved")
    func concurrentChangesAllPersist() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        let digest = String(repeating: "A", count: 43) + "="
        let threads = 6
        let perThread = 5
        let failures = NIOLockedValueBox<[String]>([])
        let done = (0..<threads).map { thread in
            Self.onThread {
                for index in 0..<perThread {
                    do {
                        try store.addPin(host: try pattern("t\(thread)-\(index).example.test"), spkiSHA256: digest)
                        if index % 2 == 1 {
                            try store.removePin(host: try pattern("t\(thread)-\(index).example.test"), spkiSHA256: digest)
                        }
                        _ = store.pins()
                    } catch {
                        failures.withLockedValue { $0.append("\(error)") }
                    }
                }
            }
        }
        done.forEach { $0.wait() }

        #expect(failures.withLockedValue { $0 } == [])
        let expected = Set(
            try (0..<threads).flatMap { thread in
                try (0..<perThread).filter { $0 % 2 == 0 }.map { try pattern("t\(thread)-\($0).example.test") }
            }
        )
        #expect(Set(store.pins().map(\.host)) == expected)
        #expect(Set(try TrustStore(path: directory.file("trust.json")).pins().map(\.host)) == expected)
    }
}
