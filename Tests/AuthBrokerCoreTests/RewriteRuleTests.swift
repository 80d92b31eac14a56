import AuthBrokerCore
import NIOHTTP1
import Testing

/// `[[rewrite]]`: the URL it makes, the fields it edits, and the config's errors by line.
struct RewriteRuleTests {
    static let file = "/test/config.toml"

    static func rule(_ text: String) throws -> RewriteRule {
        try #require(try BrokerSettings.parse(text, file: Self.file).rewrites.first)
    }

    @Test func rewrittenURL() throws {
        let rule = try Self.rule("[[rewrite]]\nhost = \"old.test\"\npath = \"/api/\"\nto = \"https://new.test:8443/v2/\"\n")
        let old = try CanonicalOrigin(scheme: .http, host: "old.test", port: 80)
        let (origin, path) = rule.rewritten(origin: old, pathAndQuery: "/api/items?x=1")
        #expect(origin == (try CanonicalOrigin(scheme: .https, host: "new.test", port: 8443)))
        #expect(path == "/v2/items?x=1")
        #expect(!rule.match.matches(method: "GET", origin: old, pathAndQuery: "/apis"))
        // Only headers: the URL stays.
        let edit = try Self.rule("[[rewrite]]\nhost = \"old.test\"\nset_request_headers = [\"X-A: 1\"]\n")
        #expect(edit.rewritten(origin: old, pathAndQuery: "/p").pathAndQuery == "/p")
        var rules = BrokerRules()
        rules.rewrites = [try Self.rule("[[rewrite]]\nhost = \"*.prod.test\"\nconnect_to = \"10.0.0.7:8443\"\n")]
        #expect(rules.connectTarget(for: "db.prod.test")! == ("10.0.0.7", 8443))  // a literal rule: the target exists
        #expect(rules.connectTarget(for: "prod.test") == nil)
        #expect(rules.cover(host: "db.prod.test") && !rules.cover(host: "example.com"))
    }

    @Test func headerEdits() throws {
        let rule = try Self.rule(
            "[[rewrite]]\nhost = \"a.test\"\nset_request_headers = [\"X-Env: staging\", \"Accept: text/plain\"]\nremove_request_headers = [\"Cookie\", \"x-debug\"]\nset_response_headers = [\"Cache-Control: no-store\"]\nremove_response_headers = [\"Server\"]\n"
        )
        var request = HTTPHeaders([("Cookie", "a=1"), ("X-Debug", "1"), ("Accept", "*/*"), ("Keep", "me")])
        rule.editRequest(&request)
        #expect(request["cookie"].isEmpty && request["x-debug"].isEmpty)
        #expect(request["accept"] == ["text/plain"] && request["x-env"] == ["staging"] && request["keep"] == ["me"])
        var response = HTTPHeaders([("Server", "nginx"), ("Cache-Control", "max-age=60")])
        rule.editResponse(&response)
        #expect(response["server"].isEmpty && response["cache-control"] == ["no-store"])
    }

    @Test(arguments: [
        ("[[rewrite]]\nhost = \"a.test\"\nto = \"ftp://b.test/\"\n", 3, "not an http:// or https:// URL"),
        ("[[rewrite]]\nhost = \"a.test\"\nto = \"/relative\"\n", 3, "not an http:// or https:// URL"),
        ("[[rewrite]]\nhost = \"a.test\"\nconnect_to = \"b.test\"\n", 3, "is not host:port"),
        ("[[rewrite]]\nhost = \"a.test\"\npath = \"/x\"\nconnect_to = \"b.test:443\"\n", 4, "may name no method or path"),
        ("[[rewrite]]\nhost = \"a.test\"\nmethod = \"GET\"\nconnect_to = \"b.test:443\"\n", 4, "may name no method or path"),
        ("[[rewrite]]\nhost = \"a.test\"\nto = \"http://b.test/\"\nconnect_to = \"b.test:443\"\n", 4, "not both"),
        ("[[rewrite]]\nhost = \"a.test\"\nremove_request_headers = [\"Host\"]\n", 3, "entry 1: Host is set by the broker"),
        ("[[rewrite]]\nhost = \"a.test\"\nremove_response_headers = [\"Bad Name\"]\n", 3, "entry 1: the header name must be a token"),
        ("[[rewrite]]\nhost = \"a.test\"\nset_response_headers = [\"Authbroker-Error: x\"]\n", 3, "entry 1: Authbroker-Error"),
        ("[[rewrite]]\nhost = \"a.test\"\nset_request_headers = [\"Content-Length: 1\"]\n", 3, "entry 1: Content-Length"),
        ("[[rewrite]]\nto = \"http://b.test/\"\n", 1, "this [[rewrite]] has no host"),
        ("[[rewrite]]\nhost = \"a.test\"\nredirect = \"http://b.test/\"\n", 3, "unknown setting in [[rewrite]]"),
    ])
    func configErrors(text: String, line: Int, message: String) {
        let error = #expect(throws: ConfigError.self) { try BrokerSettings.parse(text, file: Self.file) }
        #expect(error?.line == line, "\(error?.description ?? "")")
        #expect(error?.description.contains(message) == true, "\(error?.description ?? "")")
    }
}
