import AuthBrokerCore
import AuthBrokerHTTPAuth
import Foundation
import Logging

/// An append-only record of which process used which stored credential or client identity for
/// which server (DESIGN.md: caller awareness), one JSON object per line in
/// `$XDG_STATE_HOME/authbroker/audit.jsonl`, mode 0600. It never holds a secret: user names,
/// realms and identity names only.
///
/// Lines are written in batches like the access log's (`BatchedLogOutput`), off the threads
/// that record them: within 100 ms, at once when 32 KiB wait, and all of them when the daemon
/// stops (`flush`). A crash can lose the last fraction of a second.
package final class AuditLog: Sendable {
    package enum Event: Sendable {
        case credentialUsed(space: ProtectionSpace, user: String, requester: Requester?)
        case identityPresented(name: String, origin: CanonicalOrigin, requester: Requester?)
        /// A Kerberos service ticket for `service` went to `challenger` (an origin, or with
        /// `isProxy` the upstream proxy), as `principal`.
        case ticketUsed(challenger: CanonicalOrigin, service: String, principal: String?, isProxy: Bool, delegated: Bool, requester: Requester?)
    }

    private struct Line: Encodable {
        var time: Date
        var event: String
        var scheme: String
        var host: String
        var port: Int
        var realm: String?
        var authScheme: String?
        var user: String?
        /// true when the credential went to the upstream proxy (a 407's space), absent otherwise.
        var proxy: Bool?
        var identity: String?
        /// The Kerberos service a ticket was for (`HTTP@host`), and whether it was delegated.
        var service: String?
        var delegated: Bool?
        var pid: Int32?
        var uid: UInt32?
        var executable: String?

        enum CodingKeys: String, CodingKey {
            case time, event, scheme, host, port, realm, user, proxy, identity, service, delegated, pid, uid, executable
            case authScheme = "auth_scheme"
        }
    }

    package let path: String
    private let output: BatchedLogOutput

    /// Opens (creating, 0600) the log for appending; never through a symlink, and only a file
    /// of the user's that nobody else can write (`PrivateFiles.openForAppending`).
    package init(path: String, logger: Logger) throws {
        let fd: CInt
        do {
            fd = try PrivateFiles.openForAppending(path, what: "the audit log")
        } catch {
            throw StartupError(description: "authbrokerd: \(error)", exitCode: 1)
        }
        self.path = path
        self.output = BatchedLogOutput(fileDescriptor: fd, label: "authbrokerd.audit", closesDescriptor: true) { failure in
            logger.warning(
                "cannot append to the audit log; lines lost",
                metadata: [
                    "path": "\(path)", "error": "\(String(cString: strerror(failure.code)))", "lines": "\(failure.lines)",
                ]
            )
        }
    }

    /// Queues one line, written with the next batch (`BatchedLogOutput`): the caller never waits
    /// on the disk. A failed write is logged and the request goes on.
    package func record(_ event: Event) {
        let line: Line
        switch event {
        case .credentialUsed(let space, let user, let requester):
            line = Line(
                time: Date(), event: "credential_used", scheme: space.origin.scheme.rawValue, host: space.origin.host,
                port: space.origin.port, realm: space.realm, authScheme: space.authScheme, user: user,
                proxy: space.isProxy ? true : nil, pid: requester?.pid, uid: requester?.uid, executable: requester?.executable
            )
        case .identityPresented(let name, let origin, let requester):
            line = Line(
                time: Date(), event: "identity_presented", scheme: origin.scheme.rawValue, host: origin.host, port: origin.port,
                identity: name, pid: requester?.pid, uid: requester?.uid, executable: requester?.executable
            )
        case .ticketUsed(let challenger, let service, let principal, let isProxy, let delegated, let requester):
            line = Line(
                time: Date(), event: "kerberos_ticket_used", scheme: challenger.scheme.rawValue, host: challenger.host,
                port: challenger.port, authScheme: "negotiate", user: principal, proxy: isProxy ? true : nil, service: service,
                delegated: delegated ? true : nil, pid: requester?.pid, uid: requester?.uid, executable: requester?.executable
            )
        }
        guard let bytes = try? BrokerJSON.encoder().encode(line) else { return }
        self.output.writeBatched { batch in
            batch.append(contentsOf: bytes)
            batch.append(UInt8(ascii: "\n"))
        }
    }

    /// Writes every line recorded so far before it returns (the daemon calls it when it stops).
    package func flush() {
        self.output.flush()
    }
}
