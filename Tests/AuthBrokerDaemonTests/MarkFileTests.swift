import AuthBrokerCore
import AuthBrokerDaemon
import Foundation
import Logging
import TestSupport
import Testing

@Suite("MarkFile: refused and Digest-only password marks on disk")
struct MarkFileTests {
    static let logger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }

    static func key(_ index: Int, realm: String? = "Staff") throws -> PasswordKey {
        PasswordKey(origin: try CanonicalOrigin(parsing: "https://host\(index % 7).example.test"), realm: realm, user: "user\(index)")
    }

    /// The marks in the file, read without `MarkFile`: url, realm ("-" for none) and user.
    static func onDisk(_ path: String) throws -> Set<[String]> {
        let records = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [[String: String]])
        return Set(records.map { [$0["url"] ?? "", $0["realm"] ?? "-", $0["user"] ?? ""] })
    }

    @Test("concurrent updates from many threads: the file ends up holding the set in memory, which a fresh read sees")
    func concurrentUpdatesLoseNothing() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/password-failures.json"
        let marks = MarkFile(path: path, what: "the refused-password marks", logger: Self.logger)
        let keys = try (0..<400).map { try Self.key($0, realm: $0 % 3 == 0 ? nil : "Staff") }

        // Each thread marks its own keys and clears every other one again: the writes race the
        // changes, and any write that landed late with an older set would show.
        onThreads(8) { thread in
            for (index, key) in keys.enumerated() where index % 8 == thread {
                marks.update { $0.insert(key) }
                if index % 2 == 1 { marks.update { $0.remove(key) } }
            }
        }
        marks.flush()

        let expected = Set(keys.enumerated().filter { $0.offset % 2 == 0 }.map(\.element))
        #expect(marks.all == expected)
        #expect(try Self.onDisk(path) == Set(expected.map { [$0.origin.description, $0.realm ?? "-", $0.user] }))
        #expect(MarkFile(path: path, what: "the refused-password marks", logger: Self.logger).all == expected)

        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory) == ["password-failures.json"], "a temporary file was left")
    }

    @Test("the file keeps the format of earlier versions, which still read")
    func format() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/password-digest-only.json"
        let earlier = #"[{"url":"http://a.example.test:8080","user":"alice"},{"realm":"Staff","url":"https://b.example.test","user":"bob"}]"#
        try Data(earlier.utf8).write(to: URL(fileURLWithPath: path))
        let marks = MarkFile(path: path, what: "the Digest-only password marks", logger: Self.logger)
        let alice = PasswordKey(origin: try CanonicalOrigin(parsing: "http://a.example.test:8080"), realm: nil, user: "alice")
        let bob = PasswordKey(origin: try CanonicalOrigin(parsing: "https://b.example.test"), realm: "Staff", user: "bob")
        #expect(marks.all == [alice, bob])

        marks.update { $0.remove(alice) }
        marks.flush()
        let written = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: path))) as? [[String: String]]
        #expect(written == [["url": bob.origin.description, "realm": "Staff", "user": "bob"]])
    }

    @Test("an unchanged set is not written; a file that is not a list of marks starts empty and is replaced")
    func unreadableStartsEmpty() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/password-failures.json"
        try Data("not json".utf8).write(to: URL(fileURLWithPath: path))
        let marks = MarkFile(path: path, what: "the refused-password marks", logger: Self.logger)
        #expect(marks.all.isEmpty)
        let absent = try Self.key(1)
        marks.update { $0.remove(absent) }
        marks.flush()
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "not json", "nothing changed, nothing written")
        let key = try Self.key(2)
        marks.update { $0.insert(key) }
        marks.flush()
        #expect(MarkFile(path: path, what: "the refused-password marks", logger: Self.logger).all == [key])
    }
}
