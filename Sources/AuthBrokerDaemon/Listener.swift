import AuthBrokerCore
import AuthBrokerPAM
import CAuthBrokerSystem
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif


/// Why the daemon cannot listen; each message says what to do.
package struct ListenerError: Error, CustomStringConvertible {
    package var description: String

    /// Why a bind failed, in words: the system's for an errno ("Address already in use"), not
    /// SwiftNIO's rendering of the call that failed.
    static func reason(_ error: any Error) -> String {
        if let io = error as? IOError { return String(cString: strerror(io.errnoCode)) }
        return "\(error)"
    }
}

/// Where the listening socket comes from: systemd (socket activation) or our own bind.
package enum ListeningSocket: Sendable {
    case systemd(fd: CInt)
    case path(String)

    /// The Unix socket systemd passed (for this pid only: sd_listen_fds(3)), else the path we
    /// bind ourselves; and the proxy-port sockets systemd passed (named `proxy`, see
    /// `SystemdListenFDs`). Clears the variables so children do not inherit them.
    package static func choose(socketPath: String, environment: [String: String]) -> (socket: ListeningSocket, passed: SystemdListenFDs) {
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        let passed = SystemdListenFDs.passed(to: getpid(), environment: environment)
        return (passed.control.map { .systemd(fd: $0) } ?? .path(socketPath), passed)
    }

    /// Makes `path` ready to bind: its directory checked (or created 0700), no live daemon on
    /// it, a stale socket file removed.
    ///
    /// In the broker's own directory (`privateDirectory`: the default location, under
    /// `$XDG_RUNTIME_DIR` or the `/tmp` fallback) the directory must be a real directory owned by
    /// the user with mode 0700, examined with `lstat`: a symlink planted by another user (to
    /// `/tmp`, say) or a directory they made first is refused. A directory the user named
    /// (`--socket`, `socket_path`) is never changed; it must be theirs, not a symlink, and not
    /// writable by others unless sticky and root's (like `/tmp`, where nobody else can remove or
    /// rename our socket).
    package static func prepare(path: String, privateDirectory: Bool) throws(ListenerError) {
        let directory = (path as NSString).deletingLastPathComponent
        if privateDirectory {
            do {
                try PrivateFiles.ensureDirectory(directory, what: "the socket directory", rule: .privateToUser)
            } catch {
                throw ListenerError(description: error.description)
            }
        } else {
            try checkChosenDirectory(directory)
        }

        var existingOwner: uid_t = 0
        var existingMode: UInt32 = 0
        guard cab_file_owner_mode(path, 0, &existingOwner, &existingMode) == 0 else { return }
        guard existingMode & UInt32(S_IFMT) == UInt32(S_IFSOCK) else {
            throw ListenerError(
                description: "\(path) exists and is not a socket; refusing to replace it. Move it away or choose another path with --socket."
            )
        }
        switch cab_unix_socket_is_live(path) {
        case 1:
            throw ListenerError(
                description: "another authbrokerd is already listening on \(path). Stop it first (`systemctl --user stop authbrokerd.service authbrokerd.socket`), or use another --socket."
            )
        case 0:
            guard unlink(path) == 0 || errno == ENOENT else {
                throw ListenerError(description: "cannot remove the stale socket \(path): \(String(cString: strerror(errno))).")
            }
        case let negativeErrno:
            throw ListenerError(
                description: "cannot probe the existing socket \(path): \(String(cString: strerror(-negativeErrno)))."
            )
        }
    }
}

extension ListeningSocket {
    /// The directory of a socket path the user chose: created 0700 when missing, else examined
    /// without following a symlink and never changed.
    fileprivate static func checkChosenDirectory(_ directory: String) throws(ListenerError) {
        var owner: uid_t = 0
        var mode: UInt32 = 0
        if cab_file_owner_mode(directory, 0, &owner, &mode) != 0 {
            let oldMask = umask(0o077)
            defer { umask(oldMask) }
            do {
                try FileManager.default.createDirectory(
                    atPath: directory, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700]
                )
            } catch {
                throw ListenerError(
                    description: "cannot create the socket directory \(directory): \(error.localizedDescription). Check that its parent exists and is writable, or choose another path with --socket."
                )
            }
            guard cab_file_owner_mode(directory, 0, &owner, &mode) == 0 else {
                throw ListenerError(description: "cannot read the socket directory \(directory) after creating it.")
            }
        }
        guard mode & UInt32(S_IFMT) != UInt32(S_IFLNK) else {
            throw ListenerError(
                description: "the socket directory \(directory) is a symbolic link, which the broker does not follow (whoever owns the link chooses where the socket goes). Name the real directory with --socket."
            )
        }
        guard mode & UInt32(S_IFMT) == UInt32(S_IFDIR) else {
            throw ListenerError(description: "the socket directory \(directory) is not a directory. Choose another path with --socket.")
        }
        let sticky = mode & UInt32(S_ISVTX) != 0
        guard owner == getuid() || (owner == 0 && sticky) else {
            throw ListenerError(
                description: "the socket directory \(directory) belongs to uid \(owner), not to you (uid \(getuid())); another user could replace the socket. Remove it or choose another path with --socket."
            )
        }
        guard mode & 0o022 == 0 || sticky else {
            throw ListenerError(
                description: "the socket directory \(directory) is writable by other users, who could replace the socket. Run `chmod go-w \(directory)` or choose another path with --socket."
            )
        }
    }
}

/// The process behind one client connection: uid and pid from `SO_PEERCRED`, start time and
/// executable from `/proc`, all read at accept. Read later (at the first control request, as
/// before), a pid recycled while another process held the connection would name that other
/// process, and a re-authentication grant would follow the pid to it.
package final class ConnectionPeer: Sendable {
    package let credentials: PeerCredentials
    /// uid, pid, start time and executable, for grants that belong to one process; nil when
    /// the process was gone before it could be read (such a peer gets no grant).
    package let identity: PeerIdentity?

    package init(credentials: PeerCredentials) {
        self.credentials = credentials
        self.identity = PeerIdentity.read(uid: credentials.uid, pid: credentials.pid)
    }

    /// pid, uid and executable, as agents and the audit log show them.
    package var requester: Requester {
        Requester(pid: self.credentials.pid, uid: self.credentials.uid, executable: self.identity?.executable)
    }
}

/// Raised from the child channel initializer to drop a connection before any byte is read.
package struct PeerRejected: Error {
    package var credentials: PeerCredentials?
}

extension EventLoopFuture {
    /// A child channel initializer's result that closes the channel when it fails: NIO's async
    /// server bootstrap leaves a refused connection open otherwise (its read transformation
    /// only drops the failure), and the peer would hold it.
    func closingOnFailure(_ channel: any Channel) -> EventLoopFuture<Value> {
        self.flatMapErrorThrowing { error in
            channel.close(promise: nil)
            throw error
        }
    }
}

extension NIOAsyncChannel where Inbound == AcceptedClientConnection, Outbound == Never {
    /// Closes a listener that will not be served (start-up failed after it was bound), and every
    /// connection it accepted meanwhile: each through its async channel, whose writer must be
    /// finished before it goes (NIO traps otherwise).
    func closeUnserved() async {
        try? await self.executeThenClose { accepted, _ in
            self.channel.close(promise: nil)
            for try await connection in accepted {
                try? await connection.connection.executeThenClose { _, _ in }
            }
        }
    }
}
