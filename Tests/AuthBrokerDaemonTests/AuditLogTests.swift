import AuthBrokerCore
import AuthBrokerDaemon
import AuthBrokerHTTPAuth
import Foundation
import Logging
import TestSupport
import Testing

@Suite("AuditLog")
struct AuditLogTests {
    static let logger = Logger(label: "test") { _ in SwiftLogNoOpLogHandler() }

    static func lines(_ path: String) throws -> [Substring] {
        let text = try String(contentsOfFile: path, encoding: .utf8)
        #expect(text.isEmpty || text.hasSuffix("\n"), "the file ends with a whole line")
        return text.split(separator: "\n", omittingEmptySubsequences: false).dropLast()
    }

    @Test("lines recorded on many threads at once are all written once each, whole, in the file's format")
    func concurrentRecords() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/audit.jsonl"
        let audit = try AuditLog(path: path, logger: Self.logger)
        let origin = try CanonicalOrigin(parsing: "https://audit.example.test")
        let space = ProtectionSpace(origin: origin, realm: "Staff", authScheme: "digest")
        let threads = 8
        let perThread = 300  // some 200 bytes each: several batches' worth, written while others are recorded

        onThreads(threads) { thread in
            for index in 0..<perThread {
                audit.record(.credentialUsed(space: space, user: "user-\(thread)-\(index)", requester: nil))
            }
        }
        audit.flush()

        let lines = try Self.lines(path)
        #expect(lines.count == threads * perThread)
        var users: [String: Int] = [:]
        for line in lines {
            let object = try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any], "not one JSON object: \(line)")
            #expect(object["event"] as? String == "credential_used")
            #expect(object["auth_scheme"] as? String == "digest")
            #expect(object["realm"] as? String == "Staff")
            #expect(object["host"] as? String == "audit.example.test")
            users[object["user"] as? String ?? "", default: 0] += 1
        }
        let expected = Set((0..<threads).flatMap { thread in (0..<perThread).map { "user-\(thread)-\($0)" } })
        #expect(Set(users.keys) == expected)
        #expect(users.values.allSatisfy { $0 == 1 }, "a line was written twice")
        // Each thread's lines keep their order.
        for thread in 0..<threads {
            let order = lines.compactMap { line -> Int? in
                guard let range = line.range(of: "\"user\":\"user-\(thread)-") else { return nil }
                return Int(line[range.upperBound...].prefix { $0.isNumber })
            }
            #expect(order == Array(0..<perThread))
        }
        let attributes = try FileManager.default.attributesOfItem(atPath: path)
        #expect((attributes[.posixPermissions] as? Int) == 0o600)
    }

    @Test("flush, as the daemon's stop calls it, writes every line recorded before it; the file is appended to")
    func flushWritesEverything() throws {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/audit.jsonl"
        let origin = try CanonicalOrigin(parsing: "https://mtls.example.test")
        do {
            let audit = try AuditLog(path: path, logger: Self.logger)
            audit.record(.identityPresented(name: "laptop", origin: origin, requester: nil))
            audit.flush()
        }
        let audit = try AuditLog(path: path, logger: Self.logger)
        audit.record(.identityPresented(name: "desktop", origin: origin, requester: nil))
        audit.record(.identityPresented(name: "phone", origin: origin, requester: nil))
        audit.flush()
        let names = try Self.lines(path).map { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])?["identity"] as? String
        }
        #expect(names == ["laptop", "desktop", "phone"])
    }
}
