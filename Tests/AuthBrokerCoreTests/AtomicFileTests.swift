import AuthBrokerCore
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite("AtomicFile")
struct AtomicFileTests {
    private func scratchDirectory() throws -> String {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("atomic-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    private func contents(_ path: String) -> [UInt8]? {
        FileManager.default.contents(atPath: path).map { [UInt8]($0) }
    }

    private func leftovers(in directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.contains(".tmp-") }
    }

    @Test func writesReplacesAndKeepsModeOwnerOnly() throws {
        let directory = try self.scratchDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/file"
        #expect(try AtomicFile.write(Array("first".utf8), to: path))
        #expect(self.contents(path) == Array("first".utf8))
        #expect(try AtomicFile.write(Array("second, longer".utf8), to: path))
        #expect(self.contents(path) == Array("second, longer".utf8))
        #expect(try AtomicFile.write([], to: path))
        #expect(self.contents(path) == [])
        var info = stat()
        #expect(stat(path, &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
        #expect(try self.leftovers(in: directory).isEmpty)
    }

    @Test func exclusiveKeepsAnExistingFile() throws {
        let directory = try self.scratchDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let path = directory + "/file"
        #expect(try AtomicFile.write(Array("kept".utf8), to: path, exclusive: true))
        #expect(try AtomicFile.write(Array("not written".utf8), to: path, exclusive: true) == false)
        #expect(self.contents(path) == Array("kept".utf8))
        #expect(try self.leftovers(in: directory).isEmpty)
    }

    @Test func aMissingDirectoryFailsWithTheStepAndLeavesNothing() throws {
        let directory = try self.scratchDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(throws: AtomicFile.Failure.self) {
            try AtomicFile.write([1, 2, 3], to: directory + "/missing/file")
        }
        do {
            try AtomicFile.write([1], to: directory + "/missing/file")
        } catch {
            #expect(error.step.hasPrefix("create "))
            #expect(error.code == ENOENT)
            #expect(error.description.contains("No such file or directory"))
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty)
    }

    @Test func directoryOfPath() {
        #expect(AtomicFile.directory(of: "/a/b/c") == "/a/b")
        #expect(AtomicFile.directory(of: "/c") == "/")
        #expect(AtomicFile.directory(of: "c") == ".")
    }
}
