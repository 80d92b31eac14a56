import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// A system user with a known password, made (as root) for tests that need a second uid or a
/// real PAM login: the daemon authenticates the user it runs as, so such tests run it as this one.
package struct TestUser: Sendable {
    package let name: String
    package let password: String
    package let uid: uid_t
    package let gid: gid_t

    /// The user the PAM tests also use; created (and its password set) when missing. Needs root.
    package static func pamUser() throws -> TestUser {
        try Self.ensure(name: "abtestpam", password: "known-test-password")
    }

    package static var canCreate: Bool { getuid() == 0 }

    package static func ensure(name: String, password: String) throws -> TestUser {
        guard getuid() == 0 else { throw TestSupportError("making the test user \(name) needs root") }
        if getpwnam(name) == nil {
            let status = try Self.run("/usr/sbin/useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
            guard status == 0 || getpwnam(name) != nil else { throw TestSupportError("useradd \(name) failed (\(status))") }
        }
        guard try Self.run("/usr/sbin/chpasswd", [], input: "\(name):\(password)\n") == 0 else {
            throw TestSupportError("chpasswd for \(name) failed")
        }
        guard let entry = getpwnam(name) else { throw TestSupportError("no passwd entry for \(name)") }
        return TestUser(name: name, password: password, uid: entry.pointee.pw_uid, gid: entry.pointee.pw_gid)
    }

    /// `setpriv` arguments that run a command as this user.
    package var setprivArguments: [String] {
        ["--reuid=\(self.uid)", "--regid=\(self.gid)", "--clear-groups"]
    }

    /// Hands `directory` (recursively) to this user.
    package func own(_ directory: String) throws {
        guard try Self.run("/bin/chown", ["-R", "\(self.uid):\(self.gid)", directory]) == 0 else {
            throw TestSupportError("chown of \(directory) to \(self.name) failed")
        }
    }

    private static func run(_ executable: String, _ arguments: [String], input: String? = nil) throws -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardInput = pipe
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        if let input { pipe.fileHandleForWriting.write(Data(input.utf8)) }
        try pipe.fileHandleForWriting.close()
        process.waitUntilExit()
        return process.terminationStatus
    }
}
