import AuthBrokerCore
import NIOCore
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// `TCPSocketOwner` against the real kernel: loopback connections made here, asked about by
/// their addresses as the proxy port asks about a client's.
@Suite("TCP socket owner (NETLINK_SOCK_DIAG)")
struct TCPSocketOwnerTests {
    /// A connected pair on loopback: the client's fd, the accepted fd, and both addresses.
    final class Pair {
        let listener: Int32
        let client: Int32
        let accepted: Int32
        let clientAddress: SocketAddress
        let serverAddress: SocketAddress

        init(ipv6: Bool = false) throws {
            let family = ipv6 ? AF_INET6 : AF_INET
            let listener = socket(family, Int32(SOCK_STREAM.rawValue), 0)
            let client = socket(family, Int32(SOCK_STREAM.rawValue), 0)
            self.listener = listener
            self.client = client
            try SocketAddress(ipAddress: ipv6 ? "::1" : "127.0.0.1", port: 0).withSockAddr { address, length in
                guard bind(listener, address, socklen_t(length)) == 0, listen(listener, 4) == 0 else {
                    throw TestFailure("bind/listen: \(String(cString: strerror(errno)))")
                }
            }
            let bound = try Self.localAddress(listener)
            try bound.withSockAddr { address, length in
                guard connect(client, address, socklen_t(length)) == 0 else {
                    throw TestFailure("connect: \(String(cString: strerror(errno)))")
                }
            }
            self.accepted = accept(listener, nil, nil)
            self.clientAddress = try Self.localAddress(client)
            self.serverAddress = bound
        }

        deinit {
            close(self.client)
            close(self.accepted)
            close(self.listener)
        }

        static func localAddress(_ fd: Int32) throws -> SocketAddress {
            var storage = sockaddr_storage()
            var length = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let status = withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
            }
            guard status == 0 else { throw TestFailure("getsockname failed") }
            // The port is at the same place in sockaddr_in and sockaddr_in6, in network order.
            let port = withUnsafeBytes(of: storage) { Int($0[2]) << 8 | Int($0[3]) }
            return try SocketAddress(ipAddress: storage.ss_family == sa_family_t(AF_INET6) ? "::1" : "127.0.0.1", port: port)
        }

        /// The client socket's inode, as `/proc/self/fd` names it.
        var clientInode: UInt64 {
            var info = stat()
            fstat(self.client, &info)
            return UInt64(info.st_ino)
        }
    }

    struct TestFailure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    @Test("the client end of a loopback connection is found: this user's uid, its inode, this process", arguments: [false, true])
    func findsOwnConnection(ipv6: Bool) throws {
        let pair: Pair
        do {
            pair = try Pair(ipv6: ipv6)
        } catch where ipv6 {
            return  // No IPv6 loopback on this machine: nothing to ask about.
        }
        let owner = try TCPSocketOwner.lookup(client: pair.clientAddress, server: pair.serverAddress).get()
        #expect(owner.uid == getuid())
        #expect(owner.inode == pair.clientInode)
        #expect(TCPSocketOwner.process(holding: owner.inode, uid: owner.uid) == getpid())
    }

    @Test("a hint is read first but never trusted: a wrong, dead or absent hint still finds the holder")
    func processHint() throws {
        let pair = try Pair()
        let owner = try TCPSocketOwner.lookup(client: pair.clientAddress, server: pair.serverAddress).get()
        #expect(TCPSocketOwner.process(holding: owner.inode, uid: owner.uid, hint: getpid()) == getpid())
        // Another live process (pid 1), a pid no process has, and a negative one.
        for hint: Int32 in [1, Int32.max, -5, 0] {
            #expect(TCPSocketOwner.process(holding: owner.inode, uid: owner.uid, hint: hint) == getpid(), "hint \(hint)")
        }
        // The hint does not make a socket nobody holds (inode 1) appear held.
        #expect(TCPSocketOwner.process(holding: 1, uid: getuid(), hint: getpid()) == nil)
        // Nor is it taken for a process of another user.
        #expect(TCPSocketOwner.process(holding: owner.inode, uid: getuid() &+ 1, hint: getpid()) == nil)
    }

    @Test("the lookup is exact: the server's own end is told apart, and a pair no socket has is not found")
    func lookupIsExact() throws {
        let pair = try Pair()
        // Asked the other way round, the answer is the accepted socket, not the client's.
        let reversed = try TCPSocketOwner.lookup(client: pair.serverAddress, server: pair.clientAddress).get()
        #expect(reversed.inode != pair.clientInode)
        var otherPort = pair.clientAddress
        otherPort.port = pair.clientAddress.port == 65_535 ? 65_534 : (pair.clientAddress.port ?? 0) + 1
        #expect(TCPSocketOwner.lookup(client: otherPort, server: pair.serverAddress) == .failure(.notFound))
    }

    @Test("addresses that are not TCP/IP, or of two families, are refused without asking")
    func unsupportedAddresses() throws {
        let unix = try SocketAddress(unixDomainSocketPath: "/tmp/x.sock")
        let v4 = try SocketAddress(ipAddress: "127.0.0.1", port: 1)
        let v6 = try SocketAddress(ipAddress: "::1", port: 1)
        #expect(TCPSocketOwner.lookup(client: unix, server: v4) == .failure(.unsupportedAddress))
        #expect(TCPSocketOwner.lookup(client: v4, server: v6) == .failure(.unsupportedAddress))
        #expect(TCPSocketOwner.process(holding: 1, uid: getuid()) == nil)
    }
}
