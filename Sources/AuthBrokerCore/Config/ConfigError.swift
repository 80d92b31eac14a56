/// Why the daemon's configuration file could not be used, with the place to fix it.
///
/// Every configuration problem a user can meet ends up here, so that `authbrokerd` can print one
/// line in the `file:line: key: message` shape editors and terminals recognise, and the message
/// says what to change. `code` lets callers and tests tell kinds apart without matching text.
package struct ConfigError: Error, CustomStringConvertible, Equatable, Sendable {
    /// The kind of problem; stable for tests and for mapping to exit codes.
    package enum Code: String, Sendable, Equatable, CaseIterable {
        /// The text is not in the TOML subset the broker reads (see `TOMLSubset`).
        case syntax
        /// A `[table]` the broker does not know.
        case unknownTable
        /// A key the broker does not know in a table it does know.
        case unknownKey
        /// A known key in the wrong table, or outside any table.
        case misplacedKey
        /// A value of the wrong TOML type (a string where a number belongs, ...).
        case wrongType
        /// A number outside the accepted range.
        case outOfRange
        /// A value of the right type that is still not acceptable (a relative path, a bad entry).
        case invalidValue
        /// The file exists but cannot be read.
        case unreadable
        /// The file is not UTF-8 text.
        case notUTF8
        /// The file is larger than `TOMLSubset.maxInputBytes`.
        case tooLarge
    }

    package var code: Code
    /// The configuration file, as the user named it (or as it was resolved).
    package var file: String
    /// The 1-based line the problem is on, when it is on one.
    package var line: Int?
    /// The setting involved, qualified by its table: `upstream.connect_timeout_ms`.
    package var key: String?
    /// What is wrong and what to do about it.
    package var message: String

    package init(_ code: Code, file: String, line: Int? = nil, key: String? = nil, message: String) {
        self.code = code
        self.file = file
        self.line = line
        self.key = key
        self.message = message
    }

    /// `file:line: key: message`, leaving out the parts that are unknown.
    package var description: String {
        var text = file
        if let line { text += ":\(line)" }
        text += ": "
        if let key { text += "\(key): " }
        return text + message
    }
}
