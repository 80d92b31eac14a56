import AuthBrokerCore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// Where the proxy port listens, for `status`: filled in once it is bound.
package final class ProxyPortAddresses: Sendable {
    private let box = NIOLockedValueBox<[String]>([])

    package init() {}

    /// `127.0.0.1:21000`, `[::1]:3128`: as `http_proxy` takes them.
    package var addresses: [String] { self.box.withLockedValue { $0 } }

    func set(_ addresses: [String]) {
        self.box.withLockedValue { $0 = addresses }
    }
}

/// The loopback TCP port that programs honouring `http_proxy` use: the same client connections
/// as the Unix socket's (one data plane), behind a different door.
///
/// Loopback TCP is open to every user of the machine, and what answers here spends the user's
/// credentials, so before a byte is read the kernel is asked who owns the client's socket
/// (`TCPSocketOwner`): another user's connection, or one whose owner cannot be found, is closed
/// unread. The owner's process is then looked up (off the event loop) for the audit log and
/// agents, as `SO_PEERCRED` gives it on the Unix socket.
enum ProxyPort {
    /// Adopts the sockets systemd passed (`passed`), or else binds every configured address (or
    /// the user's own port when none is configured).
    static func bind(
        _ configured: [ProxyListenAddress]?, passed: [CInt] = [], uid: UInt32, group: any EventLoopGroup,
        admit: @escaping @Sendable (any Channel, ConnectionPeer, Bool) throws -> AcceptedClientConnection,
        counters: BrokerCounters, logger: Logger
    ) async throws -> [NIOAsyncChannel<AcceptedClientConnection, Never>] {
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 256)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
        let initializer: @Sendable (any Channel) -> EventLoopFuture<AcceptedClientConnection> = { channel in
            Self.checkOwner(channel, uid: uid, counters: counters, logger: logger).flatMapThrowing { peer in
                try admit(channel, peer, false)
            }.closingOnFailure(channel)
        }
        var channels: [NIOAsyncChannel<AcceptedClientConnection, Never>] = []
        /// Binds `address`; a failure is a `ListenerError` whose words `advice` ends.
        func bind(_ address: ProxyListenAddress, advice: String) async throws -> NIOAsyncChannel<AcceptedClientConnection, Never> {
            do {
                return try await bootstrap.bind(host: address.address, port: address.port, childChannelInitializer: initializer)
            } catch {
                throw ListenerError(
                    description: "cannot listen on the proxy port \(address): \(ListenerError.reason(error))." + (advice.isEmpty ? "" : " \(advice)")
                )
            }
        }
        do {
            if !passed.isEmpty {
                if configured != nil {
                    logger.notice("systemd passed the proxy port's sockets; [proxy] listen is not used")
                }
                // Every one checked before any is served.
                for fd in passed where !Self.isLoopbackTCPListener(fd) {
                    throw ListenerError(
                        description: "the proxy-port socket systemd passed (fd \(fd)) is not a TCP socket on a loopback address; set ListenStream=127.0.0.1:PORT (or [::1]:PORT) in authbroker-proxy.socket."
                    )
                }
                for fd in passed {
                    channels.append(try await Self.adopt(fd, bootstrap: bootstrap, initializer: initializer))
                }
            } else if let configured {
                for address in configured {
                    let advice = "Choose another address in [proxy] listen (port 0: any free port), or listen = [] to turn the proxy port off."
                    channels.append(try await bind(address, advice: advice))
                }
            } else {
                let preferred = ProxyListenAddress.userDefault(uid: uid)
                do {
                    channels.append(try await bind(preferred, advice: ""))
                } catch {
                    // Taken (by another user's daemon, say): any free port; `status` says which.
                    logger.notice(
                        "the proxy port's usual address is taken; listening on a free port instead",
                        metadata: ["address": "\(preferred)", "error": "\(error)"]
                    )
                    var anyPort = preferred
                    anyPort.port = 0
                    channels.append(try await bind(anyPort, advice: "Set [proxy] listen = [] to run without one."))
                }
            }
        } catch {
            for channel in channels { await channel.closeUnserved() }
            throw error
        }
        return channels
    }

    /// Whether `fd` is a TCP socket bound to a loopback address: a unit that listens on every
    /// interface would hand the user's credentials to the network.
    static func isLoopbackTCPListener(_ fd: CInt) -> Bool {
        var type: CInt = 0
        var typeLength = socklen_t(MemoryLayout<CInt>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &typeLength) == 0, type == CInt(SOCK_STREAM.rawValue) else { return false }
        var storage = sockaddr_storage()
        var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let named = withUnsafeMutablePointer(to: &storage) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) == 0 }
        }
        guard named else { return false }
        switch CInt(storage.ss_family) {
        case AF_INET:
            let address = withUnsafeBytes(of: &storage) { $0.load(as: sockaddr_in.self) }
            return UInt32(bigEndian: address.sin_addr.s_addr) >> 24 == 127
        case AF_INET6:
            let address = withUnsafeBytes(of: &storage) { $0.load(as: sockaddr_in6.self) }
            return withUnsafeBytes(of: address.sin6_addr) { Array($0) } == Array(repeating: 0, count: 15) + [1]
        default:
            return false
        }
    }

    /// A listening socket systemd passed, checked by `isLoopbackTCPListener`.
    private static func adopt(
        _ fd: CInt, bootstrap: ServerBootstrap,
        initializer: @escaping @Sendable (any Channel) -> EventLoopFuture<AcceptedClientConnection>
    ) async throws -> NIOAsyncChannel<AcceptedClientConnection, Never> {
        do {
            return try await bootstrap.bind(fd, childChannelInitializer: initializer)
        } catch {
            throw ListenerError(description: "cannot use the proxy-port socket systemd passed (fd \(fd)): \(error). Check authbroker-proxy.socket.")
        }
    }

    /// The process that opened the last proxy-port connection: its descriptors are read first
    /// for the next one (`TCPSocketOwner.process(holding:uid:hint:)`).
    private static let lastClientProcess = Atomic<Int32>(0)

    /// The client's socket must belong to this user; then its process is looked up.
    private static func checkOwner(
        _ channel: any Channel, uid: UInt32, counters: BrokerCounters, logger: Logger
    ) -> EventLoopFuture<ConnectionPeer> {
        let refuse = { (message: Logger.Message, metadata: Logger.Metadata) -> EventLoopFuture<ConnectionPeer> in
            counters.clientConnectionsRefused.add(1)
            logger.warning(message, metadata: metadata)
            return channel.eventLoop.makeFailedFuture(PeerRejected(credentials: nil))
        }
        let unknown: Logger.Message = "refused a proxy-port connection whose owner the kernel could not name"
        guard let client = channel.remoteAddress, let server = channel.localAddress else {
            return refuse(unknown, ["reason": "the connection has no addresses"])
        }
        switch TCPSocketOwner.lookup(client: client, server: server) {
        case .failure(let error):
            return refuse(unknown, ["peer": "\(client)", "reason": "\(error)"])
        case .success(let owner) where owner.uid != uid:
            return refuse("refused a proxy-port connection that is not from this user", ["peer": "\(client)", "peer_uid": "\(owner.uid)"])
        case .success(let owner):
            // Reading the user's descriptor tables takes a while: not on the event loop.
            return NIOThreadPool.singleton.runIfActive(eventLoop: channel.eventLoop) {
                let pid = TCPSocketOwner.process(holding: owner.inode, uid: owner.uid, hint: Self.lastClientProcess.load(ordering: .relaxed)) ?? 0
                if pid > 0 { Self.lastClientProcess.store(pid, ordering: .relaxed) }
                return ConnectionPeer(credentials: PeerCredentials(pid: pid, uid: owner.uid))
            }
        }
    }

    /// `127.0.0.1:21000` or `[::1]:3128` for a bound address.
    static func describe(_ address: SocketAddress) -> String? {
        guard let ip = address.ipAddress, let port = address.port else { return nil }
        return ProxyListenAddress(address: ip, port: port).description
    }
}
