import Testing

@testable import AuthBrokerCore

@Suite("Broker paths")
struct BrokerPathsTests {
    struct SocketCase: Sendable, CustomTestStringConvertible {
        var name: String
        var explicit: String?
        var configured: String?
        var environment: [String: String]
        var expected: String
        var testDescription: String { name }
    }

    @Test(arguments: [
        SocketCase(
            name: "explicit flag beats everything", explicit: "/flag.sock", configured: "/config.sock",
            environment: ["AUTHBROKER_SOCKET": "/env.sock", "XDG_RUNTIME_DIR": "/run/user/1000"], expected: "/flag.sock"),
        SocketCase(
            name: "environment beats configuration", explicit: nil, configured: "/config.sock",
            environment: ["AUTHBROKER_SOCKET": "/env.sock", "XDG_RUNTIME_DIR": "/run/user/1000"], expected: "/env.sock"),
        SocketCase(
            name: "configuration beats XDG", explicit: nil, configured: "/config.sock",
            environment: ["XDG_RUNTIME_DIR": "/run/user/1000"], expected: "/config.sock"),
        SocketCase(
            name: "XDG runtime directory", explicit: nil, configured: nil,
            environment: ["XDG_RUNTIME_DIR": "/run/user/1000"], expected: "/run/user/1000/authbroker/authbroker.sock"),
        SocketCase(
            name: "trailing slash in XDG_RUNTIME_DIR", explicit: nil, configured: nil,
            environment: ["XDG_RUNTIME_DIR": "/run/user/1000/"], expected: "/run/user/1000/authbroker/authbroker.sock"),
        SocketCase(
            name: "empty values are ignored", explicit: "", configured: "",
            environment: ["AUTHBROKER_SOCKET": "", "XDG_RUNTIME_DIR": ""], expected: "/tmp/authbroker-1000/authbroker.sock"),
        SocketCase(
            name: "relative XDG_RUNTIME_DIR is ignored", explicit: nil, configured: nil,
            environment: ["XDG_RUNTIME_DIR": "run/user/1000"], expected: "/tmp/authbroker-1000/authbroker.sock"),
        SocketCase(
            name: "nothing set", explicit: nil, configured: nil, environment: [:],
            expected: "/tmp/authbroker-1000/authbroker.sock"),
        SocketCase(
            name: "HOME does not matter for the socket", explicit: nil, configured: nil,
            environment: ["HOME": "/home/u"], expected: "/tmp/authbroker-1000/authbroker.sock"),
    ])
    func socketPath(_ test: SocketCase) {
        #expect(
            BrokerPaths.socketPath(explicit: test.explicit, configured: test.configured, environment: test.environment, uid: 1000)
                == test.expected
        )
    }

    @Test func socketFallbackUsesTheUid() {
        #expect(BrokerPaths.socketPath(explicit: nil, configured: nil, environment: [:], uid: 0) == "/tmp/authbroker-0/authbroker.sock")
        #expect(
            BrokerPaths.socketPath(explicit: nil, configured: nil, environment: [:], uid: 4_294_967_294)
                == "/tmp/authbroker-4294967294/authbroker.sock"
        )
        #expect(BrokerPaths.fallbackDirectory(uid: 1000, environment: [:]) == "/tmp/authbroker-1000")
    }

    @Test func fallbackHonoursAnAbsoluteTMPDIR() {
        #expect(BrokerPaths.fallbackDirectory(uid: 7, environment: ["TMPDIR": "/var/tmp/u/"]) == "/var/tmp/u/authbroker-7")
        #expect(BrokerPaths.fallbackDirectory(uid: 7, environment: ["TMPDIR": "relative"]) == "/tmp/authbroker-7")
        #expect(BrokerPaths.fallbackDirectory(uid: 7, environment: ["TMPDIR": ""]) == "/tmp/authbroker-7")
        #expect(
            BrokerPaths.socketPath(explicit: nil, configured: nil, environment: ["TMPDIR": "/t"], uid: 7) == "/t/authbroker-7/authbroker.sock"
        )
        #expect(BrokerPaths.stateDirectory(configured: nil, environment: ["TMPDIR": "/t"], uid: 7) == "/t/authbroker-7/state")
        #expect(BrokerPaths.dataDirectory(environment: ["TMPDIR": "/t"], uid: 7) == "/t/authbroker-7/data")
    }

    @Test(arguments: [
        ("/x/flag.toml", ["AUTHBROKER_CONFIG": "/env.toml", "XDG_CONFIG_HOME": "/xdg", "HOME": "/home/u"], "/x/flag.toml"),
        (nil, ["AUTHBROKER_CONFIG": "/env.toml", "XDG_CONFIG_HOME": "/xdg", "HOME": "/home/u"], "/env.toml"),
        (nil, ["XDG_CONFIG_HOME": "/xdg", "HOME": "/home/u"], "/xdg/authbroker/config.toml"),
        (nil, ["XDG_CONFIG_HOME": "relative", "HOME": "/home/u"], "/home/u/.config/authbroker/config.toml"),
        (nil, ["XDG_CONFIG_HOME": "", "HOME": "/home/u/"], "/home/u/.config/authbroker/config.toml"),
        ("", ["AUTHBROKER_CONFIG": "", "HOME": "/home/u"], "/home/u/.config/authbroker/config.toml"),
        (nil, ["HOME": "/"], "/.config/authbroker/config.toml"),
        (nil, [:], "/etc/authbroker/config.toml"),
        (nil, ["HOME": "relative/home"], "/etc/authbroker/config.toml"),
    ] as [(String?, [String: String], String)])
    func configFile(explicit: String?, environment: [String: String], expected: String) {
        #expect(BrokerPaths.configFile(explicit: explicit, environment: environment) == expected)
    }

    @Test(arguments: [
        ("/srv/state", ["XDG_STATE_HOME": "/xdg-state", "HOME": "/home/u"], "/srv/state"),
        (nil, ["XDG_STATE_HOME": "/xdg-state", "HOME": "/home/u"], "/xdg-state/authbroker"),
        (nil, ["XDG_STATE_HOME": "xdg-state", "HOME": "/home/u"], "/home/u/.local/state/authbroker"),
        ("", ["HOME": "/home/u"], "/home/u/.local/state/authbroker"),
        (nil, [:], "/tmp/authbroker-1000/state"),
        (nil, ["HOME": ""], "/tmp/authbroker-1000/state"),
        (nil, ["XDG_RUNTIME_DIR": "/run/user/1000"], "/tmp/authbroker-1000/state"),
    ] as [(String?, [String: String], String)])
    func stateDirectory(configured: String?, environment: [String: String], expected: String) {
        #expect(BrokerPaths.stateDirectory(configured: configured, environment: environment, uid: 1000) == expected)
    }
}
