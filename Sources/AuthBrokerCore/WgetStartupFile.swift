/// The startup file that makes wget trust the broker's local CA.
///
/// wget reads no CA environment variable (Debian's GnuTLS build included), but it reads the file
/// `WGETRC` names in place of `~/.wgetrc` (`/etc/wgetrc` is still read first). `authbrokerctl env`
/// and `run` write one beside the CA bundle: the user's own startup file, then
/// `ca_certificate = <bundle>` (a later setting wins over an earlier one).
package enum WgetStartupFile {
    /// Its name, in the directory of the CA bundle (the daemon's state directory).
    package static let fileName = "wgetrc"

    /// Commands not copied: passwords stay where the user put them (wget still reads `~/.netrc`;
    /// the broker answers with its stored passwords). Normalised as wget compares commands:
    /// case, `_` and `-` do not count.
    static let omittedCommands: Set<String> = ["password", "httppassword", "ftppassword", "proxypassword"]

    /// The file holding the user's own settings, as wget chooses it: the one `WGETRC` names when
    /// set and not empty, else `~/.wgetrc` (nil without a home directory). `ours` (the file this
    /// writes) is skipped, so a program run from a shell that already has the broker's
    /// environment does not copy the copy.
    package static func userFile(environment: [String: String], home: String?, ours: String) -> String? {
        if let named = environment["WGETRC"], !named.isEmpty, named != ours {
            return named
        }
        guard let home, !home.isEmpty else { return nil }
        return home.hasSuffix("/") ? home + ".wgetrc" : home + "/.wgetrc"
    }

    /// The file's content: `userSettings` (the user's startup file, nil when there is none)
    /// without its password lines, then `ca_certificate = caBundle`. Lines end in `\n` (a `\r\n`
    /// of the user's file too). Nil when `caBundle` cannot be written as a wgetrc value (a line
    /// break in it).
    package static func content(userSettings: String?, caBundle: String) -> String? {
        guard !caBundle.isEmpty, !caBundle.contains(where: \.isNewline) else { return nil }
        var lines: [Substring] = []
        if let userSettings {
            lines = Self.lines(of: userSettings)
            lines.removeAll { line in Self.command(of: line).map { Self.omittedCommands.contains($0) } ?? false }
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

    /// The command a wgetrc line sets, normalised (lower case, without `_` and `-`), or nil for
    /// a blank line, a comment or a line wget would not parse.
    static func command(of line: Substring) -> String? {
        let trimmed = line.drop { $0 == " " || $0 == "\t" }
        guard let first = trimmed.first, first != "#" else { return nil }
        let name = trimmed.prefix { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == "-") }
        let rest = trimmed.dropFirst(name.count).drop { $0 == " " || $0 == "\t" }
        guard !name.isEmpty, rest.first == "=" else { return nil }
        return String(name.lowercased().filter { $0 != "_" && $0 != "-" })
    }
}
