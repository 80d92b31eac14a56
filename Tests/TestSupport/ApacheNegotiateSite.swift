import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Debian's Apache httpd with mod_auth_gssapi, demanding Negotiate (SPNEGO with Kerberos) the
/// way an intranet server does, against a `KerberosRealm`: an interop check of the broker's
/// Negotiate against a production acceptor.
///
/// Served on 127.0.0.1 at a free port, over TLS when given a server identity (its certificate
/// should name `localhost`), for the host name `localhost`: clients reach it as
/// `https://localhost:<port>/` and so ask the KDC for `HTTP/localhost` (the default
/// `principal`, whose keytab the site gets from the realm). Locations:
/// - `/negotiate/`: `AuthType GSSAPI`, `GssapiAllowedMech krb5`, any valid user. A 401 carries
///   one bare `WWW-Authenticate: Negotiate`; the 200 carries `WWW-Authenticate: Negotiate
///   <token>`, the acceptor's mutual-authentication token (a SPNEGO NegTokenResp,
///   accept-completed, wrapping the AP-REP), which a client should verify.
/// - `/negotiate-or-basic/`: the same plus `GssapiBasicAuth On`: a 401 carries two fields,
///   `WWW-Authenticate: Negotiate` then `WWW-Authenticate: Basic realm="<basicRealm>"`, and a
///   Basic user name and password are checked against the KDC (an AS_REQ in its log).
/// - `/bound/`: the same as `/negotiate/` plus `GssapiConnectionBound On`: once a connection
///   has authenticated, its later requests pass without an `Authorization` field (and each
///   still gets a 200). Without it, every request must carry a fresh token.
/// - `/delegate/`: the same as `/negotiate/` plus `GssapiDelegCcacheDir`, so the module acts
///   on credentials a client delegates (a forwardable TGT in the token) and says so in the
///   error log ("delegated creds"; this mod_auth_gssapi 1.6.4 with MIT 1.20 then fails to store
///   them, "No credentials cache found", which the tests do not need).
/// - `/public/`: no authentication.
///
/// Each serves `index.html` with the body `<name> ok\n` (`negotiate ok`, `negotiate-or-basic
/// ok`, `bound ok`, `public ok`). The access log names the authenticated principal
/// (`alice@AUTHBROKER.TEST`), the client's port (one per connection) and the status.
///
/// mod_auth_gssapi keeps a replay cache: the same `Authorization: Negotiate` token sent twice
/// gets a 401 the second time ("Request is a replay" in the error log). The cache lives in the
/// site's directory (`GssapiCredStore rcache:`), not in /var/tmp.
package final class ApacheNegotiateSite: Sendable {
    package static let gssapiModule = ApacheAuthServer.modulesDirectory + "/mod_auth_gssapi.so"
    package static let basicRealm = "AuthBroker Kerberos"

    /// Whether Apache, mod_ssl and mod_auth_gssapi are installed (`apt-get install apache2
    /// libapache2-mod-auth-gssapi`).
    package static var isInstalled: Bool {
        FileManager.default.isExecutableFile(atPath: ApacheAuthServer.executable)
            && FileManager.default.fileExists(atPath: gssapiModule)
            && FileManager.default.fileExists(atPath: ApacheAuthServer.modulesDirectory + "/mod_ssl.so")
    }

    /// One line of the access log.
    package struct Request: Sendable, Equatable {
        /// The authenticated principal (`alice@AUTHBROKER.TEST`); nil when none (`-`).
        package var user: String?
        /// The client's port: the same for requests on one connection.
        package var clientPort: Int
        /// The request line (`GET /negotiate/ HTTP/1.1`).
        package var requestLine: String
        package var status: Int
    }

    package let port: Int
    package let isTLS: Bool
    /// The service principal the site accepts (`HTTP/localhost@AUTHBROKER.TEST`).
    package let principal: String
    /// The temporary directory: `httpd.conf`, `access.log`, `error.log`, `http.keytab`, `rcache/`.
    package let directory: String
    private let process: SpawnedProcess

    private init(port: Int, isTLS: Bool, principal: String, directory: String, process: SpawnedProcess) {
        self.port = port
        self.isTLS = isTLS
        self.principal = principal
        self.directory = directory
        self.process = process
    }

    /// `https://localhost:<port><path>` (`http:` without TLS).
    package func url(_ path: String) -> String { "\(self.isTLS ? "https" : "http")://localhost:\(self.port)\(path)" }

    /// `%u %{remote}p "%r" %>s` per request.
    package var accessLog: String { ApacheAuthServer.read(self.directory + "/access.log") }
    /// Apache's error log; mod_auth_gssapi logs at info why it refused (`NO AUTH DATA`, a replay).
    package var errorLog: String { ApacheAuthServer.read(self.directory + "/error.log") }

    /// The access log, parsed.
    package var requests: [Request] {
        self.accessLog.split(separator: "\n").compactMap { line in
            // `user port "request line" status`; the request line may hold spaces, not quotes.
            let parts = line.split(separator: "\"", omittingEmptySubsequences: false)
            guard parts.count == 3 else { return nil }
            let head = parts[0].split(separator: " ")
            guard head.count == 2, let port = Int(head[1]), let status = Int(parts[2].trimmingCharacters(in: .whitespaces)) else {
                return nil
            }
            return Request(user: head[0] == "-" ? nil : String(head[0]), clientPort: port, requestLine: String(parts[1]), status: status)
        }
    }

    /// The requests logged after the first `count` lines that pass `filter`, once there are
    /// `wanted` of them or after 5 s: Apache logs a request after answering it, so its line may
    /// trail the response the client already has.
    package func requests(after count: Int, atLeast wanted: Int = 1, where filter: (Request) -> Bool) async -> [Request] {
        var found: [Request] = []
        _ = await waitUntil(seconds: 5) {
            found = self.requests.dropFirst(count).filter(filter)
            return found.count >= wanted
        }
        return found
    }

    /// How many requests got a 401.
    package var unauthorizedCount: Int { self.requests.filter { $0.status == 401 }.count }

    /// Writes the site, takes a keytab for `principal` from `realm`, starts `apache2
    /// -DFOREGROUND` with the realm's krb5.conf, and waits (at most 10 s a try) until its port
    /// accepts connections; a port taken meanwhile is retried with another, twice.
    ///
    /// - Parameters:
    ///   - tlsIdentity: the server certificate and key (for `localhost`); nil serves plain http.
    ///   - principal: the service principal, `HTTP/<the host name clients use>`.
    /// - Throws: when Apache or the module is missing, or Apache does not start; the message
    ///   carries its error log and stderr.
    package static func start(
        realm: KerberosRealm, tlsIdentity: TestIdentity? = nil, principal: String = "HTTP/localhost"
    ) async throws -> ApacheNegotiateSite {
        guard isInstalled else {
            throw TestSupportError("apache2 with mod_ssl and mod_auth_gssapi is needed: apt-get install -y apache2 libapache2-mod-auth-gssapi")
        }
        let keytab = try realm.addService(principal)
        // The realm's krb5.conf; for Basic (mod_auth_gssapi gets a TGT with the password) a
        // cache in memory, never the test's client cache. The keytab and the replay cache are
        // named in the config (GssapiCredStore).
        let environment = ["KRB5_CONFIG": realm.configPath, "KRB5CCNAME": "MEMORY:apache"]
        let tls = tlsIdentity != nil
        let (directory, port, process) = try await ApacheAuthServer.launchInNewDirectory(environment: environment) { directory in
            try self.writeSite(in: directory, keytab: keytab, tlsIdentity: tlsIdentity)
        } configuration: { directory, port in
            configuration(directory: directory, port: port, tls: tls)
        }
        return ApacheNegotiateSite(port: port, isTLS: tls, principal: realm.principal(principal), directory: directory, process: process)
    }

    /// SIGTERM (SIGKILL after 5 s), then removes the directory.
    package func stop() async {
        await self.process.terminate()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    deinit {
        self.process.kill()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    private static func writeSite(in directory: String, keytab: String, tlsIdentity: TestIdentity?) throws {
        let manager = FileManager.default
        for name in ["negotiate", "negotiate-or-basic", "bound", "delegate", "public"] {
            let folder = directory + "/htdocs/" + name
            try manager.createDirectory(atPath: folder, withIntermediateDirectories: true)
            try "\(name) ok\n".write(toFile: folder + "/index.html", atomically: true, encoding: .utf8)
        }
        for folder in ["run", "rcache", "tls", "delegated"] {
            try manager.createDirectory(atPath: directory + "/" + folder, withIntermediateDirectories: true)
        }
        // A copy: the realm's keytab is the test's and 0600, and a root-started Apache reads as www-data.
        try manager.copyItem(atPath: keytab, toPath: directory + "/http.keytab")
        if let tlsIdentity {
            try tlsIdentity.pem.write(toFile: directory + "/tls/server.pem", atomically: true, encoding: .utf8)
            try tlsIdentity.privateKeyPEM.write(toFile: directory + "/tls/server.key", atomically: true, encoding: .utf8)
        }
        try ApacheAuthServer.makeReadableByApache(directory)
        // The replay cache and delegated caches are written by the workers, which run as
        // www-data when started as root.
        if getuid() == 0, let account = getpwnam(ApacheAuthServer.runAs.user) {
            for folder in ["rcache", "delegated"] {
                guard chown(directory + "/" + folder, account.pointee.pw_uid, account.pointee.pw_gid) == 0 else {
                    throw TestSupportError("chown \(directory)/\(folder): \(String(cString: strerror(errno)))")
                }
            }
        }
    }

    private static func configuration(directory: String, port: Int, tls: Bool) -> String {
        var modules = [
            ("mpm_prefork_module", "mod_mpm_prefork.so"), ("unixd_module", "mod_unixd.so"),
            ("authz_core_module", "mod_authz_core.so"), ("authz_user_module", "mod_authz_user.so"),
            ("authn_core_module", "mod_authn_core.so"), ("dir_module", "mod_dir.so"),
            ("log_config_module", "mod_log_config.so"),
            ("auth_gssapi_module", "mod_auth_gssapi.so"),
        ]
        if tls { modules += [("ssl_module", "mod_ssl.so"), ("socache_shmcb_module", "mod_socache_shmcb.so")] }
        let tlsLines =
            tls
            ? """
            SSLEngine on
            SSLCertificateFile "\(directory)/tls/server.pem"
            SSLCertificateKeyFile "\(directory)/tls/server.key"
            SSLSessionCache "shmcb:\(directory)/run/ssl_scache(512000)"
            """ : "# plain http"
        // The replay cache in our directory (a file2 cache the workers share, with locking),
        // not the default /var/tmp/krb5_<uid>.rcache2.
        let gssapi = """
                AuthType GSSAPI
                GssapiCredStore keytab:\(directory)/http.keytab
                GssapiCredStore rcache:file2:\(directory)/rcache/apache.rcache2
                GssapiAllowedMech krb5
                Require valid-user
            """
        return """
            ServerRoot "\(directory)"
            ServerName localhost
            Listen 127.0.0.1:\(port)
            PidFile "\(directory)/run/httpd.pid"
            DefaultRuntimeDir "\(directory)/run"
            ErrorLog "\(directory)/error.log"
            LogLevel warn auth_gssapi:info
            StartServers 2
            MinSpareServers 1
            MaxSpareServers 4
            MaxRequestWorkers 16
            \(ApacheAuthServer.loadModules(modules))
            \(ApacheAuthServer.identityLines)
            LogFormat "%u %{remote}p \\"%r\\" %>s" negotiate
            CustomLog "\(directory)/access.log" negotiate
            \(tlsLines)

            DocumentRoot "\(directory)/htdocs"
            DirectoryIndex index.html
            <Directory "\(directory)/htdocs">
                Require all granted
            </Directory>

            <Location "/negotiate/">
                AuthName "\(basicRealm)"
            \(gssapi)
            </Location>

            <Location "/negotiate-or-basic/">
                AuthName "\(basicRealm)"
            \(gssapi)
                GssapiBasicAuth On
            </Location>

            <Location "/delegate/">
                AuthName "\(basicRealm)"
            \(gssapi)
                GssapiDelegCcacheDir "\(directory)/delegated"
            </Location>

            <Location "/bound/">
                AuthName "\(basicRealm)"
            \(gssapi)
                GssapiConnectionBound On
            </Location>

            """
    }
}
