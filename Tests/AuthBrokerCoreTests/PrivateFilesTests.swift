import AuthBrokerCore
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The directory and file checks that keep another user from planting the broker's state. Files
/// "of another user" are made by chown, so those cases need root.
@Suite("Private files and directories")
struct PrivateFilesTests {
    static func scratch() throws -> String {
        var template = Array("/tmp/abpf-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw PrivateFileError(.io, "mkdtemp failed") }
        return String(cString: made)
    }

    static let isRoot = geteuid() == 0

    @Test("a missing directory is created 0700 with its parents; an existing one is checked, not changed")
    func createsPrivate() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        try PrivateFiles.ensureDirectory(base + "/a/b", what: "the state directory", fallbackRoot: nil)
        var info = stat()
        #expect(lstat(base + "/a/b", &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700)
        #expect(lstat(base + "/a", &info) == 0)
        #expect(info.st_mode & 0o777 == 0o700)
        chmod(base + "/a/b", 0o755)
        try PrivateFiles.ensureDirectory(base + "/a/b", what: "the state directory", fallbackRoot: nil)
        #expect(lstat(base + "/a/b", &info) == 0)
        #expect(info.st_mode & 0o777 == 0o755)
    }

    @Test("a symlink in place of a directory is refused, never followed")
    func symlinkRefused() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        symlink("/tmp", base + "/link")
        #expect {
            try PrivateFiles.ensureDirectory(base + "/link", what: "the socket directory", rule: .notWritableByOthers)
        } throws: { error in
            let error = error as? PrivateFileError
            return error?.kind == .untrusted && error?.description.contains("symbolic link") == true
        }
    }

    @Test("under the fallback root: the root and what is below must be 0700; elsewhere only others' write is refused")
    func fallbackIsStrict() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        let root = base + "/authbroker-1"
        mkdir(root, 0o755)
        #expect(throws: PrivateFileError.self) {
            try PrivateFiles.ensureDirectory(root + "/state", what: "the state directory", fallbackRoot: root)
        }
        chmod(root, 0o700)
        try PrivateFiles.ensureDirectory(root + "/state", what: "the state directory", fallbackRoot: root)
        chmod(root + "/state", 0o750)
        #expect(throws: PrivateFileError.self) {
            try PrivateFiles.ensureDirectory(root + "/state", what: "the state directory", fallbackRoot: root)
        }
        mkdir(base + "/chosen", 0o777)
        chmod(base + "/chosen", 0o777)
        #expect(throws: PrivateFileError.self) {
            try PrivateFiles.ensureDirectory(base + "/chosen", what: "the state directory", fallbackRoot: root)
        }
    }

    @Test("a directory of another user is refused with its uid", .enabled(if: Self.isRoot, "chown needs root"))
    func otherOwnerRefused() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        mkdir(base + "/theirs", 0o700)
        chown(base + "/theirs", 4242, 4242)
        #expect {
            try PrivateFiles.ensureDirectory(base + "/theirs", what: "the state directory", rule: .privateToUser)
        } throws: { error in
            (error as? PrivateFileError)?.description.contains("belongs to uid 4242") == true
        }
    }

    @Test("files: missing is nil; a symlink, a FIFO, another user's file, a group-writable file are refused")
    func readOwnedFile() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        #expect(try PrivateFiles.readOwnedFile(base + "/none", what: "the trust store", maxBytes: 100) == nil)
        _ = FileManager.default.createFile(atPath: base + "/mine", contents: Data("{}".utf8), attributes: [.posixPermissions: 0o644])
        #expect(try PrivateFiles.readOwnedFile(base + "/mine", what: "the trust store", maxBytes: 100) == Array("{}".utf8))
        #expect(throws: PrivateFileError.self) {
            try PrivateFiles.readOwnedFile(base + "/mine", what: "the secrets file", maxBytes: 100, forbiddenModeBits: 0o077)
        }
        #expect(throws: PrivateFileError.self) { try PrivateFiles.readOwnedFile(base + "/mine", what: "the trust store", maxBytes: 1) }

        symlink(base + "/mine", base + "/link")
        #expect {
            try PrivateFiles.readOwnedFile(base + "/link", what: "the trust store", maxBytes: 100)
        } throws: { error in
            (error as? PrivateFileError)?.description.contains("symbolic link") == true
        }
        mkfifo(base + "/fifo", 0o600)
        #expect(throws: PrivateFileError.self) { try PrivateFiles.readOwnedFile(base + "/fifo", what: "the trust store", maxBytes: 100) }

        chmod(base + "/mine", 0o664)
        #expect {
            try PrivateFiles.readOwnedFile(base + "/mine", what: "the trust store", maxBytes: 100)
        } throws: { error in
            (error as? PrivateFileError)?.description.contains("chmod go-w") == true
        }
        if Self.isRoot {
            chmod(base + "/mine", 0o644)
            chown(base + "/mine", 4242, 4242)
            #expect {
                try PrivateFiles.readOwnedFile(base + "/mine", what: "the trust store", maxBytes: 100)
            } throws: { error in
                (error as? PrivateFileError)?.description.contains("belongs to uid 4242") == true
            }
        }
    }

    @Test("the audit log is never appended to through a symlink")
    func appendRefusesSymlink() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        _ = FileManager.default.createFile(atPath: base + "/elsewhere", contents: Data())
        symlink(base + "/elsewhere", base + "/audit.jsonl")
        #expect(throws: PrivateFileError.self) { try PrivateFiles.openForAppending(base + "/audit.jsonl", what: "the audit log") }
        let fd = try PrivateFiles.openForAppending(base + "/fresh.jsonl", what: "the audit log")
        close(fd)
        var info = stat()
        #expect(stat(base + "/fresh.jsonl", &info) == 0)
        #expect(info.st_mode & 0o777 == 0o600)
    }

    @Test("a secret file (the TLS key log) must be unreadable by others too; the error gives the chmod")
    func secretAppendTargetsMustBePrivate() throws {
        let base = try Self.scratch()
        defer { try? FileManager.default.removeItem(atPath: base) }
        let path = base + "/keys.log"
        #expect(FileManager.default.createFile(atPath: path, contents: Data(), attributes: [.posixPermissions: 0o644]))
        // Readable by others is fine for the audit log, not for keys.
        close(try PrivateFiles.openForAppending(path, what: "the audit log"))
        let error = #expect(throws: PrivateFileError.self) { try PrivateFiles.openForAppending(path, what: "the TLS key log", secret: true) }
        #expect(error?.description.contains("has mode 644") == true, "\(error?.description ?? "")")
        #expect(error?.description.contains("chmod 600") == true)
        chmod(path, 0o600)
        close(try PrivateFiles.openForAppending(path, what: "the TLS key log", secret: true))
    }
}
