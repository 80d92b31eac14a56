import AuthBrokerCore
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix

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
    /// Binds every configured address (or the user's own port when none is configured).
    static func bind(
        _ configured: [ProxyListenAddress]?, uid: UInt32, group: any EventLoopGroup,
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
                throw ListenerError(description: "cannot listen on the proxy port \(address): \(error)." + (advice.isEmpty ? "" : " \(advice)"))
            }
        }
        do {
            if let configured {
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
            for channel in channels { try? await channel.channel.close() }
            throw error
        }
        return channels
    }

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
                let pid = TCPSocketOwner.process(holding: owner.inode, uid: owner.uid) ?? 0
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
