import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Debian's Squid (`squid-openssl`), run in the foreground for one test as an upstream proxy
/// that demands Basic (`basic_ncsa_auth`, an `htpasswd` file), Digest (`digest_file_auth`) or
/// Negotiate (`negotiate_kerberos_auth`, a keytab from a `KerberosRealm`) proxy
/// authentication: an interop check against a production proxy.
///
/// Served on 127.0.0.1 at a free port, from a temporary directory holding the config, the
/// password file, a hosts file sending every name in `hosts` to 127.0.0.1, and the logs.
package final class SquidProxy: Sendable {
    package enum Scheme: String, Sendable {
        case basic, digest
    }

    package static let executable = "/usr/sbin/squid"
    package static let basicHelper = "/usr/lib/squid/basic_ncsa_auth"
    package static let digestHelper = "/usr/lib/squid/digest_file_auth"
    package static let negotiateHelper = "/usr/lib/squid/negotiate_kerberos_auth"
    package static let realm = "squid@test"

    /// Whether Squid and its helpers are installed (`apt-get install squid-openssl apache2-utils`).
    package static var isInstalled: Bool {
        [executable, basicHelper, digestHelper, ApacheAuthServer.htpasswd].allSatisfy(FileManager.default.isExecutableFile(atPath:))
    }

    /// Whether Squid, its Kerberos helper and the MIT KDC are installed (`apt-get install
    /// squid-openssl krb5-kdc krb5-admin-server krb5-user`).
    package static var isNegotiateInstalled: Bool {
        FileManager.default.isExecutableFile(atPath: executable) && FileManager.default.isExecutableFile(atPath: negotiateHelper)
            && KerberosRealm.isInstalled
    }

    /// How clients prove themselves to the proxy.
    private enum Authentication {
        case password(Scheme, user: String, password: String)
        /// `principal@REALM`, its keys copied into the directory as `http.keytab`.
        case negotiate(principal: String, keytab: String)
    }

    package let port: Int
    package let directory: String
    private let process: SpawnedProcess

    private init(port: Int, directory: String, process: SpawnedProcess) {
        self.port = port
        self.directory = directory
        self.process = process
    }

    /// Squid's access log so far: one line per request, `TCP_DENIED/407` for each 407.
    package var accessLog: String { (try? String(contentsOfFile: self.directory + "/access.log", encoding: .utf8)) ?? "" }

    /// Lines of the access log that are 407s.
    package var proxyAuthenticationRequiredCount: Int {
        self.accessLog.split(separator: "\n").filter { $0.contains("/407 ") }.count
    }

    /// Writes the config and password file, starts `squid -N`, and waits (at most 20 s) until
    /// its port accepts connections; a port taken meanwhile is retried with another, twice.
    package static func start(scheme: Scheme, user: String, password: String, hosts: [String]) async throws -> SquidProxy {
        guard isInstalled else {
            throw TestSupportError("squid or its auth helpers are not installed: apt-get install -y squid-openssl apache2-utils")
        }
        return try await self.start(authentication: .password(scheme, user: user, password: password), hosts: hosts, environment: nil)
    }

    /// Squid demanding Negotiate: `negotiate_kerberos_auth` accepting `principal` (default
    /// `HTTP/localhost`: clients reach the proxy as `http://localhost:<port>`; give
    /// `HTTP/127.0.0.1` for a proxy reached by address, e.g. to count its tickets apart from an
    /// origin's on `localhost`) with a keytab the realm makes. A 407 carries a bare
    /// `Proxy-Authenticate: Negotiate`; the access log names the user as `alice@REALM`.
    ///
    /// Squid and its helpers get the realm's krb5.conf (`KRB5_CONFIG`); the helper's replay
    /// cache is in the directory (`-c`), so a replayed token is refused as Apache refuses it.
    package static func start(negotiate realm: KerberosRealm, principal: String = "HTTP/localhost", hosts: [String]) async throws -> SquidProxy {
        guard isNegotiateInstalled else {
            throw TestSupportError("squid, negotiate_kerberos_auth or the MIT KDC is not installed: apt-get install -y squid-openssl krb5-kdc krb5-admin-server krb5-user")
        }
        let keytab = try realm.addService(principal)
        // A cache in memory: the helper is an acceptor, and must not touch the test's client cache.
        let environment = ["KRB5_CONFIG": realm.configPath, "KRB5CCNAME": "MEMORY:squid"]
        return try await self.start(
            authentication: .negotiate(principal: realm.principal(principal), keytab: keytab), hosts: hosts, environment: environment
        )
    }

    private static func start(authentication: Authentication, hosts: [String], environment: [String: String]?) async throws -> SquidProxy {
        let directory = try DaemonProcess.makeTemporaryDirectory()
        do {
            try writeFiles(in: directory, authentication: authentication, hosts: hosts)
            var lastError: (any Error)?
            for _ in 0..<3 {
                let port = try freeLoopbackPort()
                do {
                    let process = try await launch(directory: directory, authentication: authentication, port: port, environment: environment)
                    return SquidProxy(port: port, directory: directory, process: process)
                } catch let error as TestSupportError where error.description.contains("Address already in use") {
                    lastError = error
                }
            }
            throw lastError ?? TestSupportError("squid could not bind a port")
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    package func stop() async {
        await self.process.terminate()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    deinit {
        self.process.kill()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    private static func launch(
        directory: String, authentication: Authentication, port: Int, environment: [String: String]?
    ) async throws -> SpawnedProcess {
        let config = directory + "/squid.conf"
        try configuration(directory: directory, authentication: authentication, port: port).write(toFile: config, atomically: true, encoding: .utf8)
        if getuid() == 0 { try chownToProxy(config) }
        let process = try SpawnedProcess(
            executable: executable, arguments: ["-N", "-f", config], stderrPath: directory + "/stderr.log", environment: environment
        )
        for _ in 0..<400 {
            if let status = process.exitStatus {
                throw TestSupportError("squid \(status) before listening on 127.0.0.1:\(port)\n\(logs(directory))")
            }
            if let connection = try? UnixSocketConnection(tcpPort: port, timeoutSeconds: 2) {
                connection.close()
                return process
            }
            try await Task.sleep(for: .milliseconds(50))
        }
        await process.terminate()
        throw TestSupportError("squid did not listen on 127.0.0.1:\(port) within 20 s\n\(logs(directory))")
    }

    private static func logs(_ directory: String) -> String {
        let read = { (name: String) in (try? String(contentsOfFile: directory + "/" + name, encoding: .utf8)) ?? "" }
        return "cache.log:\n\(read("cache.log"))\nstderr:\n\(read("stderr.log"))"
    }

    private static func writeFiles(in directory: String, authentication: Authentication, hosts: [String]) throws {
        var owned = [directory, directory + "/hosts"]
        switch authentication {
        case .password(let scheme, let user, let password):
            guard !user.contains(":"), !user.contains("\n"), !password.contains("\n") else {
                throw TestSupportError("a proxy user name may not contain ':' or a newline")
            }
            switch scheme {
            case .basic:
                // -m: Apache MD5 ($apr1$), which basic_ncsa_auth reads (it does not know bcrypt).
                let made = try ExternalCommand.run(ApacheAuthServer.htpasswd, ["-bcm", directory + "/passwd", user, password])
                guard made.status == 0 else { throw TestSupportError("htpasswd failed (\(made.status)): \(made.stderr)") }
            case .digest:
                // digest_file_auth without -c reads plain `user:password` lines.
                try "\(user):\(password)\n".write(toFile: directory + "/passwd", atomically: true, encoding: .utf8)
            }
            owned.append(directory + "/passwd")
        case .negotiate(_, let keytab):
            // A copy the helper (run as `proxy` when Squid starts as root) can read; the
            // replay cache directory it writes.
            try FileManager.default.copyItem(atPath: keytab, toPath: directory + "/http.keytab")
            try FileManager.default.createDirectory(atPath: directory + "/rcache", withIntermediateDirectories: false)
            owned += [directory + "/http.keytab", directory + "/rcache"]
        }
        try ("127.0.0.1 " + hosts.joined(separator: " ") + "\n").write(toFile: directory + "/hosts", atomically: true, encoding: .utf8)
        if getuid() == 0 {
            // Squid refuses to run as root: it switches to `proxy`, which must own its files.
            for path in owned { try chownToProxy(path) }
        }
    }

    private static func chownToProxy(_ path: String) throws {
        guard let account = getpwnam("proxy") else { throw TestSupportError("no `proxy` user for squid to run as") }
        guard chown(path, account.pointee.pw_uid, account.pointee.pw_gid) == 0 else {
            throw TestSupportError("chown \(path): \(String(cString: strerror(errno)))")
        }
    }

    private static func configuration(directory: String, authentication: Authentication, port: Int) -> String {
        let auth: String =
            switch authentication {
            case .password(.basic, _, _):
                """
                auth_param basic program \(basicHelper) \(directory)/passwd
                auth_param basic realm \(realm)
                auth_param basic children 2
                """
            case .password(.digest, _, _):
                // A nonce good for many requests, so preemptive reuse is what is measured.
                """
                auth_param digest program \(digestHelper) \(directory)/passwd
                auth_param digest realm \(realm)
                auth_param digest children 2
                auth_param digest nonce_max_count 100000
                auth_param digest nonce_max_duration 30 minutes
                """
            case .negotiate(let principal, _):
                // -s: accept exactly this principal; -c: the replay cache here, not /var/tmp.
                // The helper logs "krb5_pac_get_buffer: No such file or directory" to cache.log
                // for every user: MIT tickets carry no MS-PAC; harmless.
                """
                auth_param negotiate program \(negotiateHelper) -k \(directory)/http.keytab -s \(principal) -c \(directory)/rcache
                auth_param negotiate children 2
                auth_param negotiate keep_alive on
                """
            }
        let identity = getuid() == 0 ? "cache_effective_user proxy" : "# not root: squid keeps the test's user"
        return """
            http_port 127.0.0.1:\(port)
            \(identity)
            \(auth)
            acl authenticated proxy_auth REQUIRED
            acl localhost src 127.0.0.1/32
            http_access deny !localhost
            http_access allow authenticated
            http_access deny all
            cache deny all
            cache_mem 8 MB
            hosts_file \(directory)/hosts
            dns_nameservers 127.0.0.1
            pid_filename \(directory)/squid.pid
            access_log stdio:\(directory)/access.log
            cache_log \(directory)/cache.log
            cache_store_log none
            coredump_dir \(directory)
            shutdown_lifetime 1 seconds
            client_persistent_connections on
            server_persistent_connections on

            """
    }
}
