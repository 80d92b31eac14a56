import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
import Glibc
#endif

/// A throwaway MIT Kerberos realm for one test: its own KDC (`krb5kdc`) on a free loopback
/// port, its own database, krb5.conf and credential cache, all in one temporary directory, so
/// that Negotiate (SPNEGO) is tested against the real thing without touching the machine's
/// `/etc/krb5.conf` or `/var/lib/krb5kdc`. Works as root and as a normal user.
///
/// Every Kerberos tool the fixture runs (and every process a test hands `environment`) reads
/// the realm's `krb5.conf` through `KRB5_CONFIG`; the machine's own config is never read.
///
/// The krb5.conf asks for no DNS at all (no host name canonicalisation, no reverse lookups, no
/// KDC or realm lookups), so the service principal of `http://localhost:8080/` is exactly
/// `HTTP/localhost@REALM`, and of `http://127.0.0.1:8080/` exactly `HTTP/127.0.0.1@REALM`.
///
/// Users are made with `+requires_preauth` (as MIT's stock kdc.conf does), so a wrong password
/// shows in the KDC log as `PREAUTH_FAILED` rather than as a ticket the client cannot decrypt.
package final class KerberosRealm: Sendable {
    package static let kdcExecutable = "/usr/sbin/krb5kdc"
    package static let kdb5Util = "/usr/sbin/kdb5_util"
    package static let kadminLocal = "/usr/sbin/kadmin.local"
    package static let kinitExecutable = "/usr/bin/kinit"
    package static let klistExecutable = "/usr/bin/klist"
    package static let kdestroyExecutable = "/usr/bin/kdestroy"

    /// Whether the MIT KDC and client tools are installed (`apt-get install krb5-kdc
    /// krb5-admin-server krb5-user`).
    package static var isInstalled: Bool {
        [kdcExecutable, kdb5Util, kadminLocal, kinitExecutable, klistExecutable, kdestroyExecutable]
            .allSatisfy(FileManager.default.isExecutableFile(atPath:))
    }

    package let realm: String
    /// The KDC's port on 127.0.0.1 (TCP and UDP).
    package let port: Int
    /// The temporary directory: `krb5.conf`, `kdc.conf`, the database, `kdc.log`, `ccache`,
    /// `keytabs/`.
    package let directory: String
    private let kdc: NIOLockedValueBox<SpawnedProcess?>

    private init(realm: String, port: Int, directory: String, kdc: SpawnedProcess) {
        self.realm = realm
        self.port = port
        self.directory = directory
        self.kdc = NIOLockedValueBox(kdc)
    }

    /// `<directory>/krb5.conf`.
    package var configPath: String { self.directory + "/krb5.conf" }
    /// The realm's default credential cache (`KRB5CCNAME` is `FILE:` this).
    package var ccachePath: String { self.directory + "/ccache" }
    /// Where `KRB5_TRACE` writes in `tracingEnvironment`.
    package var tracePath: String { self.directory + "/trace.log" }

    /// What a process needs to be a client of this realm: `KRB5_CONFIG` (the realm's
    /// krb5.conf, never /etc/krb5.conf), `KRB5CCNAME` (`FILE:<ccachePath>`, where `kinit` puts
    /// tickets), `KRB5_KDC_PROFILE` (for the admin tools), and `KRB5_CLIENT_KTNAME` naming a
    /// file that does not exist, so that MIT's initiator cannot quietly get a ticket from a
    /// default client keytab (`/var/lib/krb5/user/<uid>/client.keytab`) instead of the cache.
    ///
    /// No replay cache setting: only acceptors (servers) keep one, and the Apache and Squid
    /// fixtures give theirs a directory of their own (`KRB5RCACHEDIR`).
    package var environment: [String: String] {
        [
            "KRB5_CONFIG": self.configPath,
            "KRB5CCNAME": "FILE:" + self.ccachePath,
            "KRB5_KDC_PROFILE": self.directory + "/kdc.conf",
            "KRB5_CLIENT_KTNAME": "FILE:" + self.directory + "/no-client.keytab",
        ]
    }

    /// `environment` plus `KRB5_TRACE` (libkrb5's step-by-step trace) to `tracePath`.
    package var tracingEnvironment: [String: String] {
        self.environment.merging(["KRB5_TRACE": self.tracePath]) { _, new in new }
    }

    /// The KDC's log so far: a line per AS_REQ (initial ticket) and TGS_REQ (service ticket).
    package var kdcLog: String { Self.read(self.directory + "/kdc.log") }

    /// libkrb5's trace of processes run with `tracingEnvironment`.
    package var traceLog: String { Self.read(self.tracePath) }

    /// `name@REALM` unless `name` already names a realm.
    package func principal(_ name: String) -> String {
        name.contains("@") ? name : "\(name)@\(self.realm)"
    }

    /// How many service tickets the KDC issued for `principal` (`HTTP/localhost`, with or
    /// without `@REALM`): its TGS_REQ lines that say ISSUE. A ticket a client already has in
    /// its cache is not asked for again, so this counts fetches, not uses.
    package func serviceTicketsIssued(for principal: String) -> Int {
        let suffix = " for " + self.principal(principal)
        return self.kdcLog.split(separator: "\n").filter { line in
            line.contains("TGS_REQ") && line.contains(": ISSUE:") && line.hasSuffix(suffix)
        }.count
    }

    /// How many initial tickets (TGTs, from a password) the KDC issued to `client` (`alice`,
    /// with or without `@REALM`): its AS_REQ lines that say ISSUE.
    package func initialTicketsIssued(for client: String) -> Int {
        let marker = ", \(self.principal(client)) for krbtgt/"
        return self.kdcLog.split(separator: "\n").filter { line in
            line.contains("AS_REQ") && line.contains(": ISSUE:") && line.contains(marker)
        }.count
    }

    // MARK: - Start and stop

    /// Makes the realm's files and database (`kdb5_util create -s`, a random master password),
    /// starts `krb5kdc -n` on a free loopback port and waits (at most 4 s) until it serves;
    /// a port taken meanwhile (TCP or UDP) is retried with another, twice. Takes about 0.1 s.
    ///
    /// - Throws: when the tools are missing or the KDC does not come up; the message carries
    ///   its log.
    package static func start(realm: String = "AUTHBROKER.TEST") async throws -> KerberosRealm {
        guard isInstalled else {
            throw TestSupportError("the MIT Kerberos KDC and tools are not installed: apt-get install -y krb5-kdc krb5-admin-server krb5-user")
        }
        guard realm.allSatisfy({ $0.isUppercase || $0.isNumber || $0 == "." || $0 == "-" }), !realm.isEmpty else {
            throw TestSupportError("a test realm is upper-case letters, digits, '.' and '-': \(realm)")
        }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        do {
            // Traversable, so that a daemon run as another test user can read krb5.conf; the
            // database, stash and caches stay 0600.
            guard chmod(directory, 0o711) == 0 else { throw TestSupportError("chmod \(directory): \(String(cString: strerror(errno)))") }
            try FileManager.default.createDirectory(atPath: directory + "/keytabs", withIntermediateDirectories: false)
            var lastError: (any Error)?
            for attempt in 0..<3 {
                let port = try freeLoopbackPort()
                try writeConfiguration(directory: directory, realm: realm, port: port)
                if attempt == 0 { try createDatabase(directory: directory, realm: realm) }
                do {
                    let kdc = try await launchKDC(directory: directory, port: port)
                    return KerberosRealm(realm: realm, port: port, directory: directory, kdc: kdc)
                } catch let error as TestSupportError where error.description.contains("Address already in use") {
                    lastError = error
                }
            }
            throw lastError ?? TestSupportError("krb5kdc could not bind a port")
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    /// Stops the KDC and removes the directory (and so every keytab and cache in it).
    package func stop() async {
        await self.stopKDC()
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    /// Stops the KDC alone (SIGTERM, SIGKILL after 5 s), for "the KDC is down" tests: a client
    /// then fails at once with "Cannot contact any KDC for realm" (nothing listens on the
    /// loopback port, TCP is refused and UDP gets port unreachable), while tickets already in
    /// a cache go on working against the servers, which need no KDC to accept them.
    package func stopKDC() async {
        let kdc = self.kdc.withLockedValue { kdc in
            defer { kdc = nil }
            return kdc
        }
        await kdc?.terminate()
    }

    /// Starts the KDC again on the same port after `stopKDC()`; nothing if it runs.
    package func startKDC() async throws {
        guard self.kdc.withLockedValue({ $0 == nil }) else { return }
        let kdc = try await Self.launchKDC(directory: self.directory, port: self.port)
        self.kdc.withLockedValue { $0 = kdc }
    }

    /// A test that threw before `stop()` still leaves no KDC behind.
    deinit {
        self.kdc.withLockedValue { $0?.kill() }
        try? FileManager.default.removeItem(atPath: self.directory)
    }

    // MARK: - Principals and tickets

    /// Adds the user principal `name` (`alice`, or `alice@REALM`) with `password`.
    package func addUser(_ name: String, password: String) throws {
        guard !password.contains("\n") else { throw TestSupportError("a Kerberos test password may not contain a newline") }
        let principal = self.principal(name)
        // The password on stdin (asked twice), so that no quoting of kadmin's -q parser matters.
        let result = try self.kadmin("addprinc +requires_preauth \(principal)", input: "\(password)\n\(password)\n")
        guard result.stdout.contains("Principal \"\(principal)\" created.") else {
            throw TestSupportError("kadmin.local addprinc \(principal) failed:\n\(result.stdout)\n\(result.stderr)")
        }
    }

    /// Adds the service principal `principal` (`HTTP/localhost`, or with `@REALM`) with a
    /// random key, and returns the path of a keytab holding its keys (made once; a second call
    /// for the same principal returns the same file, whose keys are still the current ones).
    /// The keytab is 0600 and the test's: a server that runs as another user needs a copy.
    package func addService(_ principal: String) throws -> String {
        let principal = self.principal(principal)
        let name = principal.map { $0.isLetter || $0.isNumber || $0 == "." || $0 == "-" ? $0 : "_" }
        let keytab = "\(self.directory)/keytabs/\(String(name)).keytab"
        if FileManager.default.fileExists(atPath: keytab) { return keytab }
        let added = try self.kadmin("addprinc -randkey \(principal)")
        guard added.stdout.contains("Principal \"\(principal)\" created.") else {
            throw TestSupportError("kadmin.local addprinc -randkey \(principal) failed:\n\(added.stdout)\n\(added.stderr)")
        }
        // -norandkey: the keys addprinc made, so that no earlier ticket for it goes stale.
        let exported = try self.kadmin("ktadd -k \(keytab) -norandkey \(principal)")
        guard exported.stdout.contains("added to keytab") else {
            throw TestSupportError("kadmin.local ktadd \(principal) failed:\n\(exported.stdout)\n\(exported.stderr)")
        }
        return keytab
    }

    /// `kinit` for `user` with `password` on stdin, into `ccache` (default: the realm's cache,
    /// `ccachePath`). `lifetime` is kinit's `-l` (`"5s"`, `"10m"`): the KDC grants down to one
    /// second, so `kinit(…, lifetime: "2s")` and a 3 s sleep give an expired TGT, for which the
    /// client's `gss_init_sec_context` fails with "Ticket expired" before anything is sent.
    ///
    /// - Throws: when kinit fails (wrong password, KDC down); the message carries its stderr.
    /// With `forwardable`, the TGT may be delegated to a server (`kinit -f`).
    package func kinit(user: String, password: String, lifetime: String? = nil, ccache: String? = nil, forwardable: Bool = false) throws {
        let arguments = (lifetime.map { ["-l", $0] } ?? []) + (forwardable ? ["-f"] : []) + [self.principal(user)]
        let result = try ExternalCommand.run(
            Self.kinitExecutable, arguments, environment: self.environment(ccache: ccache), input: password + "\n"
        )
        guard result.status == 0 else {
            throw TestSupportError("kinit \(self.principal(user)) failed (\(result.status)): \(result.stderr)")
        }
    }

    /// Empties the cache (default: the realm's); no error if there is none.
    package func kdestroy(ccache: String? = nil) throws {
        let result = try ExternalCommand.run(Self.kdestroyExecutable, [], environment: self.environment(ccache: ccache))
        guard result.status == 0 || result.stderr.contains("No credentials cache found") else {
            throw TestSupportError("kdestroy failed (\(result.status)): \(result.stderr)")
        }
    }

    /// `klist` of the cache (default: the realm's): the principal and every ticket with its
    /// times; klist's complaint when there is no cache.
    package func klist(ccache: String? = nil) throws -> String {
        let result = try ExternalCommand.run(Self.klistExecutable, [], environment: self.environment(ccache: ccache))
        return result.status == 0 ? result.stdout : result.stderr
    }

    /// Whether the cache (default: the realm's) holds a TGT that has not expired (`klist -s`).
    package func hasValidTicket(ccache: String? = nil) throws -> Bool {
        try ExternalCommand.run(Self.klistExecutable, ["-s"], environment: self.environment(ccache: ccache)).status == 0
    }

    private func environment(ccache: String?) -> [String: String] {
        var environment = self.environment
        if let ccache { environment["KRB5CCNAME"] = ccache.contains(":") ? ccache : "FILE:" + ccache }
        return environment
    }

    private func kadmin(_ query: String, input: String? = nil) throws -> ExternalCommand.Result {
        try Self.kadmin(directory: self.directory, query, input: input)
    }

    // MARK: - Files and the KDC

    private static func environment(directory: String) -> [String: String] {
        ["KRB5_CONFIG": directory + "/krb5.conf", "KRB5_KDC_PROFILE": directory + "/kdc.conf"]
    }

    private static func kadmin(directory: String, _ query: String, input: String? = nil) throws -> ExternalCommand.Result {
        // kadmin.local exits 0 even when the query fails: callers check what it printed.
        try ExternalCommand.run(kadminLocal, ["-q", query], environment: environment(directory: directory), input: input)
    }

    /// krb5.conf (for every client and server) and kdc.conf (for the KDC and the admin tools).
    private static func writeConfiguration(directory: String, realm: String, port: Int) throws {
        // udp_preference_limit = 1: TCP first, so a stopped KDC is noticed at once (refused).
        let krb5 = """
            [libdefaults]
                default_realm = \(realm)
                dns_canonicalize_hostname = false
                rdns = false
                dns_lookup_kdc = false
                dns_lookup_realm = false
                udp_preference_limit = 1

            [realms]
                \(realm) = {
                    kdc = 127.0.0.1:\(port)
                }

            [domain_realm]
                localhost = \(realm)
                127.0.0.1 = \(realm)

            """
        let kdc = """
            [kdcdefaults]
                kdc_listen = 127.0.0.1:\(port)
                kdc_tcp_listen = 127.0.0.1:\(port)

            [realms]
                \(realm) = {
                    database_name = \(directory)/principal
                    key_stash_file = \(directory)/stash
                    acl_file = \(directory)/kadm5.acl
                    max_life = 10h
                    max_renewable_life = 1d
                }

            [logging]
                kdc = FILE:\(directory)/kdc.log
                admin_server = FILE:\(directory)/kadmin.log
                default = FILE:\(directory)/krb5lib.log

            """
        try krb5.write(toFile: directory + "/krb5.conf", atomically: true, encoding: .utf8)
        try kdc.write(toFile: directory + "/kdc.conf", atomically: true, encoding: .utf8)
        guard chmod(directory + "/krb5.conf", 0o644) == 0 else {
            throw TestSupportError("chmod krb5.conf: \(String(cString: strerror(errno)))")
        }
        try "".write(toFile: directory + "/kadm5.acl", atomically: true, encoding: .utf8)
    }

    /// `kdb5_util create -s` with a random master password (stashed, so the KDC needs no prompt).
    private static func createDatabase(directory: String, realm: String) throws {
        let master = UUID().uuidString
        let result = try ExternalCommand.run(
            kdb5Util, ["create", "-s", "-r", realm, "-P", master], environment: environment(directory: directory)
        )
        guard result.status == 0 else {
            throw TestSupportError("kdb5_util create failed (\(result.status)): \(result.stdout)\n\(result.stderr)")
        }
    }

    /// `krb5kdc -n` (in the foreground), waiting until its log says it serves.
    private static func launchKDC(directory: String, port: Int) async throws -> SpawnedProcess {
        let log = directory + "/kdc.log"
        let before = read(log).count
        let process = try SpawnedProcess(
            executable: kdcExecutable, arguments: ["-n"], stderrPath: directory + "/kdc.stderr",
            environment: environment(directory: directory)
        )
        for _ in 0..<200 {
            let fresh = String(read(log).dropFirst(before))
            if let status = process.exitStatus {
                throw TestSupportError("krb5kdc \(status) before serving on 127.0.0.1:\(port)\n\(fresh)\n\(read(directory + "/kdc.stderr"))")
            }
            if fresh.contains("commencing operation") {
                return process
            }
            try await Task.sleep(for: .milliseconds(20))
        }
        await process.terminate()
        throw TestSupportError("krb5kdc did not serve on 127.0.0.1:\(port) within 4 s\n\(read(log))\n\(read(directory + "/kdc.stderr"))")
    }

    private static func read(_ path: String) -> String {
        (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
    }
}
