import AuthBrokerCore
import Foundation
import Testing
import TestSupport

/// Interception on the proxy port: https:// to a host the user holds something for ends at the
/// broker under a leaf from the user's local CA, and its requests get the broker's trust
/// decision and stored passwords; unmodified programs trust the leaf through `authbrokerctl run`.
@Suite("Interception", .serialized)
struct InterceptionTests {
    static let password = "Intercepted-Secret-5"
    static let ctl = DaemonProcess.binDirectory + "/authbrokerctl"

    static func post(_ daemon: DaemonProcess, _ path: String, _ body: [String: Any]) throws -> TestResponse {
        try UnixSocketConnection(path: daemon.socketPath).request(
            "POST", path, headers: [("Content-Type", "application/json")], body: jsonBody(body)
        )
    }

    static func counter(_ daemon: DaemonProcess, _ name: String) throws -> Int? {
        let status = try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/status")
        return (status.json["counters"] as? [String: Any])?[name] as? Int
    }

    /// An https:// origin behind a private CA, asking for Basic; the CA and the password are
    /// given to the broker only.
    struct PrivateOrigin {
        var origin: TestAuthOrigin
        var ca: TestIdentity
        var host: String
        var base: String { "https://\(self.host):\(self.origin.port)" }
        var resolve: String { "\"\(self.host):\(self.origin.port):127.0.0.1\"" }

        static func start(host: String) async throws -> PrivateOrigin {
            let ca = try TestPKI.makeCA(commonName: "Corp Private CA")
            let leaf = try TestPKI.makeLeaf(dnsNames: [host], issuer: ca)
            let origin = try await TestAuthOrigin.start(name: "corp", user: "alice", password: InterceptionTests.password, identity: leaf)
            return PrivateOrigin(origin: origin, ca: ca, host: host)
        }

        /// The CA as an anchor for the host, and alice's password for the origin.
        func giveToBroker(_ daemon: DaemonProcess) throws {
            #expect(try InterceptionTests.post(daemon, "/v1/anchors", ["pem": self.ca.pem, "hosts": [self.host]]).status == 201)
            let stored = try InterceptionTests.post(
                daemon, "/v1/passwords", ["url": self.base, "user": "alice", "password": InterceptionTests.password, "persistence": "session"]
            )
            #expect(stored.status == 201)
        }
    }

