import AuthBrokerCore
import Testing

/// `[[respond]]` rules: matching, header fields, and the config's errors by line.
struct CannedResponseTests {
    static let file = "/test/config.toml"

    @Test func matching() throws {
        let rule = CannedResponse(match: RequestMatch(method: "GET", scheme: .https, host: try HostPattern(parsing: "*.corp.test"), pathPrefix: "/v1/"), line: 3)
        let origin = try CanonicalOrigin(scheme: .https, host: "api.corp.test", port: 443)
        #expect(rule.matches(method: "GET", origin: origin, pathAndQuery: "/v1/items?x=1"))
        #expect(!rule.matches(method: "get", origin: origin, pathAndQuery: "/v1/items"))
        #expect(!rule.matches(method: "POST", origin: origin, pathAndQuery: "/v1/items"))
        #expect(!rule.matches(method: "GET", origin: origin, pathAndQuery: "/v2/items"))
        #expect(!rule.matches(method: "GET", origin: try CanonicalOrigin(scheme: .http, host: "api.corp.test", port: 80), pathAndQuery: "/v1/"))
        #expect(!rule.matches(method: "GET", origin: try CanonicalOrigin(scheme: .https, host: "corp.test", port: 443), pathAndQuery: "/v1/"))
        var rules = BrokerRules()
        rules.responses = [rule]
        #expect(rules.cover(host: "x.corp.test"))
        #expect(!rules.cover(host: "example.com"))
    }

    @Test(arguments: [
        ("Content-Type: application/json", "Content-Type", "application/json"),
        ("X-Empty:", "X-Empty", ""),
        ("X-Spaced: \t value with spaces \t", "X-Spaced", "value with spaces"),
        ("X-Colon: a:b", "X-Colon", "a:b"),
    ])
    func fields(text: String, name: String, value: String) throws {
        #expect(try CannedResponse.parseField(text).get() == CannedResponse.Field(name: name, value: value))
    }

    @Test(arguments: [
        ("no colon", CannedResponse.FieldError.noColon), (": value", .badName), ("Bad Name: x", .badName),
        ("X: a\r\nInjected: yes", .badValue), ("X: nul\u{0}", .badValue), ("Content-Length: 5", .reserved("Content-Length")),
        ("transfer-encoding: chunked", .reserved("transfer-encoding")), ("Authbroker-Error: forged", .reserved("Authbroker-Error")),
        ("Connection: close", .reserved("Connection")), ("Ünïcode: x", .badName),
    ])
    func badFields(text: String, error: CannedResponse.FieldError) {
        #expect(throws: error) { try CannedResponse.parseField(text).get() }
    }

    @Test func parsedFromTheConfig() throws {
        let text = "[[respond]]\nhost = \"stub.test\"\n[[respond]]\nmethod = \"POST\"\nscheme = \"https\"\nhost = \"*.x.test\"\npath = \"/a\"\nstatus = 418\nheaders = [\"X-A: 1\"]\nfile = \"/srv/teapot.txt\"\n"
        let rules = try BrokerSettings.parse(text, file: Self.file).responses
        #expect(rules.count == 2)
        #expect(rules[0] == CannedResponse(match: RequestMatch(host: try HostPattern(parsing: "stub.test")), line: 1))
        #expect(rules[1].match.method == "POST" && rules[1].match.scheme == .https && rules[1].match.pathPrefix == "/a" && rules[1].status == 418)
        #expect(rules[1].headers == [CannedResponse.Field(name: "X-A", value: "1")] && rules[1].body == .file("/srv/teapot.txt"))
    }

    @Test(arguments: [
        ("[[respond]]\npath = \"/\"\n", 1, "has no host"),
        ("[[respond]]\nhost = \"a.test\"\nstatus = 101\n", 3, "out of range"),
        ("[[respond]]\nhost = \"a.test\"\nstatus = \"200\"\n", 3, "expected an HTTP status code"),
        ("[[respond]]\nhost = \"a.test\"\npath = \"v1\"\n", 3, "starts with /"),
        ("[[respond]]\nhost = \"a.test\"\npath = \"/a b\"\n", 3, "no spaces"),
        ("[[respond]]\nhost = \"a.test\"\nscheme = \"ftp\"\n", 3, "\"http\" or \"https\""),
        ("[[respond]]\nhost = \"a.test\"\nmethod = \"G E T\"\n", 3, "is not a method"),
        ("[[respond]]\nhost = \"a.test\"\nheaders = [\"Content-Length: 3\"]\n", 3, "entry 1: Content-Length is set by the broker"),
        ("[[respond]]\nhost = \"a.test\"\nheaders = \"X: 1\"\n", 3, "expected an array"),
        ("[[respond]]\nhost = \"a.test\"\nbody = \"x\"\nfile = \"/f\"\n", 4, "body or file, not both"),
        ("[[respond]]\nhost = \"a.test\"\nfile = \"f\"\n", 3, "relative path"),
        ("[[respond]]\nhost = \"a.test\"\nbodies = \"x\"\n", 3, "accepts method, scheme, host"),
        ("[[respond]]\nhost = \"a.test\"\nbodys = \"x\"\n", 3, "did you mean body"),
    ])
    func configErrors(text: String, line: Int, message: String) {
        let error = #expect(throws: ConfigError.self) { try BrokerSettings.parse(text, file: Self.file) }
        #expect(error?.line == line, "\(error?.description ?? "")")
        #expect(error?.description.contains(message) == true, "\(error?.description ?? "")")
    }
}
