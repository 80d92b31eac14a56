import AuthBrokerCore
import Testing

@Suite("WgetStartupFile")
struct WgetStartupFileTests {
    static let bundle = "/home/alice/.local/state/authbroker/ca-bundle.pem"
    static let directory = "/home/alice/.local/state/authbroker"
    static let ours = "/home/alice/.local/state/authbroker/wgetrc-0123abcd"
    static let added = "# Added by authbrokerctl: trust the broker's local CA (and the system anchors).\nca_certificate = \(bundle)\n"

    @Test("without a startup file of the user's: the CA bundle alone")
    func bundleAlone() {
        #expect(WgetStartupFile.content(userSettings: nil, caBundle: Self.bundle) == Self.added)
        #expect(WgetStartupFile.content(userSettings: "", caBundle: Self.bundle) == Self.added)
    }

    @Test("the user's lines come first, unchanged, so the CA line added last wins over theirs")
    func userLinesFirst() {
        let user = "# mine\ntries = 3\n\nca_certificate = /etc/corp.pem\nuser_agent = \"x = y\""
        #expect(WgetStartupFile.content(userSettings: user, caBundle: Self.bundle) == user + "\n" + Self.added)
        #expect(WgetStartupFile.content(userSettings: user + "\n", caBundle: Self.bundle) == user + "\n" + Self.added)
    }

    @Test(
        "lines holding secrets are not copied, however wget would spell them, with LF or CRLF line ends; other lines naming them are",
        arguments: [
            ("password = hunter2", false),
            ("  HTTP_Password=hunter2", false),
            ("http-password = hunter2", false),
            ("ftppassword = hunter2", false),
            ("proxy_password = hunter2", false),
            ("\tProxy-Password\t= hunter2", false),
            ("header = Authorization: Basic YWxpY2U6aHVudGVyMg==", false),
            ("Header=authorization:Bearer x", false),
            ("header = Proxy-Authorization : Basic YWxpY2U6aHVudGVyMg==", false),
            ("https_proxy = http://alice:hunter2@proxy.corp.test:3128/", false),
            ("http-proxy = alice:hunter2@proxy.corp.test:3128", false),
            ("ftp_proxy = http://alice:hunter2@proxy.corp.test:3128", false),
            ("# password = a comment", true),
            ("http_user = alice", true),
            ("ask_password = on", true),
            ("use_askpass = /usr/bin/askpass", true),
            ("passwordish", true),
            ("header = Accept: text/html", true),
            ("header = X-Authorization-Hint: none", true),
            ("https_proxy = http://proxy.corp.test:3128/", true),
            ("https_proxy = http://alice@proxy.corp.test:3128/", true),
            ("http_proxy = http://proxy.corp.test:3128/a:b@c", true),
            ("use_proxy = on", true),
        ]
    )
    func secretsLeftOut(line: String, kept: Bool) throws {
        for end in ["\n", "\r\n"] {
            let user = ["tries = 3", line, "timeout = 9"].map { $0 + end }.joined()
            let content = try #require(WgetStartupFile.content(userSettings: user, caBundle: Self.bundle))
            #expect(content.contains(line) == kept, "\(content)")
            #expect(!content.contains("hunter2") || kept, "\(content)")
            #expect(content == (kept ? "tries = 3\n\(line)\ntimeout = 9\n" : "tries = 3\ntimeout = 9\n") + Self.added, "\(content)")
        }
    }

    @Test("a CRLF file is read line by line and written with LF; a lone CR is no line end (nor is it to wget)")
    func lineEnds() {
        let crlf = "tries = 3\r\n\r\npassword = hunter2\r\ntimeout = 9"
        #expect(WgetStartupFile.content(userSettings: crlf, caBundle: Self.bundle) == "tries = 3\n\ntimeout = 9\n" + Self.added)
        let mixed = "tries = 3\npassword = hunter2\r\nhttp_password = hunter2\n"
        #expect(WgetStartupFile.content(userSettings: mixed, caBundle: Self.bundle) == "tries = 3\n" + Self.added)
        let lone = "tries = 3\rpassword = hunter2\n"
        #expect(WgetStartupFile.content(userSettings: lone, caBundle: Self.bundle) == lone + Self.added)
    }

    @Test("the file is named after its content: the same content, the same name; another, another")
    func namedAfterContent() throws {
        let one = try #require(WgetStartupFile.content(userSettings: "tries = 3\n", caBundle: Self.bundle))
        let other = try #require(WgetStartupFile.content(userSettings: "tries = 4\n", caBundle: Self.bundle))
        let name = WgetStartupFile.fileName(content: one)
        #expect(name == WgetStartupFile.fileName(content: one))
        #expect(name != WgetStartupFile.fileName(content: other))
        #expect(name.hasPrefix("wgetrc-") && name.count == "wgetrc-".count + 8, "\(name)")
        #expect(WgetStartupFile.isBrokerFileName(name[...]))
        // CRC-32 of "123456789" is cbf43926; leading zeros are kept.
        #expect(WgetStartupFile.fileName(content: "123456789") == "wgetrc-cbf43926")
        #expect(WgetStartupFile.fileName(content: "") == "wgetrc-00000000")
    }

