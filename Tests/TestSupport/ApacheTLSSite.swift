import Crypto
import Foundation

#if canImport(Glibc)
import Glibc
#endif

/// Debian's Apache httpd as a private corporate server over TLS: its certificate from a private
/// CA, a client certificate required (issued by another private CA), and behind them
/// - `/git/`: Basic (realm `git@corp`), Git's own `git-http-backend` (smart HTTP) serving
///   `repo.git`, whose `main` holds one commit with `README` = `hello from the corp repo\n`;
/// - `/simple/`: Digest (realm `index@corp`, MD5), a PEP 503 package index with one wheel,
///   `authbroker-demo` 1.0;
/// - `/apt/`: Basic (realm `apt@corp`), a flat apt repository (`deb [trusted=yes] BASE/apt ./`)
///   with one package, `authbroker-apt-demo` 1.0, built with `dpkg-deb` (when it is installed).
/// The access log names the user and the client certificate's CN of each request.
package final class ApacheTLSSite: Sendable {
    package static let gitRealm = "git@corp"
    package static let indexRealm = "index@corp"
    package static let packageName = "authbroker-demo"
    package static let wheelName = "authbroker_demo-1.0-py3-none-any.whl"
    package static let readme = "hello from the corp repo\n"
    package static let aptRealm = "apt@corp"
    package static let aptPackage = "authbroker-apt-demo"
    package static let debName = "authbroker-apt-demo_1.0_all.deb"
    /// The page `/simple/authbroker-demo/` serves.
    package static let projectPage = "<html><body><a href=\"\(wheelName)\">\(wheelName)</a></body></html>\n"
    static let gitHTTPBackend = "/usr/lib/git-core/git-http-backend"

    /// Whether Apache, mod_ssl, git and git-http-backend are installed.
    package static var isInstalled: Bool {
        ApacheAuthServer.isInstalled && FileManager.default.fileExists(atPath: ApacheAuthServer.modulesDirectory + "/mod_ssl.so")
            && FileManager.default.isExecutableFile(atPath: gitHTTPBackend) && FileManager.default.isExecutableFile(atPath: "/usr/bin/git")
    }

    package let port: Int
    package let directory: String
    private let process: SpawnedProcess

    private init(port: Int, directory: String, process: SpawnedProcess) {
        self.port = port
        self.directory = directory
        self.process = process
    }

    /// `%u %{SSL_CLIENT_S_DN_CN}x "%r" %>s` per request.
    package var accessLog: String { ApacheAuthServer.read(self.directory + "/access.log") }

    /// The access log once it holds every one of `lines`, or as it is after 5 s: Apache logs a
    /// request after answering it, so the last line may trail the client's exit.
    package func accessLog(holding lines: [String]) async -> String {
        var log = ""
        _ = await waitUntil(seconds: 5) {
            log = self.accessLog
            return lines.allSatisfy(log.contains)
        }
        return log
    }
    package var errorLog: String { ApacheAuthServer.read(self.directory + "/error.log") }

    package static func start(
        serverIdentity: TestIdentity, clientCA: TestIdentity, user: String, password: String
    ) async throws -> ApacheTLSSite {
        guard isInstalled else {
            throw TestSupportError("apache2 with mod_ssl, git and git-http-backend are needed: apt-get install -y apache2 apache2-utils git")
        }
        let (directory, port, process) = try await ApacheAuthServer.launchInNewDirectory { directory in
            try self.writeSite(in: directory, serverIdentity: serverIdentity, clientCA: clientCA, user: user, password: password)
        } configuration: { directory, port in
            configuration(directory: directory, port: port)
        }
        return ApacheTLSSite(port: port, directory: directory, process: process)
    }

    package func stop() async {
        await self.process.terminate()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    deinit {
        self.process.kill()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    private static func run(_ executable: String, _ arguments: [String]) throws {
        let result = try ExternalCommand.run(executable, arguments)
        guard result.status == 0 else {
            throw TestSupportError("\(executable) \(arguments.joined(separator: " ")) failed (\(result.status)): \(result.stderr)")
        }
    }

    private static func writeSite(
        in directory: String, serverIdentity: TestIdentity, clientCA: TestIdentity, user: String, password: String
    ) throws {
        let manager = FileManager.default
        for folder in ["tls", "run", "git", "htdocs/simple/\(packageName)"] {
            try manager.createDirectory(atPath: directory + "/" + folder, withIntermediateDirectories: true)
        }
        try serverIdentity.pem.write(toFile: directory + "/tls/server.pem", atomically: true, encoding: .utf8)
        try serverIdentity.privateKeyPEM.write(toFile: directory + "/tls/server.key", atomically: true, encoding: .utf8)
        try clientCA.pem.write(toFile: directory + "/tls/client-ca.pem", atomically: true, encoding: .utf8)

        try run(ApacheAuthServer.htpasswd, ["-bc", directory + "/htpasswd", user, password])
        let ha1 = Insecure.MD5.hash(data: Array("\(user):\(indexRealm):\(password)".utf8)).map { String(format: "%02x", $0) }.joined()
        try "\(user):\(indexRealm):\(ha1)\n".write(toFile: directory + "/htdigest", atomically: true, encoding: .utf8)

        // The repository: one commit on main, pushed into a bare repository.
        let work = directory + "/work"
        let bare = directory + "/git/repo.git"
        try run("/usr/bin/git", ["init", "-q", "-b", "main", work])
        try readme.write(toFile: work + "/README", atomically: true, encoding: .utf8)
        try run("/usr/bin/git", ["-C", work, "add", "README"])
        try run("/usr/bin/git", ["-C", work, "-c", "user.name=Test", "-c", "user.email=test@corp.test", "commit", "-q", "-m", "first"])
        try run("/usr/bin/git", ["init", "-q", "--bare", "-b", "main", bare])
        try run("/usr/bin/git", ["-C", work, "push", "-q", bare, "main"])
        try manager.removeItem(atPath: work)

        // The index: one project page, one wheel (a zip with the metadata pip reads).
        let project = directory + "/htdocs/simple/\(packageName)"
        try "<html><body><a href=\"\(packageName)/\">\(packageName)</a></body></html>\n"
            .write(toFile: directory + "/htdocs/simple/index.html", atomically: true, encoding: .utf8)
        try projectPage.write(toFile: project + "/index.html", atomically: true, encoding: .utf8)
        let wheel = """
            import sys, zipfile
            info = "authbroker_demo-1.0.dist-info/"
            with zipfile.ZipFile(sys.argv[1], "w") as z:
                z.writestr("authbroker_demo/__init__.py", "VALUE = 1\\n")
                z.writestr(info + "METADATA", "Metadata-Version: 2.1\\nName: authbroker-demo\\nVersion: 1.0\\n")
                z.writestr(info + "WHEEL", "Wheel-Version: 1.0\\nGenerator: authbroker-tests\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
                z.writestr(info + "RECORD", "authbroker_demo/__init__.py,,\\n" + info + "METADATA,,\\n" + info + "WHEEL,,\\n" + info + "RECORD,,\\n")
            """
        try run("/usr/bin/python3", ["-c", wheel, project + "/" + wheelName])
        if FileManager.default.isExecutableFile(atPath: "/usr/bin/dpkg-deb") {
            try writeAptRepository(in: directory + "/htdocs/apt")
        }
        try ApacheAuthServer.makeReadableByApache(directory)
    }

    /// A flat repository: the package, `Packages` naming it with its size and hashes, and a
    /// `Release` with the hash of `Packages` (apt wants one even from a `trusted=yes` source).
    private static func writeAptRepository(in repository: String) throws {
        let manager = FileManager.default
        let root = repository + "-build"
        try manager.createDirectory(atPath: root + "/DEBIAN", withIntermediateDirectories: true)
        try manager.createDirectory(atPath: root + "/usr/share/\(aptPackage)", withIntermediateDirectories: true)
        try manager.createDirectory(atPath: repository, withIntermediateDirectories: true)
        let control = """
            Package: \(aptPackage)
            Version: 1.0
            Architecture: all
            Maintainer: AuthBroker tests <tests@corp.test>
            Description: a package from the corp repository

            """
        try control.write(toFile: root + "/DEBIAN/control", atomically: true, encoding: .utf8)
        try "hello from the corp apt repository\n".write(toFile: root + "/usr/share/\(aptPackage)/hello", atomically: true, encoding: .utf8)
        try run("/usr/bin/dpkg-deb", ["--root-owner-group", "-Zgzip", "--build", root, repository + "/" + debName])
        try manager.removeItem(atPath: root)
        let deb = try Data(contentsOf: URL(fileURLWithPath: repository + "/" + debName))
        let packages = control.replacingOccurrences(of: "Description:", with: """
            Filename: ./\(debName)
            Size: \(deb.count)
            SHA256: \(hex(SHA256.hash(data: deb)))
            Description:
            """)
        try packages.write(toFile: repository + "/Packages", atomically: true, encoding: .utf8)
        let release = """
            Origin: corp
            Label: corp
            Date: Thu, 01 Jan 2026 00:00:00 UTC
            SHA256:
             \(hex(SHA256.hash(data: Data(packages.utf8)))) \(packages.utf8.count) Packages

            """
        try release.write(toFile: repository + "/Release", atomically: true, encoding: .utf8)
    }

    private static func hex(_ digest: some Sequence<UInt8>) -> String {
        digest.map { String(format: "%02x", $0) }.joined()
    }

    private static func configuration(directory: String, port: Int) -> String {
        let loads = ApacheAuthServer.loadModules([
            ("mpm_prefork_module", "mod_mpm_prefork.so"), ("unixd_module", "mod_unixd.so"),
            ("authz_core_module", "mod_authz_core.so"), ("authz_user_module", "mod_authz_user.so"),
            ("authn_core_module", "mod_authn_core.so"), ("authn_file_module", "mod_authn_file.so"),
            ("auth_basic_module", "mod_auth_basic.so"), ("auth_digest_module", "mod_auth_digest.so"),
            ("dir_module", "mod_dir.so"), ("alias_module", "mod_alias.so"), ("env_module", "mod_env.so"),
            ("cgi_module", "mod_cgi.so"), ("ssl_module", "mod_ssl.so"), ("log_config_module", "mod_log_config.so"),
            ("socache_shmcb_module", "mod_socache_shmcb.so"), ("mime_module", "mod_mime.so"),
        ])
        return """
            ServerRoot "\(directory)"
            ServerName 127.0.0.1
            Listen 127.0.0.1:\(port)
            PidFile "\(directory)/run/httpd.pid"
            DefaultRuntimeDir "\(directory)/run"
            ErrorLog "\(directory)/error.log"
            LogLevel warn
            StartServers 2
            MinSpareServers 1
            MaxSpareServers 4
            MaxRequestWorkers 16
            \(loads)
            \(ApacheAuthServer.identityLines)
            LogFormat "%u %{SSL_CLIENT_S_DN_CN}x \\"%r\\" %>s" corp
            CustomLog "\(directory)/access.log" corp

            SSLEngine on
            SSLCertificateFile "\(directory)/tls/server.pem"
            SSLCertificateKeyFile "\(directory)/tls/server.key"
            SSLCACertificateFile "\(directory)/tls/client-ca.pem"
            SSLVerifyClient require
            SSLVerifyDepth 2
            SSLSessionCache "shmcb:\(directory)/run/ssl_scache(512000)"

            DocumentRoot "\(directory)/htdocs"
            DirectoryIndex index.html
            # pip reads a project page only as text/html.
            TypesConfig /dev/null
            AddType text/html .html
            <Directory "\(directory)/htdocs">
                Require all granted
            </Directory>

            SetEnv GIT_PROJECT_ROOT "\(directory)/git"
            SetEnv GIT_HTTP_EXPORT_ALL 1
            # The repository belongs to the test's user, git-http-backend runs as Apache's.
            SetEnv GIT_CONFIG_COUNT 1
            SetEnv GIT_CONFIG_KEY_0 safe.directory
            SetEnv GIT_CONFIG_VALUE_0 *
            ScriptAlias /git/ \(gitHTTPBackend)/
            <Directory "/usr/lib/git-core">
                Require all granted
            </Directory>
            <Location "/git/">
                AuthType Basic
                AuthName "\(gitRealm)"
                AuthBasicProvider file
                AuthUserFile "\(directory)/htpasswd"
                Require valid-user
            </Location>

            <Location "/apt/">
                AuthType Basic
                AuthName "\(aptRealm)"
                AuthBasicProvider file
                AuthUserFile "\(directory)/htpasswd"
                Require valid-user
            </Location>

            <Location "/simple/">
                AuthType Digest
                AuthName "\(indexRealm)"
                AuthDigestProvider file
                AuthUserFile "\(directory)/htdigest"
                AuthDigestAlgorithm MD5
                AuthDigestQop auth
                AuthDigestDomain /simple/
                Require valid-user
            </Location>

            """
    }
}
