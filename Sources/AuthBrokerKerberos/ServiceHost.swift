#if canImport(Glibc)
import Glibc
#endif

/// The host name a Kerberos service ticket is asked for, as browsers choose it: the canonical
/// name a forward DNS look-up gives (following CNAMEs), lower-cased, without a trailing dot;
/// never a reverse look-up, which would let whoever controls a PTR record pick the service.
package enum ServiceHost {
    /// `host` canonicalised; `host` itself (lower-cased) when it is an IP address, when
    /// `lookUp` is false, or when the look-up fails. Blocks on DNS when `lookUp` is true.
    package static func canonical(_ host: String, lookUp: Bool) -> String {
        let plain = Self.normalised(host)
        guard lookUp, !Self.isIPAddress(plain) else { return plain }
        var hints = addrinfo()
        hints.ai_flags = AI_CANONNAME
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var result: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(plain, nil, &hints, &result) == 0, let first = result else { return plain }
        defer { freeaddrinfo(first) }
        guard let canonical = first.pointee.ai_canonname else { return plain }
        let name = Self.normalised(String(cString: canonical))
        return name.isEmpty ? plain : name
    }

    static func normalised(_ host: String) -> String {
        var name = host.lowercased()
        if name.hasPrefix("["), name.hasSuffix("]") { name = String(name.dropFirst().dropLast()) }
        while name.hasSuffix(".") { name.removeLast() }
        return name
    }

    static func isIPAddress(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }
}
