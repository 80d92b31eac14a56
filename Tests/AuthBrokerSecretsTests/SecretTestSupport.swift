import AuthBrokerSecrets
import Foundation
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The backends the contract suite runs against.
enum Backend: String, CustomTestStringConvertible, Sendable {
    case file
    case secretService = "secret-service"

    var testDescription: String { self.rawValue }

    /// Both, unless AUTHBROKER_SKIP_SECRET_SERVICE=1 leaves the Secret Service out.
    static var contract: [Backend] { SecretServiceTestEnvironment.skipped ? [.file] : [.file, .secretService] }
}

enum SecretServiceTestEnvironment {
    static var skipped: Bool { ProcessInfo.processInfo.environment["AUTHBROKER_SKIP_SECRET_SERVICE"] == "1" }
    static var enabled: Bool { !skipped }

    /// Fails loudly (never passes quietly) when there is no session bus to test against.
    static func require() throws {
        if let problem = SecretServiceStore.sessionBusProblem(ProcessInfo.processInfo.environment) {
            throw SetupFailure(
                "The Secret Service tests need a real keyring on a private session bus, and \(problem). Run them through the wrapper: scripts/with-test-keyring swift test --skip-build --no-parallel (or make test); or set AUTHBROKER_SKIP_SECRET_SERVICE=1 to skip them."
            )
        }
    }
}

struct SetupFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A store for one test, with what it needs cleaned up afterwards.
final class StoreFixture {
    let backend: Backend
    let store: any SecretStore
    let directory: String
    /// Unique per fixture, so that tests never see each other's keyring items.
    let host = "h-\(UUID().uuidString.lowercased()).example.org"
    let name = "id-\(UUID().uuidString.lowercased())"

    init(_ backend: Backend) throws {
        self.backend = backend
        self.directory = try makeTemporaryDirectory()
        switch backend {
        case .file:
            self.store = EncryptedFileSecretStore(
                path: "\(self.directory)/data/authbroker/secrets.bin",
                keyFilePath: "\(self.directory)/config/authbroker/secrets.key",
                environment: [:]
            )
        case .secretService:
            try SecretServiceTestEnvironment.require()
            self.store = SecretServiceStore()
        }
    }

    deinit {
        if self.backend == .secretService {
            _ = try? self.store.delete(kind: .password, attributes: ["server": self.host])
            _ = try? self.store.delete(kind: .identityKey, attributes: ["name": self.name])
        }
        try? FileManager.default.removeItem(atPath: self.directory)
    }
}

func makeTemporaryDirectory() throws -> String {
    let path = "\(NSTemporaryDirectory())/authbroker-secrets-test-\(UUID().uuidString)"
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    return path
}

func randomBytes(_ count: Int) -> [UInt8] {
    var generator = SystemRandomNumberGenerator()
    return (0..<count).map { _ in UInt8.random(in: 0...255, using: &generator) }
}

func bytes(of value: SecretValue?) -> [UInt8]? {
    value?.withUnsafeBytes { [UInt8]($0) }
}

/// Runs a program found on PATH, feeding `input` on stdin; returns its exit status and its
/// stdout and stderr together (secret-tool prints an item's attributes on stderr).
///
/// posix_spawn and waitpid rather than Foundation's Process: once GLib runs in the process,
/// Process no longer notices its children exit, and it leaves its pipe ends open in children.
@discardableResult
func run(_ arguments: [String], input: String? = nil) throws -> (status: Int32, output: String) {
    var toChild: [Int32] = [-1, -1]
    var fromChild: [Int32] = [-1, -1]
    guard pipe(&toChild) == 0, pipe(&fromChild) == 0 else {
        throw SetupFailure("pipe failed: \(String(cString: strerror(errno)))")
    }
    // Close-on-exec, so only the dup2'd copies reach the child and nothing reaches grandchildren.
    for fd in toChild + fromChild { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, toChild[0], 0)
    posix_spawn_file_actions_adddup2(&actions, fromChild[1], 1)
    posix_spawn_file_actions_adddup2(&actions, fromChild[1], 2)
    let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    let spawned = posix_spawnp(&pid, arguments[0], &actions, nil, argv, environ)
    close(toChild[0])
    close(fromChild[1])
    guard spawned == 0 else {
        close(toChild[1])
        close(fromChild[0])
        throw SetupFailure("cannot run \(arguments[0]): \(String(cString: strerror(spawned)))")
    }
    if let input {
        let bytes = Array(input.utf8)
        var done = 0
        while done < bytes.count {
            let n = bytes[done...].withUnsafeBytes { write(toChild[1], $0.baseAddress, $0.count) }
            if n <= 0 { break }
            done += n
        }
    }
    close(toChild[1])
    var output: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 4096)
    while true {
        let n = buffer.withUnsafeMutableBytes { read(fromChild[0], $0.baseAddress, $0.count) }
        if n < 0 && errno == EINTR { continue }
        if n <= 0 { break }
        output.append(contentsOf: buffer[0..<n])
    }
    close(fromChild[0])
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let exitStatus = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    return (exitStatus, String(decoding: output, as: UTF8.self))
}

func fileMode(_ path: String) -> mode_t? {
    var info = stat()
    guard stat(path, &info) == 0 else { return nil }
    return info.st_mode & 0o777
}
