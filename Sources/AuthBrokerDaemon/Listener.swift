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
}

/// Where the listening socket comes from: systemd (socket activation) or our own bind.
package enum ListeningSocket: Sendable {
    case systemd(fd: CInt)
    case path(String)

    /// The first socket passed by systemd (`LISTEN_FDS`, fd 3, for this pid only: sd_listen_fds(3)),
    /// else the path we bind ourselves. Clears the variables so children do not inherit them.
    package static func choose(socketPath: String, environment: [String: String]) -> ListeningSocket {
        defer {
            unsetenv("LISTEN_PID")
            unsetenv("LISTEN_FDS")
            unsetenv("LISTEN_FDNAMES")
        }
        if let pid = environment["LISTEN_PID"].flatMap({ Int32($0) }), pid == getpid(),
            let count = environment["LISTEN_FDS"].flatMap({ Int($0) }), count >= 1
        {
            return .systemd(fd: 3)
        }
        return .path(socketPath)
    }

    /// Makes `path` ready to bind: the parent directory created 0700 when missing (an existing
    /// one is checked, never changed), no live daemon on it, a stale socket file removed.
    package static func prepare(path: String) throws(ListenerError) {
        let directory = (path as NSString).deletingLastPathComponent
        var owner: uid_t = 0
        var mode: UInt32 = 0
        if cab_file_owner_mode(directory, 1, &owner, &mode) != 0 {
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
            guard cab_file_owner_mode(directory, 1, &owner, &mode) == 0 else {
                throw ListenerError(description: "cannot read the socket directory \(directory) after creating it.")
            }
        }
        // An existing directory is never changed (it may be /tmp, or shared): it must only be
        // such that no other user can replace the socket in it. A sticky directory (like /tmp)
        // lets nobody else remove or rename our file.
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

/// The credentials `SO_PEERCRED` reports for a connected Unix socket.
package struct PeerCredentials: Sendable {
    package var pid: Int32
    package var uid: UInt32

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

extension Channel {
    /// The peer's pid and uid, read with `SO_PEERCRED` before anything is read from it.
    package func peerCredentials() -> EventLoopFuture<PeerCredentials> {
        guard let provider = self as? any SocketOptionProvider else {
            return self.eventLoop.makeFailedFuture(PeerRejected(credentials: nil))
        }
        let level = SocketOptionLevel(cab_sol_socket())
        let name = SocketOptionName(cab_so_peercred())
        let future: EventLoopFuture<cab_ucred> = provider.unsafeGetSocketOption(level: level, name: name)
        return future.map { PeerCredentials(pid: $0.pid, uid: $0.uid) }
    }
}

extension cab_ucred: @retroactive @unchecked Sendable {}  // plain integers; the C import just lacks the annotation
