import Foundation
import NIOConcurrencyHelpers

/// Runs a program to completion and collects its output: for curl, htpasswd and the like.
package enum ExternalCommand {
    package struct Result: Sendable {
        package var status: Int32
        package var stdout: String
        package var stderr: String
    }

    /// Runs `executable` (an absolute path) with `arguments`, stdin empty.
    package static func run(_ executable: String, _ arguments: [String]) throws -> Result {
        try self.run(executable, arguments, environment: nil, input: nil)
    }

    /// Runs `executable` with `arguments`, its environment the test's own with `environment`
    /// laid over it (nil: the test's own), and `input` on its stdin (nil: empty), for Kerberos
    /// tools that must read a realm's own krb5.conf and take a password on stdin.
    package static func run(
        _ executable: String, _ arguments: [String], environment: [String: String]?, input: String? = nil
    ) throws -> Result {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
        }
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        if let input {
            // Written before the child starts (a password or two fits the pipe's buffer), so a
            // child that exits unread cannot make the write fail with EPIPE.
            let inputPipe = Pipe()
            try inputPipe.fileHandleForWriting.write(contentsOf: Data(input.utf8))
            try inputPipe.fileHandleForWriting.close()
            process.standardInput = inputPipe.fileHandleForReading
        } else {
            process.standardInput = FileHandle.nullDevice
        }
        try process.run()
        // stderr is read on another thread so that neither pipe can fill and stall the child.
        let errorData = ErrorCollector(err.fileHandleForReading)
        let stdout = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        let stderr = String(decoding: errorData.wait(), as: UTF8.self)
        process.waitUntilExit()
        return Result(status: process.terminationStatus, stdout: stdout, stderr: stderr)
    }

    /// The first of `candidates` that exists and is executable.
    package static func find(_ candidates: [String]) -> String? {
        candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }
}

/// Reads a pipe to its end on a background thread.
private final class ErrorCollector: Sendable {
    private let done = DispatchSemaphore(value: 0)
    private let box = DataBox()

    init(_ handle: FileHandle) {
        let box = self.box
        let done = self.done
        DispatchQueue.global().async {
            box.set(handle.readDataToEndOfFile())
            done.signal()
        }
    }

    func wait() -> Data {
        self.done.wait()
        return self.box.get()
    }
}

/// The data the reading thread collected.
private final class DataBox: Sendable {
    private let data = NIOLockedValueBox(Data())
    func set(_ data: Data) { self.data.withLockedValue { $0 = data } }
    func get() -> Data { self.data.withLockedValue { $0 } }
}
