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

/// Who holds the client end of a loopback TCP connection, as the kernel says
/// (`NETLINK_SOCK_DIAG`): the proxy port's equivalent of `SO_PEERCRED`, which TCP lacks.
package enum TCPSocketOwner {
    /// The client socket's owner, and its inode (to find the process holding it).
    package struct Owner: Sendable, Equatable {
        package var uid: UInt32
        package var inode: UInt64
    }

    /// Why the owner is unknown; the daemon closes such a connection unread.
    package enum LookupError: Error, Sendable, Equatable, CustomStringConvertible {
        /// No socket has these addresses (the client already left), or they are not TCP/IP.
        case notFound
        case unsupportedAddress
        /// The kernel refused the question (errno).
        case failed(Int32)

        package var description: String {
            switch self {
            case .notFound: "the kernel knows no socket with these addresses (the client may have gone)"
            case .unsupportedAddress: "not an IPv4 or IPv6 connection"
            case .failed(let code): "the kernel's socket table could not be read: \(String(cString: strerror(code)))"
            }
        }
    }

    /// The owner of the socket at `client` connected to `server` (our end of the connection:
    /// `server` is our local address, `client` the remote one).
    package static func lookup(client: SocketAddress, server: SocketAddress) -> Result<Owner, LookupError> {
        guard let (family, clientBytes, clientPort) = Self.parts(client), let (serverFamily, serverBytes, serverPort) = Self.parts(server),
            family == serverFamily
        else { return .failure(.unsupportedAddress) }
        var uid: UInt32 = 0
        var inode: UInt64 = 0
        let status = clientBytes.withUnsafeBufferPointer { clientPointer in
            serverBytes.withUnsafeBufferPointer { serverPointer in
                cab_tcp_socket_owner(family, clientPointer.baseAddress, clientPort, serverPointer.baseAddress, serverPort, &uid, &inode)
            }
        }
        switch status {
        case 0: return .success(Owner(uid: uid, inode: inode))
        case ENOENT: return .failure(.notFound)
        default: return .failure(.failed(status))
        }
    }

    /// The process of `uid` holding the socket `inode`, found in `/proc/PID/fd`; nil when none
    /// is found (it closed the socket, or passed it to a process of another user). Reads the
    /// user's processes' descriptor tables: not for an event loop. `hint` is looked at first:
    /// a program that opened the last connection usually opens the next too, and its table
    /// alone is much quicker to read than every process's. When several processes hold the
    /// socket (inherited, or passed over a Unix socket), the hint's wins, then the newest: any
    /// of them could write on it, and each is the user's own.
    package static func process(holding inode: UInt64, uid: UInt32, hint: Int32 = 0) -> Int32? {
        var pid: Int32 = 0
        return cab_socket_inode_pid(inode, uid, hint, &pid) == 0 ? pid : nil
    }

    /// The family, address bytes (network order) and port, read back from the address's text
    /// with `inet_pton`: the `sockaddr_in` members belong to whichever C module included the
    /// system header first (here NIO's), which this file cannot see.
    private static func parts(_ address: SocketAddress) -> (CInt, [UInt8], UInt16)? {
        let family: CInt
        let length: Int
        switch address {
        case .v4: (family, length) = (AF_INET, 4)
        case .v6: (family, length) = (AF_INET6, 16)
        case .unixDomainSocket: return nil
        }
        guard let text = address.ipAddress, let port = address.port, let port16 = UInt16(exactly: port) else { return nil }
        var bytes = [UInt8](repeating: 0, count: length)
        guard bytes.withUnsafeMutableBytes({ inet_pton(family, text, $0.baseAddress) }) == 1 else { return nil }
        return (family, bytes, port16)
    }
}
