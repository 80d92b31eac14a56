/// Where the daemon's socket, configuration and state live, decided from the environment.
///
/// Pure functions of an environment dictionary (and the uid), so that every precedence rule is
/// tested without touching the process environment. Locations follow the XDG Base Directory
/// Specification 0.8 (https://specifications.freedesktop.org/basedir-spec/0.8/):
/// `$XDG_RUNTIME_DIR` for the socket, `$XDG_CONFIG_HOME` for `config.toml`, `$XDG_STATE_HOME`
/// for state. As that specification requires, a variable that is unset, empty or holds a
/// relative path is ignored and the next choice applies.
package struct BrokerPaths: Sendable {
    /// Overrides the socket path for the daemon and every client (`authbrokerctl`, apps).
    package static let socketEnvironmentVariable = "AUTHBROKER_SOCKET"
    /// Overrides the configuration file path.
    package static let configEnvironmentVariable = "AUTHBROKER_CONFIG"
    /// The directory name used under each XDG base directory.
    package static let applicationDirectoryName = "authbroker"
    package static let socketFileName = "authbroker.sock"
    package static let configFileName = "config.toml"

    private init() {}

    /// The socket to listen on or connect to.
    ///
    /// Precedence: `explicit` (a command-line flag) > `$AUTHBROKER_SOCKET` > `configured`
    /// (`socket_path` in the file) > `$XDG_RUNTIME_DIR/authbroker/authbroker.sock` >
    /// `$TMPDIR/authbroker-<uid>/authbroker.sock` (`/tmp` without `$TMPDIR`). The runtime directory is the XDG choice because
    /// it is owned by the user, mode 0700, and removed at logout (XDG Base Directory
    /// §"$XDG_RUNTIME_DIR"); the spec asks applications to fall back to a replacement directory
    /// with similar properties when it is unset, which the `/tmp` fallback is.
    ///
    /// - Warning: the fallback lives in a world-writable directory. Whoever creates the socket
    ///   must create the fallback directory with mode 0700, or, if it exists, refuse it unless it
    ///   is a real directory (not a symlink) owned by `uid` with mode 0700
    ///   (`PrivateFiles.ensureDirectory`); clients check who listens (`ListenerCheck`).
    package static func socketPath(explicit: String?, configured: String?, environment: [String: String], uid: UInt32) -> String {
        if let explicit = nonEmpty(explicit) { return explicit }
        if let fromEnvironment = nonEmpty(environment[socketEnvironmentVariable]) { return fromEnvironment }
        if let configured = nonEmpty(configured) { return configured }
        return defaultSocketPath(environment: environment, uid: uid)
    }

    /// The socket when nobody chose one: in the broker's own directory, which the daemon
    /// creates private (0700) and refuses to use otherwise.
    package static func defaultSocketPath(environment: [String: String], uid: UInt32) -> String {
        if let runtime = xdgDirectory("XDG_RUNTIME_DIR", in: environment) {
            return join(runtime, applicationDirectoryName, socketFileName)
        }
        return join(fallbackDirectory(uid: uid, environment: environment), socketFileName)
    }

    /// The configuration file to read (it need not exist).
    ///
    /// Precedence: `explicit` > `$AUTHBROKER_CONFIG` > `$XDG_CONFIG_HOME/authbroker/config.toml`
    /// > `$HOME/.config/authbroker/config.toml` (the spec's default for an unset
    /// `$XDG_CONFIG_HOME`) > `/etc/authbroker/config.toml` when even `$HOME` is unusable.
    package static func configFile(explicit: String?, environment: [String: String]) -> String {
        if let explicit = nonEmpty(explicit) { return explicit }
        if let fromEnvironment = nonEmpty(environment[configEnvironmentVariable]) { return fromEnvironment }
        if let configHome = xdgDirectory("XDG_CONFIG_HOME", in: environment) {
            return join(configHome, applicationDirectoryName, configFileName)
        }
        if let home = xdgDirectory("HOME", in: environment) {
            return join(home, ".config", applicationDirectoryName, configFileName)
        }
        return join("/etc", applicationDirectoryName, configFileName)
    }

    /// The directory for the daemon's persistent state (the user's anchors, pins, the
    /// encrypted secret file).
    ///
    /// Precedence: `configured` (`state_dir`) > `$XDG_STATE_HOME/authbroker` >
    /// `$HOME/.local/state/authbroker` (the spec's default for an unset `$XDG_STATE_HOME`) >
    /// `$TMPDIR/authbroker-<uid>/state` when even `$HOME` is unusable.
    ///
    /// - Warning: the last fallback does not survive a reboot, and lives under a
    ///   world-writable directory; the same ownership checks as for the socket apply.
    package static func stateDirectory(configured: String?, environment: [String: String], uid: UInt32) -> String {
        if let configured = nonEmpty(configured) { return configured }
        if let stateHome = xdgDirectory("XDG_STATE_HOME", in: environment) {
            return join(stateHome, applicationDirectoryName)
        }
        if let home = xdgDirectory("HOME", in: environment) {
            return join(home, ".local", "state", applicationDirectoryName)
        }
        return join(fallbackDirectory(uid: uid, environment: environment), "state")
    }

    /// The directory for the encrypted secrets file: `$XDG_DATA_HOME/authbroker` >
    /// `$HOME/.local/share/authbroker` > the state directory's fallback.
    package static func dataDirectory(environment: [String: String], uid: UInt32) -> String {
        if let dataHome = xdgDirectory("XDG_DATA_HOME", in: environment) {
            return join(dataHome, applicationDirectoryName)
        }
        if let home = xdgDirectory("HOME", in: environment) {
            return join(home, ".local", "share", applicationDirectoryName)
        }
        return join(fallbackDirectory(uid: uid, environment: environment), "data")
    }

    /// The HTTP cache's directory: `configured` (`[cache] directory`) > `$XDG_CACHE_HOME/authbroker/http`
    /// > `$HOME/.cache/authbroker/http` > the state directory's fallback. What is kept there can
    /// be lost without harm (XDG Base Directory: "non-essential data").
    package static func cacheDirectory(configured: String?, environment: [String: String], uid: UInt32) -> String {
        if let configured = nonEmpty(configured) { return configured }
        if let cacheHome = xdgDirectory("XDG_CACHE_HOME", in: environment) {
            return join(cacheHome, applicationDirectoryName, "http")
        }
        if let home = xdgDirectory("HOME", in: environment) {
            return join(home, ".cache", applicationDirectoryName, "http")
        }
        return join(fallbackDirectory(uid: uid, environment: environment), "http-cache")
    }

    /// `$TMPDIR/authbroker-<uid>` (`/tmp/authbroker-<uid>` without an absolute `$TMPDIR`): the
    /// per-user directory used when the XDG directories are missing. Everything in it must be
    /// private to the user (`PrivateFiles`), because other users can create names beside it.
    package static func fallbackDirectory(uid: UInt32, environment: [String: String]) -> String {
        join(xdgDirectory("TMPDIR", in: environment) ?? "/tmp", "\(applicationDirectoryName)-\(uid)")
    }

    /// The variable's value if it is set to an absolute path; XDG Base Directory: "If an
    /// implementation encounters a relative path in any of these variables it should consider
    /// the path invalid and ignore it."
    private static func xdgDirectory(_ name: String, in environment: [String: String]) -> String? {
        guard let value = environment[name], value.hasPrefix("/") else { return nil }
        return value
    }

    private static func nonEmpty(_ value: String?) -> String? {
        guard let value, !value.isEmpty else { return nil }
        return value
    }

    /// Joins components with single slashes (`/run/user/1000/` + `authbroker` does not give `//`).
    private static func join(_ base: String, _ components: String...) -> String {
        var path = base
        while path.count > 1, path.hasSuffix("/") { path.removeLast() }
        for component in components {
            path += path.hasSuffix("/") ? component : "/" + component
        }
        return path
    }
}
