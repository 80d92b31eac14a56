import AuthBrokerCore
import Foundation
import Testing

@Suite("PublicSuffixList")
struct PublicSuffixListTests {
    static let sample = PublicSuffixList(
        parsing: """
            // ===BEGIN ICANN DOMAINS===
            com
            uk
            co.uk
            *.ck
            !www.ck
            公司.cn
            // ===BEGIN PRIVATE DOMAINS===
            github.io
            s3.amazonaws.com   trailing words are ignored
            \t
            !
            *.
            a.*.b
            CAPS.Example.
            """
    )

    static func pattern(_ text: String) throws -> HostPattern { try HostPattern(parsing: text) }

    @Test(
        "wildcards over a public suffix, or over a name above one, are found, with the suffix named",
        arguments: [
            ("*.com", "com"), ("*.uk", "uk"), ("*.co.uk", "co.uk"), ("*.lan", "lan"), ("*.github.io", "github.io"),
            ("*.io", "io"), ("*.amazonaws.com", "s3.amazonaws.com"), ("*.ck", "ck"), ("*.foo.ck", "foo.ck"),
            ("*.caps.example", "caps.example"), ("*.example", "example"),
        ]
    )
    func covered(pattern: String, suffix: String) throws {
        #expect(Self.sample.coveredSuffix(by: try Self.pattern(pattern)) == suffix)
    }

    @Test(
        "wildcards below a registrable name, exact names and addresses cover none",
        arguments: ["*.example.com", "*.corp.co.uk", "*.me.github.io", "*.www.ck", "com", "co.uk", "example.com", "192.0.2.1", "::1", "*.b.s3.amazonaws.com"]
    )
    func notCovered(pattern: String) throws {
        #expect(Self.sample.coveredSuffix(by: try Self.pattern(pattern)) == nil)
    }

    @Test("without a list only the default rule applies: a wildcard over one label")
    func defaultRuleOnly() throws {
        #expect(PublicSuffixList.defaultRuleOnly.coveredSuffix(by: try Self.pattern("*.com")) == "com")
        #expect(PublicSuffixList.defaultRuleOnly.coveredSuffix(by: try Self.pattern("*.co.uk")) == nil)
        #expect(PublicSuffixList.defaultRuleOnly.ruleCount == 0)
    }

    @Test("hostile list text: every line is a rule, a comment or ignored; nothing traps")
    func hostileText() {
        let inputs = ["", "\n\n\n", String(repeating: ".", count: 10_000), "!!!\n***\n*.*.*", "\u{0}\u{1}\r\r", String(repeating: "a.", count: 5_000)]
        for input in inputs {
            let list = PublicSuffixList(parsing: Substring(input))
            _ = list.isPublicSuffix("a.b")
        }
        #expect(Self.sample.ruleCount == 7)
        // A wrong file with one dotted token of 100,000 labels: no rule (each of its ancestors
        // recorded would be gigabytes), while a name of the longest DNS length still is one.
        #expect(PublicSuffixList(parsing: Substring(String(repeating: "a.", count: 100_000) + "b")).ruleCount == 0)
        let longest = String(repeating: "a.", count: 126) + "b"
        #expect(longest.utf8.count == 253 && PublicSuffixList(parsing: Substring(longest)).ruleCount == 1)
    }

    @Test("Debian's list, where installed, refuses what a browser would call a public suffix")
    func debianList() throws {
        guard let text = try? String(contentsOfFile: PublicSuffixList.debianPath, encoding: .utf8) else { return }
        let list = PublicSuffixList(parsing: Substring(text))
        #expect(list.ruleCount > 5_000)
        for covering in ["*.com", "*.co.uk", "*.github.io", "*.amazonaws.com", "*.arpa"] {
            #expect(list.coveredSuffix(by: try Self.pattern(covering)) != nil, "\(covering)")
        }
        for fine in ["*.example.com", "*.internal.test", "*.corp.example", "*.home.arpa", "*.bbc.co.uk"] {
            #expect(list.coveredSuffix(by: try Self.pattern(fine)) == nil, "\(fine)")
        }
    }
}
