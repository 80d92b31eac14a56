/// The Public Suffix List (publicsuffix.org, shipped by Debian's `publicsuffix` package as
/// `/usr/share/publicsuffix/public_suffix_list.dat`): the names under which anyone may register
/// a name of their own (`com`, `co.uk`, `github.io`). A host pattern that covers one,
/// `*.co.uk`, would reach servers of unrelated owners, so trust material (anchors, client
/// identities, exceptions) is never scoped to one.
///
/// Parsing is total: every line is a rule, a comment, or ignored. Rules with non-ASCII labels
/// are left out (host patterns are ASCII, A-labels only; a user writing `xn--…` for such a
/// suffix is not stopped by this list, only by the single-label rule).
package struct PublicSuffixList: Sendable {
    /// Largest list file read (Debian's is about 250 KB).
    package static let maxBytes = 4 << 20
    /// Where Debian's package puts the list.
    package static let debianPath = "/usr/share/publicsuffix/public_suffix_list.dat"

    /// Plain rules (`co.uk`), the bases of wildcard rules (`ck` for `*.ck`), and exceptions
    /// (`www.ck` for `!www.ck`).
    private var rules: Set<String> = []
    private var wildcardBases: Set<String> = []
    private var exceptions: Set<String> = []
    /// Every proper ancestor of a rule (`amazonaws.com` for `s3.amazonaws.com`), with one rule
    /// under it, to name in the error.
    private var ancestors: [String: String] = [:]

    package private(set) var ruleCount = 0

    /// The list with no rules: only the list's own default, that every top-level name is a
    /// public suffix, applies. Used when the file is missing.
    package static let defaultRuleOnly = PublicSuffixList()

    private init() {}

    package init(parsing text: Substring) {
        for line in text.split(whereSeparator: { $0 == "\n" || $0 == "\r" }) {
            guard let token = line.split(whereSeparator: { $0 == " " || $0 == "\t" }).first, !token.hasPrefix("//") else {
                continue
            }
            // A DNS name is at most 253 bytes: a longer token is no rule (and recording each of
            // its ancestors would cost time and memory quadratic in its length).
            guard token.utf8.count <= 253, token.unicodeScalars.allSatisfy(\.isASCII) else { continue }
            var rule = token.lowercased()
            while rule.hasSuffix(".") { rule.removeLast() }
            if rule.hasPrefix("!") {
                let exception = String(rule.dropFirst())
                guard !exception.isEmpty else { continue }
                self.exceptions.insert(exception)
                continue
            }
            var name = rule
            if rule.hasPrefix("*.") {
                name = String(rule.dropFirst(2))
                guard !name.isEmpty, !name.contains("*") else { continue }
                self.wildcardBases.insert(name)
                self.record(ancestorsOf: name, example: rule, includingSelf: true)
            } else {
                guard !name.isEmpty, !name.contains("*") else { continue }
                self.rules.insert(name)
                self.record(ancestorsOf: name, example: rule, includingSelf: false)
            }
            self.ruleCount += 1
        }
    }

    private mutating func record(ancestorsOf name: String, example: String, includingSelf: Bool) {
        var labels = name.split(separator: ".")
        if !includingSelf { labels.removeFirst() }
        while !labels.isEmpty {
            let ancestor = labels.joined(separator: ".")
            if self.ancestors[ancestor] == nil { self.ancestors[ancestor] = example }
            labels.removeFirst()
        }
    }

    /// Whether `name` (lower-case, no trailing dot) is itself a public suffix.
    package func isPublicSuffix(_ name: String) -> Bool {
        if self.exceptions.contains(name) { return false }
        if !name.contains(".") { return true }  // the list's default rule: "*"
        if self.rules.contains(name) { return true }
        guard let dot = name.firstIndex(of: ".") else { return false }
        return self.wildcardBases.contains(String(name[name.index(after: dot)...]))
    }

    /// The public suffix a pattern covers, when it covers one: `*.S` matches every name below
    /// `S`, so it covers `S` when `S` is a public suffix, and any public suffix below `S`
    /// (`*.amazonaws.com` covers `s3.amazonaws.com`). An exact name or an IP address covers none.
    package func coveredSuffix(by pattern: HostPattern) -> String? {
        let text = pattern.description
        guard text.hasPrefix("*.") else { return nil }
        let base = String(text.dropFirst(2))
        if self.isPublicSuffix(base) { return base }
        if self.wildcardBases.contains(base) { return "*.\(base)" }
        return self.ancestors[base]
    }
}
