import AuthBrokerCore
import Logging
import NIOCore
import NIOSSL

/// `[debug] tls_key_log`: the keys of every upstream TLS connection, appended to a private file
/// in the NSS key log format (`CLIENT_RANDOM …`, the TLS 1.3 traffic secrets), so Wireshark can
/// decrypt a capture of the broker's own traffic. Lines are batched like the access log: the
/// handshake that makes them runs on an event loop, which never writes files.
package final class TLSKeyLog: Sendable {
    package let path: String
    private let output: BatchedLogOutput

    /// Opens (creating, 0600) the file for appending: never through a symlink, and only a file
    /// of the user's that nobody else can read or write.
    package init(path: String, logger: Logger) throws(StartupError) {
        let fd: CInt
        do {
            fd = try PrivateFiles.openForAppending(path, what: "the TLS key log", secret: true)
        } catch {
            throw StartupError(description: "authbrokerd: \(error) (set by [debug] tls_key_log)", exitCode: 1)
        }
        self.path = path
        self.output = BatchedLogOutput(fileDescriptor: fd, label: "authbrokerd.keylog", closesDescriptor: true) { failure in
            logger.error("cannot write the TLS key log", metadata: ["path": "\(path)", "lines_lost": "\(failure.lines)"])
        }
    }

    /// For `TLSConfiguration.keyLogCallback`: one line per call, without its newline.
    package var callback: NIOSSLKeyLogCallback {
        let output = self.output
        return { line in
            output.writeBatched { pending in
                pending.append(contentsOf: line.readableBytesView)
                pending.append(UInt8(ascii: "\n"))
            }
        }
    }

    /// Writes what is batched (at shutdown).
    package func flush() {
        self.output.flush()
    }

    /// What `status` says while the key log is on.
    package func warning(scope: BrokerSettings.Debug.KeyLogScope) -> String {
        let whose = scope == .all ? "every upstream connection" : "upstream connections of requests sent with Authbroker-Debug: keylog"
        return "TLS keys of \(whose) are being written to \(self.path) ([debug] tls_key_log): anyone who can read that file can decrypt captures of this traffic. Remove the setting and restart the daemon when you are done debugging."
    }
}