    @Test("files of the broker's: its names, in its directory only")
    func brokerFiles() {
        #expect(WgetStartupFile.isBrokerFile(Self.ours, directory: Self.directory))
        #expect(WgetStartupFile.isBrokerFile(Self.directory + "/wgetrc", directory: Self.directory))
        #expect(WgetStartupFile.isBrokerFile(Self.ours, directory: Self.directory + "/"))
        #expect(WgetStartupFile.isBrokerFile("/wgetrc-0123abcd", directory: "/"))
        #expect(!WgetStartupFile.isBrokerFile("/home/alice/wgetrc-0123abcd", directory: Self.directory))
        #expect(!WgetStartupFile.isBrokerFile(Self.directory + "/wgetrc-0123abcd.tmp-1-2", directory: Self.directory))
        #expect(!WgetStartupFile.isBrokerFile(Self.directory + "/wgetrc-0123ABCD", directory: Self.directory))
        #expect(!WgetStartupFile.isBrokerFile(Self.directory + "/wgetrc-mine", directory: Self.directory))
        #expect(!WgetStartupFile.isBrokerFile("wgetrc-0123abcd", directory: Self.directory))
    }

    @Test("a file of ours nobody was handed for 30 days is stale; the current one and others' files never are")
    func staleFiles() {
        let month = WgetStartupFile.unusedLifetimeSeconds
        #expect(month == 30 * 86400)
        #expect(WgetStartupFile.isStale(name: "wgetrc-0123abcd", current: "wgetrc-99999999", ageSeconds: month + 1))
        #expect(WgetStartupFile.isStale(name: "wgetrc", current: "wgetrc-99999999", ageSeconds: month + 1))
        #expect(!WgetStartupFile.isStale(name: "wgetrc-0123abcd", current: "wgetrc-99999999", ageSeconds: month))
        #expect(!WgetStartupFile.isStale(name: "wgetrc-0123abcd", current: "wgetrc-0123abcd", ageSeconds: month * 2))
        #expect(!WgetStartupFile.isStale(name: "ca-bundle.pem", current: "wgetrc-99999999", ageSeconds: month * 2))
        #expect(!WgetStartupFile.isStale(name: "wgetrc-0123abcd.tmp-1-2", current: "wgetrc-99999999", ageSeconds: month * 2))
    }

    @Test("a bundle path that a wgetrc cannot hold gives no file")
    func unwritablePath() {
        #expect(WgetStartupFile.content(userSettings: nil, caBundle: "/tmp/a\nuse_proxy = off") == nil)
        #expect(WgetStartupFile.content(userSettings: nil, caBundle: "") == nil)
    }

    @Test("the user's file is the one WGETRC names, else ~/.wgetrc; never a file the broker wrote")
    func userFileChoice() {
        #expect(WgetStartupFile.userFile(environment: [:], home: "/home/alice", brokerDirectory: Self.directory) == "/home/alice/.wgetrc")
        #expect(WgetStartupFile.userFile(environment: [:], home: "/home/alice/", brokerDirectory: Self.directory) == "/home/alice/.wgetrc")
        #expect(WgetStartupFile.userFile(environment: ["WGETRC": "/etc/team.wgetrc"], home: "/home/alice", brokerDirectory: Self.directory) == "/etc/team.wgetrc")
        #expect(WgetStartupFile.userFile(environment: ["WGETRC": ""], home: "/home/alice", brokerDirectory: Self.directory) == "/home/alice/.wgetrc")
        #expect(WgetStartupFile.userFile(environment: ["WGETRC": Self.ours], home: "/home/alice", brokerDirectory: Self.directory) == "/home/alice/.wgetrc")
        // Any file the broker wrote there, for another caller's content too, or by an earlier version.
        for other in ["/wgetrc-ffff0000", "/wgetrc", "//wgetrc-00000000"] {
            #expect(WgetStartupFile.userFile(environment: ["WGETRC": Self.directory + other], home: "/home/alice", brokerDirectory: Self.directory) == "/home/alice/.wgetrc")
        }
        #expect(WgetStartupFile.userFile(environment: ["WGETRC": "/etc/wgetrc-0123abcd"], home: "/home/alice", brokerDirectory: Self.directory) == "/etc/wgetrc-0123abcd")
        #expect(WgetStartupFile.userFile(environment: [:], home: nil, brokerDirectory: Self.directory) == nil)
    }
}
