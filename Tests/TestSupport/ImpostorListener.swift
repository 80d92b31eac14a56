import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Another local user's process listening where the user's daemon should be: it records every
/// byte any client sends it, so a test can prove that a client sent nothing.
///
/// It is a separate process run as `user` through `setpriv` (SO_PEERCRED reports the uid of the
/// process that listens, so the impostor must really be another user), written in Python because
/// the test machine has it and the broker's own binaries must not play the attacker.
package final class ImpostorListener: @unchecked Sendable {  // immutable after init; stop() is idempotent
    package let socketPath: String
    private let recordPath: String
    private let process: Process

    private static let script = """
        import os, socket, sys
        path, record = sys.argv[1], sys.argv[2]
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        os.chmod(path, 0o777)
        server.listen(16)
        open(record + ".ready", "w").close()
        while True:
            client, _ = server.accept()
            client.settimeout(5)
            received = b""
            try:
                while True:
                    chunk = client.recv(65536)
                    if not chunk:
                        break
                    received += chunk
            except OSError:
                pass
            with open(record, "ab") as f:
                f.write(received)
            with open(record + ".connections", "a") as f:
                f.write("%d\\n" % len(received))
            client.close()
        """

    /// Starts the impostor on `socketPath` (its directory must exist and be writable by `user`);
    /// its records go to `recordDirectory`, which `user` must be able to write.
    package init(user: TestUser, socketPath: String, recordDirectory: String) throws {
        self.socketPath = socketPath
        self.recordPath = recordDirectory + "/impostor-received"
        let scriptPath = recordDirectory + "/impostor.py"
        try Self.script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        chmod(scriptPath, 0o644)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        process.arguments = user.setprivArguments + ["/usr/bin/python3", scriptPath, socketPath, self.recordPath]
        process.standardInput = FileHandle.nullDevice
        self.process = process
        try process.run()
        for _ in 0..<200 where !FileManager.default.fileExists(atPath: self.recordPath + ".ready") {
            guard process.isRunning else { throw TestSupportError("the impostor listener exited with \(process.terminationStatus)") }
            usleep(25_000)
        }
        guard FileManager.default.fileExists(atPath: self.recordPath + ".ready") else {
            throw TestSupportError("the impostor listener did not start within 5 s")
        }
    }

    /// The number of bytes each finished connection carried, waiting (up to 10 s) until at
    /// least `connections` have finished.
    package func receivedPerConnection(waitingFor connections: Int) async throws -> [Int] {
        for _ in 0..<400 {
            let lines = ((try? String(contentsOfFile: self.recordPath + ".connections", encoding: .utf8)) ?? "")
                .split(separator: "\n").compactMap { Int($0) }
            if lines.count >= connections { return lines }
            try await Task.sleep(for: .milliseconds(25))
        }
        throw TestSupportError("the impostor saw fewer than \(connections) finished connections in 10 s")
    }

    /// Everything any client sent.
    package var received: Data {
        (try? Data(contentsOf: URL(fileURLWithPath: self.recordPath))) ?? Data()
    }

    package func stop() {
        if self.process.isRunning {
            kill(self.process.processIdentifier, SIGKILL)
            self.process.waitUntilExit()
        }
    }

    deinit { self.stop() }
}
