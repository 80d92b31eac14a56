import AuthBrokerCore
import Testing

/// Which passed descriptor is the Unix socket and which the proxy port's.
struct SystemdListenFDsTests {
    static func passed(_ fds: String?, _ names: String?, pid: String = "42") -> SystemdListenFDs {
        var environment = ["LISTEN_PID": pid]
        environment["LISTEN_FDS"] = fds
        environment["LISTEN_FDNAMES"] = names
        return SystemdListenFDs.passed(to: 42, environment: environment)
    }

    @Test func namedSockets() {
        #expect(Self.passed("1", "authbrokerd.socket") == SystemdListenFDs(control: 3))
        #expect(Self.passed("2", "authbrokerd.socket:proxy") == SystemdListenFDs(control: 3, proxy: [4]))
        #expect(Self.passed("3", "proxy:authbrokerd.socket:proxy") == SystemdListenFDs(control: 4, proxy: [3, 5]))
        #expect(Self.passed("1", "proxy") == SystemdListenFDs(proxy: [3]))
        #expect(Self.passed("3", "a:b:proxy") == SystemdListenFDs(control: 3, proxy: [5], ignored: [4]))
    }

    @Test func unnamedOrMismatchedNamesMeanTheFirstIsTheSocket() {
        #expect(Self.passed("1", nil) == SystemdListenFDs(control: 3))
        #expect(Self.passed("2", nil) == SystemdListenFDs(control: 3, ignored: [4]))
        #expect(Self.passed("2", "proxy") == SystemdListenFDs(control: 3, ignored: [4]))
        #expect(Self.passed("1", "proxy:proxy") == SystemdListenFDs(control: 3))
    }

    @Test(arguments: [("1", "7"), ("0", "42"), ("-1", "42"), ("65", "42"), ("x", "42"), ("", "42"), ("1", "")])
    func notForUsOrNotANumber(fds: String, pid: String) {
        #expect(Self.passed(fds, "proxy", pid: pid) == SystemdListenFDs())
    }
}
