#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#endif

/// A loopback address and port for the proxy port (`[proxy] listen`): `127.0.0.1:3128`,
/// `[::1]:3128`; port 0 lets the kernel choose.
///
/// Only loopback: the port serves one user's processes (each connection's owner is checked),
/// and nothing outside the machine should reach a port that spends that user's credentials.
package struct ProxyListenAddress: Sendable, Hashable, CustomStringConvertible {
    /// Numeric, IPv6 without brackets.
    package var address: String
    package var port: Int

    package init(address: String, port: Int) {
        self.address = address
        self.port = port
    }

    package var isIPv6: Bool { self.address.contains(":") }

    /// `127.0.0.1:3128`, `[::1]:3128`: how `status` and `http_proxy` write it.
    package var description: String { self.isIPv6 ? "[\(self.address)]:\(self.port)" : "\(self.address):\(self.port)" }

    /// The first port of the per-user range: 127.0.0.1 at `base + uid % span`, below the
    /// kernel's ephemeral ports (32768 up), so a user's port stays the same from boot to boot.
    package static let userPortBase = 21_000
    package static let userPortSpan = 10_000

    /// Where a user's proxy port is when the configuration does not say: the same port for the
    /// same uid, so environments made by `authbrokerctl env` stay right across restarts.
    package static func userDefault(uid: UInt32) -> ProxyListenAddress {
        ProxyListenAddress(address: "127.0.0.1", port: Self.userPortBase + Int(uid % UInt32(Self.userPortSpan)))
    }

    /// Why an address was refused.
    package struct ParseError: Error, Sendable, Equatable, CustomStringConvertible {
        package var input: String
        package var message: String

        package var description: String { "\"\(TOMLValue.escapedForMessage(self.input))\": \(self.message)" }
    }

    /// Parses `address:port` (IPv6 in brackets); the address must be a loopback one.
    package init(parsing text: String) throws(ParseError) {
        func failure(_ message: String) -> ParseError {
            ParseError(input: text, message: message + "; write a loopback address and port, like 127.0.0.1:3128 or [::1]:3128")
        }
        let hostPart: Substring
        let portPart: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { throw failure("an IPv6 address needs its closing ']'") }
            hostPart = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { throw failure("the port is missing") }
            portPart = rest.dropFirst()
        } else {
            guard let colon = text.lastIndex(of: ":") else { throw failure("the port is missing") }
            hostPart = text[..<colon]
            portPart = text[text.index(after: colon)...]
            guard !hostPart.contains(":") else { throw failure("an IPv6 address goes in brackets") }
        }
        guard !portPart.isEmpty, portPart.count <= 5, portPart.allSatisfy({ $0.isASCII && $0.isNumber }),
            let port = Int(portPart), port <= 65_535
        else {
            throw failure("the port must be a number from 0 to 65535 (0: any free port)")
        }
        let host = String(hostPart)
        if host.contains(":") {
            var bytes = in6_addr()
            guard inet_pton(AF_INET6, host, &bytes) == 1 else { throw failure("\(host) is not an IPv6 address") }
            var loopback = in6addr_loopback
            guard memcmp(&bytes, &loopback, MemoryLayout<in6_addr>.size) == 0 else {
                throw failure("\(host) is not the loopback address ::1; the proxy port serves this machine only")
            }
            self.init(address: "::1", port: port)
        } else {
            var bytes = in_addr()
            guard inet_pton(AF_INET, host, &bytes) == 1 else {
                throw failure("\(host.isEmpty ? "the address" : host) is not a numeric IPv4 address")
            }
            guard UInt32(bigEndian: bytes.s_addr) >> 24 == 127 else {
                throw failure("\(host) is not a loopback address (127.0.0.0/8); the proxy port serves this machine only")
            }
            self.init(address: host, port: port)
        }
    }
}
