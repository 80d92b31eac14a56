/// The listening sockets systemd passed (sd_listen_fds(3)): descriptors 3, 4, ... as
/// `LISTEN_FDS` counts them, for the process `LISTEN_PID` names, with the names of
/// `LISTEN_FDNAMES` (each socket unit's `FileDescriptorName=`).
///
/// Sockets named `proxy` are the proxy port's (`authbroker-proxy.socket`); the first other one
/// is the daemon's Unix socket; any further ones are not the daemon's and are left alone.
package struct SystemdListenFDs: Sendable, Equatable {
    package static let firstDescriptor: Int32 = 3
    package static let proxyName = "proxy"
    /// More than this is not a unit file of ours.
    static let maxCount = 64

    /// The Unix socket's descriptor, when systemd passed one.
    package var control: Int32?
    package var proxy: [Int32]
    /// Passed but not ours to use (unknown names, a second socket): reported, not served.
    package var ignored: [Int32]

    package init(control: Int32? = nil, proxy: [Int32] = [], ignored: [Int32] = []) {
        self.control = control
        self.proxy = proxy
        self.ignored = ignored
    }

    /// What the environment passes to `pid`. Names that do not match the count (a hand-made
    /// environment) are ignored: the first descriptor is then the Unix socket, as before names.
    package static func passed(to pid: Int32, environment: [String: String]) -> SystemdListenFDs {
        guard let listenPID = environment["LISTEN_PID"].flatMap({ Int32($0) }), listenPID == pid,
            let count = environment["LISTEN_FDS"].flatMap({ Int($0) }), (1...maxCount).contains(count)
        else { return SystemdListenFDs() }
        let names = environment["LISTEN_FDNAMES"].map { $0.split(separator: ":", omittingEmptySubsequences: false).map(String.init) }
        var result = SystemdListenFDs()
        for index in 0..<count {
            let descriptor = firstDescriptor + Int32(index)
            let name = names.flatMap { $0.count == count ? $0[index] : nil }
            if name == proxyName {
                result.proxy.append(descriptor)
            } else if result.control == nil {
                result.control = descriptor
            } else {
                result.ignored.append(descriptor)
            }
        }
        return result
    }
}
