import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import TestSupport
import Testing

/// The trust store file is the user's too: what an editor does to it is picked up, never undone
/// by the next change through the API, and a file edited into garbage is never written over.
@Suite("TrustStore: changes made to the file outside the broker")
struct TrustStoreDiskChangeTests {
    /// Rewrites the file as an editor would: through a new inode, as `sed -i` does.
    static func edit(_ path: String, _ change: (inout [String: Any]) -> Void) throws {
        let data = try Data(contentsOf: URL(fileURLWithPath: path))
        var object = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        change(&object)
        let edited = try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted])
        try edited.write(to: URL(fileURLWithPath: path + ".edit"))
        guard rename(path + ".edit", path) == 0 else { throw TestSupportError("rename failed") }
    }

    /// Overwrites the file in place (same inode), as `vim` with `backupcopy=yes` or `>` does.
    static func overwrite(_ path: String, _ text: String) throws {
        let handle = try #require(FileHandle(forWritingAtPath: path))
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8))
        try handle.close()
    }

    @Test("an anchor deleted by hand stops being trusted, and the next API change does not bring it back")
    func anchorDeletedByHand() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        let store = try TrustStore(path: path)
        let a = try TestPKI.makeCA(commonName: "Hand A")
        let b = try TestPKI.makeCA(commonName: "Hand B")
        try store.addAnchors(pem: a.pem + b.pem, hosts: [])
        #expect(store.anchors().count == 2)
        let generation = store.generation

        let deleted = a.sha256Fingerprint.replacingOccurrences(of: ":", with: "").lowercased()
        try Self.edit(path) { object in
            object["anchors"] = (object["anchors"] as? [[String: Any]] ?? []).filter { $0["id"] as? String != deleted }
        }
        #expect(store.anchors().map(\.id) == [b.sha256Fingerprint.replacingOccurrences(of: ":", with: "").lowercased()])
        #expect(store.generation > generation, "a hand edit must move the generation, so cached decisions are dropped")

        // A change through the API applies to the edited file: the deleted anchor stays deleted.
        try store.addPin(host: try HostPattern(parsing: "pinned.example.test"), spkiSHA256: String(repeating: "A", count: 43) + "=")
        let reopened = try TrustStore(path: path)
        #expect(reopened.anchors().map(\.id) == store.anchors().map(\.id))
        #expect(!reopened.anchors().contains { $0.id == deleted })
        #expect(reopened.pins().count == 1)
    }

    @Test("a change made in place (same inode, same size) is picked up too")
    func inPlaceEdit() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        let store = try TrustStore(path: path)
        try store.addException(
            host: try HostPattern(parsing: "one.example.test"), port: nil, sha256: String(repeating: "ab", count: 32), persistent: true
        )
        let text = try String(contentsOfFile: path, encoding: .utf8)
        // Same length: only the host's first letters change, so only the time and content differ.
        try Self.overwrite(path, text.replacingOccurrences(of: "one.example.test", with: "two.example.test"))
        #expect(store.exceptions().saved.map(\.host.description) == ["two.example.test"])
    }

    @Test("a file edited into something unreadable is never written over, and the old contents stay in force")
    func unreadableEdit() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        let store = try TrustStore(path: path)
        let ca = try TestPKI.makeCA(commonName: "Kept")
        try store.addAnchors(pem: ca.pem, hosts: [])
        let broken = "{ \"version\": 1, \"anchors\": [ oops"
        try Self.overwrite(path, broken)

        #expect(store.anchors().count == 1, "readers go on with what was read before")
        let pinHost = try HostPattern(parsing: "x.example.test")
        do throws(TrustStoreError) {
            try store.addPin(host: pinHost, spkiSHA256: String(repeating: "B", count: 43) + "=")
            Issue.record("a change was written over a file that could not be read")
        } catch {
            #expect(error.code == "changed_on_disk")
            #expect(error.message.contains(path))
            #expect(error.message.contains("fix the file"))
        }
        #expect(try String(contentsOfFile: path, encoding: .utf8) == broken, "the user's file was changed")
        #expect(throws: TrustStoreError.self) { try store.refreshFromDisk() }

        // Fixed by hand: picked up, and changes work again.
        try Self.overwrite(path, #"{"version": 1, "anchors": [], "pins": []}"#)
        #expect(try store.refreshFromDisk())
        #expect(store.anchors().isEmpty)
        try store.addPin(host: try HostPattern(parsing: "x.example.test"), spkiSHA256: String(repeating: "B", count: 43) + "=")
        #expect(try TrustStore(path: path).pins().count == 1)
    }

    @Test("a file deleted by hand is an empty store")
    func deletedByHand() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        let store = try TrustStore(path: path)
        try store.addAnchors(pem: try TestPKI.makeCA(commonName: "Gone").pem, hosts: [])
        try FileManager.default.removeItem(atPath: path)
        #expect(store.anchors().isEmpty)
    }

    @Test("the store's own writes are not mistaken for hand edits")
    func ownWrites() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        try store.addAnchors(pem: try TestPKI.makeCA(commonName: "Own").pem, hosts: [])
        #expect(try !store.refreshFromDisk())
        let generation = store.generation
        _ = store.anchors()
        #expect(store.generation == generation)
    }

    // MARK: - Expiring exceptions

    @Test("an exception with an expiry applies until then, is saved with it, and is removed after")
    func expiringException() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["exp.example.test"], issuer: nil)
        let now = Date()
        let expiry = now.addingTimeInterval(3600)
        let added = try fixture.store.addException(
            host: try HostPattern(parsing: "exp.example.test"), port: 443, sha256: leaf.sha256Fingerprint, persistent: true,
            expiresAt: expiry, now: now
        )
        #expect(added.expiresAt.map { abs($0.timeIntervalSince(expiry)) < 1 } == true)
        #expect(try TrustStore(path: fixture.store.path).exceptions().saved.first?.expiresAt == added.expiresAt)

        let before = await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "exp.example.test", port: 443, now: now)
        #expect(before.isTrusted && before.byException)
        let after = await fixture.evaluator.evaluate(
            chainDER: [leaf.der], host: "exp.example.test", port: 443, now: expiry.addingTimeInterval(1)
        )
        #expect(!after.isTrusted, "an expired exception still trusted the certificate")

        #expect(try fixture.store.removeExpiredExceptions(now: now).isEmpty)
        let generation = fixture.store.generation
        let removed = try fixture.store.removeExpiredExceptions(now: expiry.addingTimeInterval(1))
        #expect(removed.map(\.sha256) == [leaf.sha256Fingerprint])
        #expect(fixture.store.generation > generation)
        #expect(try TrustStore(path: fixture.store.path).exceptions().saved.isEmpty)
    }

    @Test("adding an exception again with another expiry changes it; with the same, nothing changes")
    func changingExpiry() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let store = try TrustStore(path: directory.file("trust.json"))
        let host = try HostPattern(parsing: "e.example.test")
        let sha = String(repeating: "ef", count: 32)
        let now = Date(timeIntervalSince1970: 1_800_000_000)
        try store.addException(host: host, port: nil, sha256: sha, persistent: true, expiresAt: now.addingTimeInterval(60), now: now)
        let generation = store.generation
        try store.addException(host: host, port: nil, sha256: sha, persistent: true, expiresAt: now.addingTimeInterval(60), now: now)
        #expect(store.generation == generation)
        let changed = try store.addException(host: host, port: nil, sha256: sha, persistent: true, expiresAt: nil, now: now)
        #expect(changed.expiresAt == nil)
        #expect(store.exceptions().saved.count == 1)
    }
}

@Suite("LifetimeText")
struct LifetimeTextTests {
    @Test(
        "lifetimes parse",
        arguments: [
            ("90m", 5_400), ("12h", 43_200), ("30d", 2_592_000), ("2w", 1_209_600), ("45s", 45), ("30 days", 2_592_000),
            ("1H", 3_600),
        ] as [(String, Int64)]
    )
    func parses(text: String, seconds: Int64) throws {
        #expect(try LifetimeText.seconds(text) == seconds)
    }

    @Test(
        "bad lifetimes are typed errors that say what to write",
        arguments: ["", "d", "0d", "-1d", "30", "30y", "1.5d", "99999999999d", "4000d", "30d30d", "\u{0}1d", "٣d"]
    )
    func rejects(text: String) {
        do {
            _ = try LifetimeText.seconds(text)
            Issue.record("'\(text)' parsed")
        } catch {
            #expect(error.message.contains("90m") || error.message.contains("ten years"))
        }
    }
}