    @Test("curl, Python urllib and requests, unmodified, get a Basic-protected page behind a private CA: the broker holds the CA and the password")
    func unmodifiedProgramsThroughInterception() async throws {
        let corp = try await PrivateOrigin.start(host: "git.corp.test")
        defer { Task { await corp.origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\(corp.resolve)]\n") { daemon in
            try corp.giveToBroker(daemon)
            let curl = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "\(corp.base)/basic/curl"])
            #expect(curl.status == 0 && curl.stdout == "hello alice", "\(curl.stderr)")
            let urllib = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/python3", "-c", "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())", "\(corp.base)/basic/urllib"]
            )
            #expect(urllib.status == 0 && urllib.stdout == "hello alice", "\(urllib.stderr)")
            let requests = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/python3", "-c", "import sys, requests; r = requests.get(sys.argv[1]); r.raise_for_status(); sys.stdout.write(r.text)", "\(corp.base)/basic/requests"]
            )
            #expect(requests.status == 0 && requests.stdout == "hello alice", "\(requests.stderr)")
            // Several requests on one intercepted connection (curl reuses it).
            let twice = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "--fail", "\(corp.base)/basic/one", "\(corp.base)/basic/two"]
            )
            #expect(twice.stdout == "hello alicehello alice", "\(twice.stderr)")
            #expect(corp.origin.stats.successes == 5)
            #expect(try Self.counter(daemon, "connects_intercepted") == 4)
            #expect(try Self.counter(daemon, "tunnels_opened") == 0)
            // The leaf the programs saw came from the local CA.
            let issuer = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{certs}", "\(corp.base)/open/x"]
            )
            #expect(issuer.stdout.contains("AuthBroker local CA for"), "\(issuer.stdout.prefix(400))")
        }
    }

    /// Debian's Apache as a corporate server (`ApacheTLSSite`: a private CA, a client certificate
    /// required, Basic or Digest) at `host`, and a daemon holding only what reaching it takes:
    /// the server's CA as an anchor for the host, alice's client identity and her password.
    /// `body` gets the site, the daemon and the site's base URL.
    static func withCorpApache(host: String, _ body: (ApacheTLSSite, DaemonProcess, String) async throws -> Void) async throws {
        let serverCA = try TestPKI.makeCA(commonName: "Corp Server CA")
        let clientCA = try TestPKI.makeCA(commonName: "Corp Client CA")
        let clientLeaf = try TestPKI.makeLeaf(issuer: clientCA, commonName: "alice-laptop", clientAuthenticationOnly: true)
        let site = try await ApacheTLSSite.start(
            serverIdentity: try TestPKI.makeLeaf(dnsNames: [host], issuer: serverCA), clientCA: clientCA, user: "alice", password: Self.password
        )
        defer { Task { await site.stop() } }
        let base = "https://\(host):\(site.port)"
        try await withDaemon(config: "[upstream]\nresolve = [\"\(host):\(site.port):127.0.0.1\"]\n") { daemon in
            #expect(try Self.post(daemon, "/v1/anchors", ["pem": serverCA.pem, "hosts": [host]]).status == 201)
            let identity = try Self.post(
                daemon, "/v1/identities", ["name": "laptop", "cert_pem": clientLeaf.pem, "key_pem": clientLeaf.privateKeyPEM, "hosts": [host]]
            )
            #expect(identity.status == 201, "\(identity.json)")
            let stored = try Self.post(daemon, "/v1/passwords", ["url": base, "user": "alice", "password": Self.password, "persistence": "session"])
            #expect(stored.status == 201)
            try await body(site, daemon, base)
        }
    }

    /// The program at `path`, or nil after recording that `scripts/install-deps test` installs it.
    static func installed(_ path: String, package: String) -> String? {
        guard FileManager.default.isExecutableFile(atPath: path) else {
            Issue.record("\(path) is not installed (\(package); scripts/install-deps test installs it)")
            return nil
        }
        return path
    }

    @Test("git clone and pip download, unmodified, from Apache behind a private CA that wants a client certificate and Basic or Digest")
    func gitAndPipFromACorporateApache() async throws {
        try await Self.withCorpApache(host: "code.corp.test") { site, daemon, base in
            let clone = daemon.directory + "/clone"
            let git = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/env", "GIT_TERMINAL_PROMPT=0", "/usr/bin/git", "clone", "-q", "\(base)/git/repo.git", clone]
            )
            #expect(git.status == 0, "\(git.stderr)\n\(site.errorLog)")
            #expect((try? String(contentsOfFile: clone + "/README", encoding: .utf8)) == ApacheTLSSite.readme)
            let downloads = daemon.directory + "/downloads"
            let pip = try ProxyPortTests.runThroughBroker(
                daemon,
                [
                    "/usr/bin/python3", "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--disable-pip-version-check",
                    "--index-url", "\(base)/simple/", "-d", downloads, ApacheTLSSite.packageName,
                ]
            )
            #expect(pip.status == 0, "\(pip.stdout)\n\(pip.stderr)\n\(site.errorLog)")
            #expect(FileManager.default.fileExists(atPath: downloads + "/" + ApacheTLSSite.wheelName))
            // Apache saw alice (Basic for git, Digest for the index) with the broker's client certificate.
            let seen = [
                "alice alice-laptop \"GET /git/repo.git/info/refs?service=git-upload-pack HTTP/1.1\" 200",
                "alice alice-laptop \"GET /simple/\(ApacheTLSSite.packageName)/ HTTP/1.1\" 200",
                "alice alice-laptop \"GET /simple/\(ApacheTLSSite.packageName)/\(ApacheTLSSite.wheelName) HTTP/1.1\" 200",
            ]
            let log = await site.accessLog(holding: seen)
            for line in seen { #expect(log.contains(line), "\(log)") }
        }
    }

    @Test("wget, unmodified, trusts the local CA through the WGETRC the broker writes (keeping ~/.wgetrc, less its secrets, CRLF or not; one file per content): Basic and Digest behind a client certificate")
    func wgetFromACorporateApache() async throws {
        guard let wget = Self.installed("/usr/bin/wget", package: "wget") else { return }
        try await Self.withCorpApache(host: "files.corp.test") { site, daemon, base in
            // Basic first: a password once answered with Digest is never sent as Basic on that origin.
            let urls = ["\(base)/git/repo.git/HEAD", "\(base)/simple/\(ApacheTLSSite.packageName)/"]
            // The user's own startup file (CRLF line ends, which wget accepts): its settings
            // still apply, its password and Authorization header are not copied.
            let home = daemon.directory + "/home"
            let saved = daemon.directory + "/saved"
            try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
            try "output_document = \(saved)\r\nhttp_password = Not-Copied-7\r\nheader = Authorization: Bearer Not-Copied-8\r\n"
                .write(toFile: home + "/.wgetrc", atomically: true, encoding: .utf8)
            // The test runner's own WGETRC would win over HOME's .wgetrc: left out.
            let asAlice = ["-u", "WGETRC", "HOME=\(home)"]
            let ctl = [Self.ctl, "run", "--socket", daemon.socketPath, "--"]
            let fetched = try ExternalCommand.run("/usr/bin/env", asAlice + ctl + [wget, "-q"] + urls)
            #expect(fetched.status == 0, "\(fetched.stderr)\n\(site.errorLog)")
            #expect((try? String(contentsOfFile: saved, encoding: .utf8)) == "ref: refs/heads/main\n" + ApacheTLSSite.projectPage)
            let seen = [
                "alice alice-laptop \"GET /simple/\(ApacheTLSSite.packageName)/ HTTP/1.1\" 200",
                "alice alice-laptop \"GET /git/repo.git/HEAD HTTP/1.1\" 200",
            ]
            let log = await site.accessLog(holding: seen)
            for line in seen { #expect(log.contains(line), "\(log)") }
            // The file: private, named after its content, the user's lines less the secrets, then the bundle.
            let wgetrc = try Self.wgetrc(daemon, environment: asAlice)
            let show = try ExternalCommand.run(Self.ctl, ["ca", "show", "--json", "--socket", daemon.socketPath])
            let record = try #require(try JSONSerialization.jsonObject(with: Data(show.stdout.utf8)) as? [String: Any])
            let bundle = try #require(record["bundle_file"] as? String)
            let content = try String(contentsOfFile: wgetrc, encoding: .utf8)
            #expect(wgetrc == AtomicFile.directory(of: bundle) + "/" + WgetStartupFile.fileName(content: content))
            #expect(content.hasPrefix("output_document = \(saved)\n") && content.hasSuffix("ca_certificate = \(bundle)\n"), "\(content)")
            #expect(!content.contains("Not-Copied-7") && !content.contains("Not-Copied-8") && !content.contains("\r"), "\(content)")
            let attributes = try FileManager.default.attributesOfItem(atPath: wgetrc)
            #expect((attributes[.posixPermissions] as? Int) == 0o600)
            // Another caller's settings get another file; the first stays as it was, and is
            // handed out again for the same settings (also from a shell that already names it).
            let project = daemon.directory + "/project.wgetrc"
            try "tries = 2\n".write(toFile: project, atomically: true, encoding: .utf8)
            let other = try Self.wgetrc(daemon, environment: ["HOME=\(home)", "WGETRC=\(project)"])
            #expect(other != wgetrc && AtomicFile.directory(of: other) == AtomicFile.directory(of: wgetrc))
            #expect(try String(contentsOfFile: other, encoding: .utf8).hasPrefix("tries = 2\n"))
            #expect(try String(contentsOfFile: wgetrc, encoding: .utf8) == content)
            #expect(try Self.wgetrc(daemon, environment: asAlice) == wgetrc)
            #expect(try Self.wgetrc(daemon, environment: ["HOME=\(home)", "WGETRC=\(other)"]) == wgetrc)
            // Without it, wget does not trust the intercepted host (it reads no CA variable).
            let without = try ExternalCommand.run("/usr/bin/env", asAlice + ctl + ["/usr/bin/env", "-u", "WGETRC", wget, "-q", "-O", "/dev/null", urls[0]])
            #expect(without.status == 5, "\(without.status) \(without.stderr)")
        }
    }

    /// The wgetrc `authbrokerctl env` names when run with `environment` (`env`'s arguments:
    /// `-u NAME`, `NAME=value`).
    static func wgetrc(_ daemon: DaemonProcess, environment: [String]) throws -> String {
        let env = try ExternalCommand.run("/usr/bin/env", environment + [Self.ctl, "env", "--socket", daemon.socketPath])
        #expect(env.status == 0, "\(env.stderr)")
        let line = try #require(env.stdout.split(separator: "\n").first { $0.hasPrefix("export WGETRC=") }, "\(env.stdout)")
        return String(line.dropFirst("export WGETRC='".count).dropLast())
    }

    @Test("env reads no WGETRC that is not a regular file (stdin, a FIFO, a directory) nor one too large, and says why")
    func envRefusesWgetrcThatIsNoRegularFile() async throws {
        try await withDaemon { daemon in
            let fifo = daemon.directory + "/fifo"
            #expect(mkfifo(fifo, 0o600) == 0)
            let large = daemon.directory + "/large.wgetrc"
            try String(repeating: "# padding\n", count: 110_000).write(toFile: large, atomically: true, encoding: .utf8)
            let cases: [(wgetrc: String, says: String)] = [
                ("-", "cannot read -"),
                (fifo, "\(fifo) is a FIFO (named pipe), not a wget startup file; it was not read"),
                (daemon.directory, "\(daemon.directory) is a directory, not a wget startup file; it was not read"),
                (large, "\(large) is larger than 1024 KiB; is it really a wget startup file?"),
            ]
            for (wgetrc, says) in cases {
                // Standard input holds a startup file: `-` must not read it (a terminal there would block).
                let env = try ExternalCommand.run(Self.ctl, ["env", "--socket", daemon.socketPath], environment: ["WGETRC": wgetrc], input: "password = hunter2\n")
                #expect(env.status == 0, "\(wgetrc): \(env.stderr)")
                #expect(!env.stdout.contains("WGETRC"), "\(wgetrc): \(env.stdout)")
                #expect(env.stderr.contains("warning: WGETRC not set") && env.stderr.contains(says), "\(wgetrc): \(env.stderr)")
                #expect(env.stderr.contains("Set WGETRC to a readable wget startup file"), "\(wgetrc): \(env.stderr)")
            }
        }
    }

    @Test("env removes its own wgetrc files nobody was handed for over 30 days; newer ones, and others' files, stay")
    func envRemovesStaleWgetrcFiles() async throws {
        try await withDaemon { daemon in
            let first = try Self.wgetrc(daemon, environment: ["-u", "WGETRC", "HOME=\(daemon.directory)"])
            let directory = AtomicFile.directory(of: first)
            let old = Date(timeIntervalSinceNow: -31 * 86400)
            let files = ["wgetrc-0badc0de": old, "wgetrc": old, "wgetrc-00c0ffee": Date(timeIntervalSinceNow: -29 * 86400), "wgetrc-mine": old]
            for (name, modified) in files {
                try "tries = 1\n".write(toFile: directory + "/" + name, atomically: true, encoding: .utf8)
                try FileManager.default.setAttributes([.modificationDate: modified], ofItemAtPath: directory + "/" + name)
            }
            try FileManager.default.setAttributes([.modificationDate: old], ofItemAtPath: first)
            #expect(try Self.wgetrc(daemon, environment: ["-u", "WGETRC", "HOME=\(daemon.directory)"]) == first)
            for (name, kept) in [("wgetrc-0badc0de", false), ("wgetrc", false), ("wgetrc-00c0ffee", true), ("wgetrc-mine", true)] {
                #expect(FileManager.default.fileExists(atPath: directory + "/" + name) == kept, "\(name)")
            }
            // The file handed out was touched, so it is not swept while in use.
            let touched = try #require(try FileManager.default.attributesOfItem(atPath: first)[.modificationDate] as? Date)
            #expect(touched.timeIntervalSinceNow > -3600)
        }
    }

    /// A Go program using only net/http's defaults: the proxy from HTTPS_PROXY, the anchors
    /// from SSL_CERT_FILE. Prints each URL's body; exits 1 on an error, 2 on a status not 200.
    static let goFetch = """
        package main

        import (
        \t"fmt"
        \t"io"
        \t"net/http"
        \t"os"
        )

        func main() {
        \tfor _, url := range os.Args[1:] {
        \t\tresponse, err := http.Get(url)
        \t\tif err != nil {
        \t\t\tfmt.Fprintln(os.Stderr, err)
        \t\t\tos.Exit(1)
        \t\t}
        \t\tbody, err := io.ReadAll(response.Body)
        \t\tresponse.Body.Close()
        \t\tif err != nil || response.StatusCode != 200 {
        \t\t\tfmt.Fprintln(os.Stderr, url, response.Status, err)
        \t\t\tos.Exit(2)
        \t\t}
        \t\tos.Stdout.Write(body)
        \t}
        }

        """

    @Test("a Go program (net/http, standard library only) gets Basic- and Digest-protected pages behind a client certificate through the broker")
    func goFromACorporateApache() async throws {
        guard let go = Self.installed("/usr/bin/go", package: "golang-go") else { return }
        try await Self.withCorpApache(host: "go.corp.test") { site, daemon, base in
            // Built in private directories, without modules or the network.
            let work = daemon.directory + "/go"
            try FileManager.default.createDirectory(atPath: work, withIntermediateDirectories: true)
            try Self.goFetch.write(toFile: work + "/main.go", atomically: true, encoding: .utf8)
            let build = try ExternalCommand.run(
                go, ["build", "-o", work + "/fetch", work + "/main.go"],
                environment: ["GOCACHE": work + "/cache", "GOPATH": work + "/path", "GO111MODULE": "off", "GOFLAGS": "", "GOENV": "off", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"]
            )
            try #require(build.status == 0, "go build: \(build.stderr)")
            // Basic first: a password once answered with Digest is never sent as Basic on that origin.
            let urls = ["\(base)/git/repo.git/HEAD", "\(base)/simple/\(ApacheTLSSite.packageName)/"]
            let fetched = try ProxyPortTests.runThroughBroker(daemon, [work + "/fetch"] + urls)
            #expect(fetched.status == 0, "\(fetched.stderr)\n\(site.errorLog)")
            #expect(fetched.stdout == "ref: refs/heads/main\n" + ApacheTLSSite.projectPage)
            let seen = [
                "alice alice-laptop \"GET /simple/\(ApacheTLSSite.packageName)/ HTTP/1.1\" 200",
                "alice alice-laptop \"GET /git/repo.git/HEAD HTTP/1.1\" 200",
            ]
            let log = await site.accessLog(holding: seen)
            for line in seen { #expect(log.contains(line), "\(log)") }
            #expect((try Self.counter(daemon, "connects_intercepted") ?? 0) >= 1)
        }
    }

    @Test("apt-get update and download, given the CA bundle with -o Acquire::https::CAInfo, from a flat repository behind a client certificate and Basic")
    func aptFromACorporateApache() async throws {
        guard Self.installed("/usr/bin/apt-get", package: "apt") != nil, Self.installed("/usr/bin/dpkg-deb", package: "dpkg") != nil else { return }
        try await Self.withCorpApache(host: "apt.corp.test") { site, daemon, base in
            // apt in private directories: its own configuration (no apt.conf.d hooks), lists,
            // cache and no lock; the system's apt state is never touched.
            let apt = daemon.directory + "/apt"
            for folder in ["etc/apt.conf.d", "etc/sources.list.d", "etc/preferences.d", "state/lists/partial", "cache/archives/partial", "downloads"] {
                try FileManager.default.createDirectory(atPath: apt + "/" + folder, withIntermediateDirectories: true)
            }
            try "deb [trusted=yes] \(base)/apt ./\n".write(toFile: apt + "/etc/sources.list", atomically: true, encoding: .utf8)
            // As root, apt runs its methods as _apt, another uid, whose connections the proxy
            // port closes: here they stay root (a user's apt never changes uid).
            let config = """
                Dir::Etc "\(apt)/etc";
                Dir::State "\(apt)/state";
                Dir::Cache "\(apt)/cache";
                Debug::NoLocking "true";
                APT::Sandbox::User "root";

                """
            try config.write(toFile: apt + "/apt.conf", atomically: true, encoding: .utf8)
            // As the README says: the proxy from https_proxy, the bundle given with -o.
            let script = """
                cd "$0" && apt-get -q -o Acquire::https::CAInfo="$SSL_CERT_FILE" update \
                && exec apt-get -q -o Acquire::https::CAInfo="$SSL_CERT_FILE" download "$1"
                """
            let result = try ExternalCommand.run(
                Self.ctl, ["run", "--socket", daemon.socketPath, "--", "/bin/sh", "-c", script, apt + "/downloads", ApacheTLSSite.aptPackage],
                environment: ["APT_CONFIG": apt + "/apt.conf"]
            )
            #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)\n\(site.errorLog)")
            let deb = apt + "/downloads/" + ApacheTLSSite.debName
            let served = try? Data(contentsOf: URL(fileURLWithPath: site.directory + "/htdocs/apt/" + ApacheTLSSite.debName))
            #expect(served != nil && (try? Data(contentsOf: URL(fileURLWithPath: deb))) == served)
            // Apache saw alice, with the broker's client certificate, fetch the index and the package.
            let files = ["Packages", ApacheTLSSite.debName]
            func seen(_ file: String, in log: String) -> Bool {
                log.split(separator: "\n").contains {
                    $0.hasPrefix("alice alice-laptop \"GET /apt/") && $0.contains("/\(file) HTTP/1.1\"") && $0.hasSuffix(" 200")
                }
            }
            // Apache logs a request after answering it: the last line may trail apt's exit.
            _ = await waitUntil(seconds: 5) { files.allSatisfy { seen($0, in: site.accessLog) } }
            let log = site.accessLog
            for file in files { #expect(seen(file, in: log), "\(file): \(log)") }
        }
    }

    @Test("env names the CA bundle (system anchors plus the local CA) and the CA alone for Node")
    func envNamesTheCABundle() async throws {
        try await withDaemon { daemon in
            let env = try ExternalCommand.run(Self.ctl, ["env", "--socket", daemon.socketPath])
            #expect(env.status == 0, "\(env.stderr)")
            let show = try ExternalCommand.run(Self.ctl, ["ca", "show", "--json", "--socket", daemon.socketPath])
            let record = try #require(try JSONSerialization.jsonObject(with: Data(show.stdout.utf8)) as? [String: Any])
            let bundle = try #require(record["bundle_file"] as? String)
            let certificate = try #require(record["certificate_file"] as? String)
            for name in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT"] {
                #expect(env.stdout.contains("export \(name)='\(bundle)'"), "\(name)")
            }
            #expect(env.stdout.contains("export NODE_EXTRA_CA_CERTS='\(certificate)'"))
            let bundleText = try String(contentsOfFile: bundle, encoding: .utf8)
            let pem = try #require(record["pem"] as? String)
            #expect(bundleText.hasSuffix(pem + "\n"))
            // The system anchors come first, whole.
            let system = try String(contentsOfFile: "/etc/ssl/certs/ca-certificates.crt", encoding: .utf8)
            #expect(bundleText.hasPrefix(system))
            #expect(try String(contentsOfFile: certificate, encoding: .utf8) == pem)
        }
    }

    @Test("a host with nothing held is tunnelled blind; [proxy] intercept names more hosts, [proxy] tunnel wins over all")
    func interceptAndTunnelRules() async throws {
        let corp = try await PrivateOrigin.start(host: "plain.corp.test")
        defer { Task { await corp.origin.stop() } }
        let directory = try DaemonProcess.makeTemporaryDirectory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let caFile = directory + "/corp-ca.pem"
        try corp.ca.pem.write(toFile: caFile, atomically: true, encoding: .utf8)
        // Nothing held, no rule: the program talks TLS with the origin itself (its own CA file works).
        try await withDaemon(config: "[upstream]\nresolve = [\(corp.resolve)]\n") { daemon in
            let curl = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "--cacert", caFile, "\(corp.base)/open/x"])
            #expect(curl.status == 0, "\(curl.stderr)")
            #expect(try Self.counter(daemon, "tunnels_opened") == 1)
        }
        // intercept = "all" with the host in tunnel: still the origin's own certificate.
        let rules = "[upstream]\nresolve = [\(corp.resolve)]\n[proxy]\nlisten = [\"127.0.0.1:0\"]\nintercept = \"all\"\ntunnel = [\"*.corp.test\"]\n"
        try await withDaemon(config: rules) { daemon in
            try corp.giveToBroker(daemon)
            let curl = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--cacert", caFile, "-o", "/dev/null", "-w", "%{http_code}", "\(corp.base)/basic/x"])
            // The broker did not see it, so the 401 reached curl unanswered.
            #expect(curl.stdout == "401", "\(curl.stderr)")
            #expect(try Self.counter(daemon, "connects_intercepted") == 0)
        }
        // A host only [proxy] intercept names: intercepted, so the broker's trust applies, and
        // without the anchor the broker refuses the origin's certificate.
        let named = "[upstream]\nresolve = [\(corp.resolve)]\n[proxy]\nlisten = [\"127.0.0.1:0\"]\nintercept = [\"plain.corp.test\"]\n"
        try await withDaemon(config: named) { daemon in
            let curl = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "-D", "-", "-o", "/dev/null", "\(corp.base)/open/x"]
            )
            // -D shows the CONNECT's 200, then the response inside.
            #expect(curl.stdout.hasPrefix("HTTP/1.1 200 Connection established"), "\(curl.stdout) \(curl.stderr)")
            #expect(curl.stdout.contains("\r\nHTTP/1.1 502"), "\(curl.stdout) \(curl.stderr)")
            #expect(curl.stdout.lowercased().contains("authbroker-error: untrusted_server"), "\(curl.stdout)")
            #expect(try Self.counter(daemon, "connects_intercepted") == 1)
        }
    }

    @Test("a program that does not trust the local CA fails its handshake; the daemon's log says what to do")
    func programWithoutTheBundle() async throws {
        let corp = try await PrivateOrigin.start(host: "strict.corp.test")
        defer { Task { await corp.origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\(corp.resolve)]\n") { daemon in
            try corp.giveToBroker(daemon)
            let curl = try ExternalCommand.run(
                "/usr/bin/curl", ["-sS", "--noproxy", "", "-x", "http://127.0.0.1:\(try daemon.proxyPort())", "\(corp.base)/basic/x"]
            )
            #expect(curl.status == 60, "\(curl.status) \(curl.stderr)")
            for _ in 0..<100 where !daemon.log.contains("does not trust the broker's local CA") {
                try await Task.sleep(for: .milliseconds(50))
            }
            #expect(daemon.log.contains("does not trust the broker's local CA"))
            #expect(corp.origin.stats.successes == 0)
            // The daemon carries on.
            let again = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "\(corp.base)/basic/y"])
            #expect(again.stdout == "hello alice", "\(again.stderr)")
        }
    }

    /// A TLS client over the proxy port by hand: CONNECT with the ClientHello in the same write,
    /// then `request`; prints what came back.
    static let rawClient = """
        import socket, ssl, sys
        port, host, hport, bundle, request = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ssl.create_default_context(cafile=bundle).wrap_bio(incoming, outgoing, server_hostname=host)
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            pass
        s.sendall(("CONNECT %s:%s HTTP/1.1\\r\\nHost: %s:%s\\r\\n\\r\\n" % (host, hport, host, hport)).encode() + outgoing.read())
        buffered = b""
        while b"\\r\\n\\r\\n" not in buffered:
            buffered += s.recv(4096)
        head, rest = buffered.split(b"\\r\\n\\r\\n", 1)
        assert head.startswith(b"HTTP/1.1 200"), head
        incoming.write(rest)
        def pump():
            out = outgoing.read()
            if out:
                s.sendall(out)
            data = s.recv(65536)
            if not data:
                raise SystemExit("the broker closed the connection during the TLS handshake")
            incoming.write(data)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pump()
        tls.write(request.encode())
        s.sendall(outgoing.read())
        response = b""
        while True:
            try:
                chunk = tls.read(65536)
                if not chunk:
                    break
                response += chunk
            except ssl.SSLWantReadError:
                out = outgoing.read()
                if out:
                    s.sendall(out)
                data = s.recv(65536)
                if not data:
                    break
                incoming.write(data)
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                break
        sys.stdout.write(response.decode("latin-1"))
        """

    @Test(
        "inside an intercepted connection, requests are for the CONNECT's origin only; a ClientHello sent with the CONNECT is kept",
        arguments: [
            ("GET /open/inside HTTP/1.1\r\nHost: H\r\nConnection: close\r\n\r\n", "HTTP/1.1 200", "received 0 bytes"),
            ("GET https://H:P/open/absolute HTTP/1.1\r\nHost: H\r\nConnection: close\r\n\r\n", "HTTP/1.1 200", "received 0 bytes"),
            ("GET https://elsewhere.test/ HTTP/1.1\r\nHost: elsewhere.test\r\nConnection: close\r\n\r\n", "HTTP/1.1 400", "invalid_host"),
            ("CONNECT elsewhere.test:443 HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n", "HTTP/1.1 400", "invalid_host"),
            // Not the control API: origin-form is the origin's path, and the origin answers it.
            ("GET /v1/status HTTP/1.1\r\nHost: H\r\nConnection: close\r\n\r\n", "HTTP/1.1 404", "no route /v1/status"),
        ]
    )
    func requestsInsideAreForTheOrigin(request: String, statusLine: String, body: String) async throws {
        let corp = try await PrivateOrigin.start(host: "raw.corp.test")
        defer { Task { await corp.origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\(corp.resolve)]\n") { daemon in
            try corp.giveToBroker(daemon)
            let show = try ExternalCommand.run(Self.ctl, ["ca", "show", "--json", "--socket", daemon.socketPath])
            let record = try #require(try JSONSerialization.jsonObject(with: Data(show.stdout.utf8)) as? [String: Any])
            let bundle = try #require(record["bundle_file"] as? String)
            let text = request.replacingOccurrences(of: "H:P", with: "\(corp.host):\(corp.origin.port)")
                .replacingOccurrences(of: "Host: H", with: "Host: \(corp.host)")
            let result = try ExternalCommand.run(
                "/usr/bin/python3", ["-c", Self.rawClient, String(try daemon.proxyPort()), corp.host, String(corp.origin.port), bundle, text]
            )
            #expect(result.status == 0, "\(result.stderr)\n\(daemon.log)")
            #expect(result.stdout.hasPrefix(statusLine), "\(result.stdout.prefix(300))")
            #expect(result.stdout.contains(body), "\(result.stdout.prefix(600))")
            #expect(!result.stdout.contains("\"pid\""))
        }
    }

    @Test("bad input on an intercepted CONNECT: garbage instead of TLS, a client leaving mid-handshake; closed, nothing left open, the daemon unharmed")
    func badInputOnAnInterceptedConnect() async throws {
        let corp = try await PrivateOrigin.start(host: "hostile.corp.test")
        defer { Task { await corp.origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\(corp.resolve)]\n") { daemon in
            try corp.giveToBroker(daemon)
            let proxyPort = try daemon.proxyPort()
            // The CA exists before the baseline is taken (it is made on first need).
            #expect(try UnixSocketConnection(path: daemon.socketPath).request("GET", "/v1/ca").status == 200)
            let warm = try UnixSocketConnection(tcpPort: proxyPort, timeoutSeconds: 10)
            try warm.send("CONNECT \(corp.host):\(corp.origin.port) HTTP/1.1\r\nHost: x\r\n\r\nnot TLS at all\r\n")
            #expect(warm.peerClosedWithin(milliseconds: 5000))
            let baseline = await daemon.settledFileDescriptorCount()
            let head = "CONNECT \(corp.host):\(corp.origin.port) HTTP/1.1\r\nHost: \(corp.host)\r\n\r\n"
            for garbage in ["GET / HTTP/1.1\r\nHost: x\r\n\r\n", "\u{16}\u{3}\u{1}\u{0}\u{5}hello", String(repeating: "\u{0}", count: 4096)] {
                let client = try UnixSocketConnection(tcpPort: proxyPort, timeoutSeconds: 10)
                try client.send(head)
                #expect(try client.readLine().hasPrefix("HTTP/1.1 200"))
                while try client.readLine() != "" {}
                try client.send(garbage)
                #expect(client.peerClosedWithin(milliseconds: 5000), "\(garbage.prefix(20))")
            }
            for _ in 0..<5 {
                let client = try UnixSocketConnection(tcpPort: proxyPort, timeoutSeconds: 10)
                try client.send(head)
                _ = try client.readLine()
                try client.send("\u{16}\u{3}\u{1}\u{2}\u{0}half a hello")
                client.close()
            }
            #expect(await daemon.waitForFileDescriptors(atMost: baseline) <= baseline)
            #expect(corp.origin.stats.successes == 0)
            let after = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "\(corp.base)/basic/z"])
            #expect(after.stdout == "hello alice", "\(after.stderr)")
        }
    }

    @Test("an intercepted connection that idles, or trickles a handshake and stops, is closed by the idle and head timeouts")
    func interceptedConnectionsTimeOut() async throws {
        let config = """
            [limits]
            client_idle_timeout_ms = 400
            request_head_timeout_ms = 400
            [proxy]
            listen = ["127.0.0.1:0"]
            intercept = ["idle.corp.test"]

            """
        try await withDaemon(config: config) { daemon in
            let proxyPort = try daemon.proxyPort()
            let head = "CONNECT idle.corp.test:443 HTTP/1.1\r\nHost: idle.corp.test:443\r\n\r\n"
            for (what, after) in [("nothing after the 200", ""), ("half a TLS hello", "\u{16}\u{3}\u{1}\u{2}\u{0}half a hello")] {
                let client = try UnixSocketConnection(tcpPort: proxyPort, timeoutSeconds: 10)
                try client.send(head)
                #expect(try client.readLine().hasPrefix("HTTP/1.1 200"))
                while try client.readLine() != "" {}
                if !after.isEmpty { try client.send(after) }
                #expect(client.peerClosedWithin(milliseconds: 4000), "\(what): the connection was still open")
            }
        }
    }

    @Test("an intercepted host whose server does not speak TLS: the program gets the broker's error inside its TLS")
    func interceptedHostWithoutTLS() async throws {
        let plain = try await TestAuthOrigin.start(name: "plain", user: "alice", password: Self.password)
        defer { Task { await plain.stop() } }
        let config = "[upstream]\nresolve = [\"cleartext.corp.test:\(plain.port):127.0.0.1\"]\n[proxy]\nlisten = [\"127.0.0.1:0\"]\nintercept = [\"cleartext.corp.test\"]\n"
        try await withDaemon(config: config) { daemon in
            let curl = try ProxyPortTests.runThroughBroker(
                daemon, ["/usr/bin/curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %header{authbroker-error}", "https://cleartext.corp.test:\(plain.port)/open/x"]
            )
            #expect(curl.stdout == "502 tls_handshake_failed", "\(curl.stdout) \(curl.stderr)")
        }
    }

    @Test("ca show, export and rotate: a rotated CA's bundle and leaves replace the old ones; the key is never on disk in the clear")
    func caCommands() async throws {
        let corp = try await PrivateOrigin.start(host: "rotate.corp.test")
        defer { Task { await corp.origin.stop() } }
        try await withDaemon(config: "[upstream]\nresolve = [\(corp.resolve)]\n") { daemon in
            try corp.giveToBroker(daemon)
            let show = try ExternalCommand.run(Self.ctl, ["ca", "show", "--socket", daemon.socketPath])
            #expect(show.status == 0, "\(show.stderr)")
            #expect(show.stdout.contains("AuthBroker local CA for"))
            #expect(show.stdout.contains("CA bundle (system anchors and this CA):"))
            let exported = daemon.directory + "/exported-ca.pem"
            let export = try ExternalCommand.run(Self.ctl, ["ca", "export", "-o", exported, "--socket", daemon.socketPath])
            #expect(export.status == 0, "\(export.stderr)")
            let first = try String(contentsOfFile: exported, encoding: .utf8)
            #expect(first.hasPrefix("-----BEGIN CERTIFICATE-----"))
            let again = try ExternalCommand.run(Self.ctl, ["ca", "export", "-o", exported, "--socket", daemon.socketPath])
            #expect(again.status == 1 && again.stderr.contains("exists already"), "\(again.stderr)")
            let nowhere = try ExternalCommand.run(Self.ctl, ["ca", "export", "-o", "/nonexistent/dir/ca.pem", "--socket", daemon.socketPath])
            #expect(nowhere.status == 1 && nowhere.stderr.contains("check that its directory exists"), "\(nowhere.stderr)")
            #expect(!nowhere.stderr.contains("exists already"))
            let before = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "\(corp.base)/basic/a"])
            #expect(before.stdout == "hello alice", "\(before.stderr)")

            let rotate = try ExternalCommand.run(Self.ctl, ["ca", "rotate", "--socket", daemon.socketPath])
            #expect(rotate.status == 0, "\(rotate.stderr)")
            let stdout = try ExternalCommand.run(Self.ctl, ["ca", "export", "--socket", daemon.socketPath])
            let second = stdout.stdout + "\n"
            #expect(second != first && second.hasPrefix("-----BEGIN CERTIFICATE-----"))
            // A program given only the old CA no longer trusts the broker's leaves ...
            let old = try ExternalCommand.run(
                "/usr/bin/curl", ["-sS", "--cacert", exported, "-x", "http://127.0.0.1:\(try daemon.proxyPort())", "\(corp.base)/basic/b"]
            )
            #expect(old.status == 60, "\(old.status) \(old.stderr)")
            // ... and one started through the broker does, with the same bundle path.
            let after = try ProxyPortTests.runThroughBroker(daemon, ["/usr/bin/curl", "-sS", "--fail", "\(corp.base)/basic/c"])
            #expect(after.stdout == "hello alice", "\(after.stderr)")
            // No private key in the clear anywhere under the daemon's directories.
            let files = FileManager.default.enumerator(atPath: daemon.directory)?.compactMap { $0 as? String } ?? []
            for file in files {
                guard let data = FileManager.default.contents(atPath: daemon.directory + "/" + file) else { continue }
                #expect(!String(decoding: data, as: UTF8.self).contains("PRIVATE KEY"), "\(file)")
            }
        }
    }
}
