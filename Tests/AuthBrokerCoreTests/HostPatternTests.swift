import AuthBrokerCore
import Foundation
import Testing

@Suite("HostPattern")
struct HostPatternTests {
    @Test(
        "valid patterns parse to their canonical form",
        arguments: [
            ("example.com", "example.com"),
            ("Example.COM", "example.com"),
            ("example.com.", "example.com"),
            ("  example.com\n", "example.com"),
            ("*.example.com", "*.example.com"),
            ("*.Internal.Test", "*.internal.test"),
            ("localhost", "localhost"),
            ("xn--bcher-kva.example", "xn--bcher-kva.example"),
            ("a-b.c-d.example", "a-b.c-d.example"),
            ("123.example.com", "123.example.com"),
            ("192.0.2.1", "192.0.2.1"),
            ("0.0.0.0", "0.0.0.0"),
            ("255.255.255.255", "255.255.255.255"),
            ("::1", "::1"),
            ("[::1]", "::1"),
            ("2001:DB8::1", "2001:db8::1"),
            ("2001:db8:0:0:0:0:0:1", "2001:db8::1"),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1"),
            ("2001:0db8:0001:0000:0000:0000:0000:0000", "2001:db8:1::"),
            ("1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8"),
            ("1:0:3:4:5:6:7:8", "1:0:3:4:5:6:7:8"),
            ("::ffff:192.0.2.1", "::ffff:192.0.2.1"),
            ("::FFFF:c000:0201", "::ffff:192.0.2.1"),
            ("::", "::"),
            (String(repeating: "a", count: 63) + ".test", String(repeating: "a", count: 63) + ".test"),
        ]
    )
    func valid(input: String, canonical: String) throws {
        let pattern = try HostPattern(parsing: input)
        #expect(pattern.description == canonical)
        // The canonical form parses to the same pattern.
        #expect(try HostPattern(parsing: canonical) == pattern)
    }

    @Test(
        "hostile and invalid patterns are refused with a code",
        arguments: [
            ("", "empty"),
            ("   ", "empty"),
            ("*", "wildcard_only"),
            ("*.", "wildcard_only"),
            ("bücher.example", "not_ascii"),
            ("exam\u{0430}ple.com", "not_ascii"),
            ("https://example.com", "url"),
            ("https://example.com/path", "url"),
            ("example.com/path", "url"),
            ("user@example.com", "url"),
            ("example.com?x", "url"),
            ("example.com:443", "port"),
            ("[::1]:443", "port"),
            ("192.0.2.1:80", "port"),
            ("f*.example.com", "bad_wildcard"),
            ("*example.com", "bad_wildcard"),
            ("a.*.example.com", "bad_wildcard"),
            ("*.*.example.com", "bad_wildcard"),
            ("**.example.com", "bad_wildcard"),
            ("example.*", "bad_wildcard"),
            ("*.192.0.2.1", "bad_wildcard"),
            (".example.com", "bad_label"),
            ("example..com", "bad_label"),
            ("example.com..", "bad_label"),
            ("-example.com", "bad_label"),
            ("example-.com", "bad_label"),
            ("exa_mple.com", "bad_label"),
            ("exa mple.com", "bad_label"),
            ("example.com\0", "bad_label"),
            (String(repeating: "a", count: 64) + ".test", "bad_label"),
            (Array(repeating: "abcdefghi", count: 26).joined(separator: "."), "too_long"),
            (String(repeating: "a", count: 10_000), "too_long"),
            ("256.0.0.1", "bad_ip_address"),
            ("192.0.2", "bad_ip_address"),
            ("192.0.2.01", "bad_ip_address"),
            ("1.2.3.4.5", "bad_ip_address"),
            ("1:2:3:4:5:6:7:8:9", "bad_ip_address"),
            ("1::2::3", "bad_ip_address"),
            ("fe80::1%eth0", "bad_ip_address"),
            ("12345::1", "bad_ip_address"),
            ("[::1", "bad_ip_address"),
            ("[example.com]", "bad_ip_address"),
            ("[::1]x", "bad_ip_address"),
            (":::", "bad_ip_address"),
            ("::ffff:1.2.3", "bad_ip_address"),
        ]
    )
    func invalid(input: String, code: String) {
        do {
            let pattern = try HostPattern(parsing: input)
            Issue.record("'\(input)' parsed as \(pattern)")
        } catch {
            #expect(error.code == code, "\(input.prefix(40)): \(error.message)")
            #expect(!error.message.isEmpty)
        }
    }

    @Test("error messages say what to write instead")
    func messages() {
        func message(_ input: String) -> String {
            do {
                _ = try HostPattern(parsing: input)
                return ""
            } catch {
                return error.message
            }
        }
        #expect(message("https://example.com/").contains("not a URL"))
        #expect(message("bücher.example").contains("xn--"))
        #expect(message("example.com:8443").contains("write example.com"))
        #expect(message("a.*.example.com").contains("*.example.com"))
    }

    @Test(
        "matching",
        arguments: [
            ("example.com", "example.com", true),
            ("example.com", "www.example.com", false),
            ("example.com", "example.com.", true),
            ("example.com", "example.org", false),
            ("*.example.com", "a.example.com", true),
            ("*.example.com", "a.b.example.com", true),
            ("*.example.com", "example.com", false),
            ("*.example.com", "aexample.com", false),
            ("*.example.com", ".example.com", false),
            ("*.example.com", "a.example.com.evil.test", false),
            ("*.internal.test", "a.internal.test", true),
            ("*.internal.test", "other.example", false),
            ("192.0.2.1", "192.0.2.1", true),
            ("192.0.2.1", "192.0.2.10", false),
            ("192.0.2.1", "::ffff:192.0.2.1", false),
            ("::1", "::1", true),
            ("::1", "0:0:0:0:0:0:0:1", true),
            ("[::1]", "[::1]", true),
            ("2001:db8::1", "2001:DB8::1", true),
            ("2001:db8::1", "2001:db8::2", false),
            ("localhost", "127.0.0.1", false),
        ]
    )
    func matching(pattern: String, host: String, expected: Bool) throws {
        #expect(try HostPattern(parsing: pattern).matches(host) == expected)
    }

    @Test("Codable as a single string, rejecting invalid strings")
    func codable() throws {
        let patterns = try ["*.example.com", "192.0.2.1", "::1"].map { try HostPattern(parsing: $0) }
        let data = try JSONEncoder().encode(patterns)
        #expect(String(data: data, encoding: .utf8) == #"["*.example.com","192.0.2.1","::1"]"#)
        #expect(try JSONDecoder().decode([HostPattern].self, from: data) == patterns)
        #expect(throws: DecodingError.self) {
            try JSONDecoder().decode([HostPattern].self, from: Data(#"["https://x.test/"]"#.utf8))
        }
    }

    @Test("IP helpers round-trip and refuse other lengths")
    func ipHelpers() {
        #expect(HostPattern.ipAddressBytes("192.0.2.1") == [192, 0, 2, 1])
        #expect(HostPattern.ipAddressBytes("example.com") == nil)
        #expect(HostPattern.ipAddressText([1, 2, 3]) == nil)
        #expect(HostPattern.ipAddressText([UInt8](repeating: 0, count: 16)) == "::")
        #expect(HostPattern.ipAddressText([0, 1] + [UInt8](repeating: 0, count: 14)) == "1::")
    }
}
