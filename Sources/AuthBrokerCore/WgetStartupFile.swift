/// The startup file that makes wget trust the broker's local CA.
///
/// wget reads no CA environment variable (Debian's GnuTLS build included), but it reads the file
/// `WGETRC` names in place of `~/.wgetrc` (`/etc/wgetrc` is still read first). `authbrokerctl env`
/// and `run` write one beside the CA bundle: the user's own startup file, then
/// `ca_certificate = <bundle>` (a later setting wins over an earlier one).
///
/// Its content depends on the caller (its `WGETRC` and `HOME`), so each content has its own file,
/// named after a checksum of it: a caller with other settings never rewrites the file a shell
/// set up earlier still names, and an unchanged content reuses its file.
package enum WgetStartupFile {
    /// How the names of the files start, in the directory of the CA bundle (the daemon's state
    /// directory).
    package static let fileNamePrefix = "wgetrc-"
    /// The one file earlier versions wrote, for every caller alike.
    static let legacyFileName = "wgetrc"
    /// How long a file nobody was handed goes unremoved (`env` and `run` touch the file they
    /// hand out, so this counts from the last time any caller got that content).
    package static let unusedLifetimeSeconds: Int64 = 30 * 24 * 60 * 60

    /// The file's name for `content`: the prefix and 8 hex digits of its CRC-32. Two contents
    /// may share a name (one chance in 2^32); the writer then replaces the file, as when there
    /// was one file for all.
    package static func fileName(content: String) -> String {
        let hex = String(CRC32.checksum(content.utf8), radix: 16)
        return Self.fileNamePrefix + String(repeating: "0", count: 8 - hex.count) + hex
    }

    /// Whether `name` is one of the names the broker gives these files (`fileName(content:)`, or
    /// the one file of earlier versions).
    package static func isBrokerFileName(_ name: Substring) -> Bool {
        if name == Self.legacyFileName[...] { return true }
        guard name.hasPrefix(Self.fileNamePrefix) else { return false }
        let digits = name.dropFirst(Self.fileNamePrefix.count).utf8
        return digits.count == 8 && digits.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// Whether `path` names a file the broker wrote in `directory`: then it is no user's file.
    package static func isBrokerFile(_ path: String, directory: String) -> Bool {
        guard let slash = path.lastIndex(of: "/") else { return false }
        func trimmed(_ text: Substring) -> Substring {
            var text = text
            while text.count > 1, text.last == "/" { text = text.dropLast() }
            return text
        }
        let parent = path[..<slash].isEmpty ? "/"[...] : trimmed(path[..<slash])
        return parent == trimmed(directory[...]) && Self.isBrokerFileName(path[path.index(after: slash)...])
    }

    /// Whether a file named `name`, last modified `age` seconds ago, is one of ours nobody has
    /// been handed for `unusedLifetimeSeconds`, and so may be removed. `current` (the file just
    /// handed out) never is.
    package static func isStale(name: String, current: String, ageSeconds: Int64) -> Bool {
        name != current && Self.isBrokerFileName(name[...]) && ageSeconds > Self.unusedLifetimeSeconds
    }

    /// Commands not copied: passwords stay where the user put them (wget still reads `~/.netrc`;
    /// the broker answers with its stored passwords). Normalised as wget compares commands:
    /// case, `_` and `-` do not count.
    static let omittedCommands: Set<String> = ["password", "httppassword", "ftppassword", "proxypassword"]

    /// Header fields whose `header = ...` lines are not copied: they carry credentials.
    static let omittedHeaderFields: Set<String> = ["authorization", "proxy-authorization"]

    /// The file holding the user's own settings, as wget chooses it: the one `WGETRC` names when
    /// set and not empty, else `~/.wgetrc` (nil without a home directory). A file the broker
    /// wrote in `brokerDirectory` is skipped, so a program run from a shell that already has the
    /// broker's environment does not copy the copy.
    package static func userFile(environment: [String: String], home: String?, brokerDirectory: String) -> String? {
        if let named = environment["WGETRC"], !named.isEmpty, !Self.isBrokerFile(named, directory: brokerDirectory) {
            return named
        }
        guard let home, !home.isEmpty else { return nil }
        return home.hasSuffix("/") ? home + ".wgetrc" : home + "/.wgetrc"
    }

    /// The file's content: `userSettings` (the user's startup file, nil when there is none)
    /// without the lines that hold secrets (`isSecret`), then `ca_certificate = caBundle`. Lines
    /// end in `\n` (a `\r\n` of the user's file too). Nil when `caBundle` cannot be written as a
    /// wgetrc value (a line break in it).
    package static func content(userSettings: String?, caBundle: String) -> String? {
        guard !caBundle.isEmpty, !caBundle.contains(where: \.isNewline) else { return nil }
        var lines: [Substring] = []
        if let userSettings {
            lines = Self.lines(of: userSettings)
            lines.removeAll(where: Self.isSecret)
        }
        lines.append("# Added by authbrokerctl: trust the broker's local CA (and the system anchors).")
        lines.append("ca_certificate = \(caBundle)")
        return lines.joined(separator: "\n") + "\n"
    }

    /// The lines of a startup file as wget reads them: split at each `\n` (never within a
    /// character: in Swift `"\r\n"` is one), each without its `\r\n` or `\n`; no empty last line
    /// after a final line end.
    static func lines(of text: String) -> [Substring] {
        var lines = text.utf8.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).map { Substring($0) }
        if lines.last?.isEmpty == true { lines.removeLast() }
        return lines.map { $0.utf8.last == UInt8(ascii: "\r") ? $0.dropLast() : $0 }
    }

    /// Whether `line` holds a secret, so it is not copied: a password command; a `header` line
    /// sending `Authorization` or `Proxy-Authorization`; a proxy URL (`http_proxy`,
    /// `https_proxy`, `ftp_proxy`) with a password in it (`user:password@`).
    static func isSecret(_ line: Substring) -> Bool {
        guard let (command, value) = Self.setting(of: line) else { return false }
        if Self.omittedCommands.contains(command) { return true }
        if command == "header" {
            let field = value.prefix { $0 != ":" }.trimmingASCIIWhitespace()
            return value.contains(":") && Self.omittedHeaderFields.contains(field.lowercased())
        }
        if command.hasSuffix("proxy") {
            var authority = value[...]
            if let scheme = authority.firstRange(of: "://") { authority = authority[scheme.upperBound...] }
            authority = authority.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            guard let at = authority.lastIndex(of: "@") else { return false }
            return authority[..<at].contains(":")
        }
        return false
    }

    /// The command a wgetrc line sets, normalised (lower case, without `_` and `-`), and its
    /// value without the spaces around it; nil for a blank line, a comment or a line wget would
    /// not parse.
    static func setting(of line: Substring) -> (command: String, value: Substring)? {
        let trimmed = line.drop { $0 == " " || $0 == "\t" }
        guard let first = trimmed.first, first != "#" else { return nil }
        let name = trimmed.prefix { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == "-") }
        let rest = trimmed.dropFirst(name.count).drop { $0 == " " || $0 == "\t" }
        guard !name.isEmpty, rest.first == "=" else { return nil }
        return (String(name.lowercased().filter { $0 != "_" && $0 != "-" }), rest.dropFirst().trimmingASCIIWhitespace())
    }
}
