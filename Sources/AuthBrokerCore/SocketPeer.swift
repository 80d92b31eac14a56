import CAuthBrokerSystem
import NIOCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// The credentials `SO_PEERCRED` reports for a connected Unix socket: for the daemon, the
/// client's process; for a client, the process that made the listening socket.
package struct PeerCredentials: Sendable, Equatable {
    package var pid: Int32
    package var uid: UInt32

    package init(pid: Int32, uid: UInt32) {
        self.pid = pid
        self.uid = uid
    }
}

/// A socket where the broker should be, held by a process of another user: nothing was sent.
package struct ForeignListener: Error, Sendable, Equatable {
    package var socketPath: String
    /// The uid of the process listening, or nil when the kernel could not say.
    package var listenerUID: UInt32?
    package var ownUID: UInt32

    package init(socketPath: String, listenerUID: UInt32?, ownUID: UInt32) {
        self.socketPath = socketPath
        self.listenerUID = listenerUID
        self.ownUID = ownUID
    }

    /// What happened and what to do, for `authbrokerctl` and the client library alike.
    package var message: String {
        let who = listenerUID.map { "a process of uid \($0)" } ?? "a process the kernel cannot name"
        return "refusing to use \(socketPath): \(who) listens there, not authbrokerd running as you (uid \(ownUID)); nothing was sent. Another user may have put a socket where your daemon's should be. Stop using that path, and if it is the /tmp fallback, set XDG_RUNTIME_DIR (or AUTHBROKER_SOCKET) to a directory of your own."
    }
}

extension Channel {
    /// The peer's pid and uid, read with `SO_PEERCRED` before anything is read or written.
    package func peerCredentials() -> EventLoopFuture<PeerCredentials> {
        guard let provider = self as? any SocketOptionProvider else {
            return self.eventLoop.makeFailedFuture(ChannelError.operationUnsupported)
        }
        let level = SocketOptionLevel(cab_sol_socket())
        let name = SocketOptionName(cab_so_peercred())
        let future: EventLoopFuture<cab_ucred> = provider.unsafeGetSocketOption(level: level, name: name)
        return future.map { PeerCredentials(pid: $0.pid, uid: $0.uid) }
    }

    /// Before a client sends anything: the listener must run as this process's user, or a
    /// socket planted by another user would receive passwords and PKCS#12 files. The caller
    /// closes the channel on failure.
    package func verifyListenerIsOwnUser(socketPath: String) async throws(ForeignListener) {
        let own = UInt32(geteuid())
        let credentials: PeerCredentials
        do {
            credentials = try await self.peerCredentials().get()
        } catch {
            throw ForeignListener(socketPath: socketPath, listenerUID: nil, ownUID: own)
        }
        guard credentials.uid == own else {
            throw ForeignListener(socketPath: socketPath, listenerUID: credentials.uid, ownUID: own)
        }
    }
}

extension cab_ucred: @retroactive @unchecked Sendable {}  // plain integers; the C import just lacks the annotation
