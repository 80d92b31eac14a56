import AuthBrokerClient
import AuthBrokerCore
import Foundation

/// Pure functions that turn the daemon's answers into text for people.
///
/// Kept apart from I/O so each rendering can be tested on values alone. Every string that
/// came from a server (subjects, names, reasons) passes through `sanitized(_:)` first: a
/// certificate subject with terminal escape sequences must not repaint the user's terminal.
package enum HumanFormat {
    // MARK: Problems

    /// The whole stderr text for a failure the daemon reported.
    ///
    /// `context` says what failed, e.g. `cannot fetch https://x.test/`. The first line is
    /// `authbrokerctl: <context>: <title>`, then the detail, each reason bulleted, the chain
    /// for trust failures, and the commands under "To fix:".
    package static func problem(_ error: BrokerError, context: String, now: Date) -> String {
        var lines = ["authbrokerctl: \(context): \(sanitized(error.title))"]
        let detail = sanitized(error.detail)
        if !detail.isEmpty, detail != sanitized(error.title) { lines.append(detail) }
        for reason in error.reasons { lines.append("  - \(sanitized(reason))") }
        if !error.chain.isEmpty {
            let presenter = error.host.map { sanitized($0) } ?? "the server"
            lines.append("")
            lines.append("Certificates presented by \(presenter) (leaf first):")
            for (index, certificate) in error.chain.enumerated() {
                lines.append(contentsOf: self.certificate(CertificateInfo(certificate), index: index, now: now))
            }
        }
        if !error.fix.isEmpty {
            lines.append("")
            lines.append("To fix:")
            for command in error.fix { lines.append("  \(sanitized(command))") }
        }
        if let requestID = error.requestID { lines.append("(request id \(sanitized(requestID)))") }
        return lines.joined(separator: "\n")
    }

    /// The message for a socket nobody listens on.
    package static func daemonNotRunning(socket: String) -> String {
        "authbrokerctl: authbrokerd is not running on \(socket) (start it with `systemctl --user start authbrokerd.socket` or run `authbrokerd`)"
    }

    // MARK: Certificates

    /// An indented description of one certificate, numbered `[index]`.
    package static func certificate(_ info: CertificateInfo, index: Int, now: Date) -> [String] {
        let pad = String(repeating: " ", count: "  [\(index)] ".count)
        var lines = ["  [\(index)] subject:  \(sanitized(info.subject))"]
        var issuer = sanitized(info.issuer)
        if info.isSelfSigned { issuer += " (self-signed)" }
        lines.append("\(pad)issuer:   \(issuer)")
        lines.append("\(pad)valid:    \(timestamp(info.notBefore)) to \(timestamp(info.notAfter))\(validityNote(info, now: now))")
        lines.append("\(pad)SHA-256:  \(sanitized(info.sha256))")
        lines.append("\(pad)key pin:  sha256//\(sanitized(info.spkiSHA256))")
        let names = (info.dnsNames + info.ipAddresses).map { sanitized($0) }
        if !names.isEmpty { lines.append("\(pad)names:    \(names.joined(separator: ", "))") }
        if info.isCA { lines.append("\(pad)CA:       yes") }
        return lines
    }

    static func validityNote(_ info: CertificateInfo, now: Date) -> String {
        if now > info.notAfter { return " (EXPIRED)" }
        if now < info.notBefore { return " (NOT YET VALID)" }
        return ""
    }

    /// What `anchors trust-server` shows before it asks: the chain and the broker's verdict.
    package static func inspection(_ report: InspectReport, now: Date) -> String {
        let count = report.chain.count
        var lines = [
            "\(sanitized(report.host)):\(report.port) presents \(count) certificate\(count == 1 ? "" : "s") (leaf first):"
        ]
        for (index, certificate) in report.chain.enumerated() {
            lines.append(contentsOf: self.certificate(certificate, index: index, now: now))
        }
        if report.trusted {
            lines.append("Verdict: trusted")
        } else {
            lines.append("Verdict: NOT trusted")
            for failure in report.failures {
                lines.append("  - \(sanitized(failure.summary)) [\(sanitized(failure.code))]")
            }
        }
        return lines.joined(separator: "\n")
    }

    // MARK: Anchors and pins

    /// The short form of an anchor id shown in tables: its first 16 hex digits.
    package static func shortID(_ id: String) -> String { String(id.prefix(16)) }

    /// How a list of host patterns reads in a sentence or a table cell.
    package static func scope(_ hosts: [String]) -> String {
        hosts.isEmpty ? "any host" : hosts.map { sanitized($0) }.joined(separator: ", ")
    }

    /// `anchors list`: a table of id, subject, hosts and expiry, or a sentence when empty.
    package static func anchorsTable(_ anchors: [AnchorRecord], now: Date) -> String {
        guard !anchors.isEmpty else {
            return "No anchors. Add one with 'authbrokerctl anchors add FILE.pem' or 'authbrokerctl anchors trust-server URL'."
        }
        let rows = anchors.map { anchor in
            [
                shortID(anchor.id), sanitized(anchor.certificate.subject), scope(anchor.hosts),
                date(anchor.certificate.notAfter) + (now > anchor.certificate.notAfter ? " (EXPIRED)" : ""),
            ]
        }
        return table(header: ["ID", "SUBJECT", "HOSTS", "EXPIRES"], rows: rows)
    }

    /// `passwords list`: origin, realm, user, persistence and whether the server refused it.
    package static func passwordsTable(_ passwords: [PasswordRecord]) -> String {
        guard !passwords.isEmpty else {
            return "No passwords. Add one with 'authbrokerctl passwords add URL --user NAME'."
        }
        let rows = passwords.map { password in
            [
                sanitized(password.url), password.realm.map(sanitized) ?? "(any)", userName(password.user),
                sanitized(password.persistence),
                password.failed ? "REFUSED by the server; replace it with 'passwords add'" : "ok",
            ]
        }
        return table(header: ["ORIGIN", "REALM", "USER", "KEPT", "STATE"], rows: rows)
    }

    /// `identities list`.
    package static func identitiesTable(_ identities: [IdentityRecord]) -> String {
        guard !identities.isEmpty else {
            return "No client identities. Import one with 'authbrokerctl identities import FILE.p12 --hosts PATTERN'."
        }
        let rows = identities.map { identity in
            [
                sanitized(identity.name), sanitized(identity.subject), sanitized(identity.issuer),
                date(identity.notAfter) + (identity.expired ? " (EXPIRED)" : identity.expiresWithin30Days ? " (soon)" : ""),
                scope(identity.hosts).replacingOccurrences(of: "any host", with: "when named"),
                String(sanitized(identity.sha256).prefix(23)) + "…",
            ]
        }
        return table(header: ["NAME", "SUBJECT", "ISSUER", "EXPIRES", "HOSTS", "SHA-256"], rows: rows)
    }

    package static func importedIdentity(_ identity: IdentityRecord) -> String {
        [
            "Imported identity \(sanitized(identity.name))",
            "  subject:  \(sanitized(identity.subject))",
            "  issuer:   \(sanitized(identity.issuer))",
            "  SHA-256:  \(sanitized(identity.sha256))",
            "  expires:  \(timestamp(identity.notAfter))\(identity.expired ? " (EXPIRED: it will not be presented)" : "")",
            "  hosts:    \(identity.hosts.isEmpty ? "only when a request names it (Authbroker-Identity)" : scope(identity.hosts))",
        ].joined(separator: "\n")
    }

    /// `challenges`: what waits, for whom, how long. A server-trust challenge shows `trust?` as its
    /// scheme and the first failure code as its realm.
    package static func challengesTable(_ challenges: [ChallengeRecord]) -> String {
        guard !challenges.isEmpty else { return "No challenges are waiting." }
        let rows = challenges.map { challenge in
            [
                challenge.id, "\(sanitized(challenge.scheme))://\(sanitized(challenge.host)):\(challenge.port)",
                challenge.isServerTrust ? sanitized(challenge.failures?.first ?? "-") : sanitized(challenge.realm ?? ""),
                challenge.isServerTrust ? "trust?" : sanitized(challenge.authScheme ?? "?"),
                String(challenge.waiting ?? 0),
                String(format: "%.1fs", challenge.ageSeconds ?? 0),
                challenge.requester.map { "\($0.pid) \(sanitized($0.executable ?? "?"))" } ?? "?",
            ]
        }
        return table(header: ["ID", "SERVER", "REALM", "SCHEME", "WAITING", "AGE", "REQUESTER"], rows: rows)
    }

    /// What `agent` shows for a challenge before asking.
    package static func challengeOffer(_ challenge: ChallengeRecord, now: Date = Date()) -> String {
        let requester = challenge.requester.map { "pid \($0.pid) (\(sanitized($0.executable ?? "unknown executable")))" } ?? "an unknown process"
        let server = "\(sanitized(challenge.scheme))://\(sanitized(challenge.host)):\(challenge.port)"
        guard challenge.isServerTrust else {
            return [
                "",
                "Challenge \(challenge.id): \(requester) wants to reach \(server)",
                "  realm:  \(sanitized(challenge.realm ?? ""))",
                "  scheme: \(sanitized(challenge.authScheme ?? "?"))",
            ].joined(separator: "\n")
        }
        var lines = [
            "",
            "Challenge \(challenge.id): \(requester) wants to reach \(server), whose certificate is NOT trusted:",
        ]
        for reason in challenge.reasons ?? [] { lines.append("  - \(sanitized(reason))") }
        let chain = challenge.chain ?? []
        lines.append("Chain presented (leaf first):")
        for (index, certificate) in chain.enumerated() {
            lines.append(contentsOf: self.certificate(certificate, index: index, now: now))
        }
        lines.append("Compare the leaf's SHA-256 with one you got from the server's owner before you trust it.")
        return lines.joined(separator: "\n")
    }

    /// `exceptions list`.
    package static func exceptionsTable(_ exceptions: [ExceptionRecord]) -> String {
        guard !exceptions.isEmpty else {
            return "No exceptions. Add one with 'authbrokerctl exceptions add HOST[:PORT] SHA256'."
        }
        let rows = exceptions.map {
            [
                sanitized($0.target), sanitized($0.sha256), $0.persistent ? "always" : "once (until restart)",
                $0.addedAt.map(date) ?? "-", $0.expiresAt.map(timestamp) ?? "never",
            ]
        }
        return table(header: ["HOST", "CERTIFICATE SHA-256", "KEPT", "ADDED", "EXPIRES"], rows: rows)
    }

    /// A stored user name as shown: an empty one (a token sent as the password) said in words.
    static func userName(_ user: String) -> String {
        user.isEmpty ? "(empty user name)" : sanitized(user)
    }

    /// One password in a sentence (`passwords add` / `remove`).
    package static func passwordLine(_ password: PasswordRecord) -> String {
        let realm = password.realm.map { ", realm \"\(sanitized($0))\"" } ?? ""
        return "password for \(userName(password.user)) at \(sanitized(password.url))\(realm) (\(sanitized(password.persistence)))"
    }

    /// What `anchors add` (and `trust-server`) print for each anchor the daemon stored;
    /// `previousHosts`: it was an anchor already, for these hosts, which the new ones replaced.
    package static func addedAnchor(_ anchor: AnchorRecord, now: Date, previousHosts: [String]? = nil) -> String {
        let first =
            if let previousHosts {
                previousHosts == anchor.hosts
                    ? "Anchor \(shortID(anchor.id)) was already there, unchanged"
                    : "Updated anchor \(shortID(anchor.id)): it was an anchor already, with scope \(scope(previousHosts))"
            } else {
                "Added anchor \(shortID(anchor.id))"
            }
        return [
            first,
            "  subject:  \(sanitized(anchor.certificate.subject))",
            "  SHA-256:  \(sanitized(anchor.certificate.sha256))",
            "  expires:  \(timestamp(anchor.certificate.notAfter))\(validityNote(anchor.certificate, now: now))",
            "  scope:    \(scope(anchor.hosts))",
        ].joined(separator: "\n")
    }

    /// `anchors remove`.
    package static func removedAnchor(_ anchor: AnchorRecord) -> String {
        "Removed anchor \(shortID(anchor.id)) (\(sanitized(anchor.certificate.subject)), scope: \(scope(anchor.hosts)))"
    }

    /// `pins list`.
    package static func pinsTable(_ pins: [PinRecord]) -> String {
        guard !pins.isEmpty else { return "No pins. Add one with 'authbrokerctl pins add HOST SPKI_SHA256'." }
        let rows = pins.map { [sanitized($0.host), sanitized($0.spkiSHA256), $0.addedAt.map(date) ?? "-"] }
        return table(header: ["HOST", "SPKI SHA-256", "ADDED"], rows: rows)
    }

    // MARK: Status

    /// `status`: one block of labelled lines, then the counters.
    package static func status(_ report: StatusReport) -> String {
        var lines = ["authbrokerd \(sanitized(report.version)) (pid \(report.pid)), up \(duration(report.uptimeSeconds))"]
        var fields: [(String, String)] = []
        if let startedAt = report.startedAt { fields.append(("started", timestamp(startedAt))) }
        fields.append(("socket", sanitized(report.socket)))
        if let proxyPort = report.proxyPort {
            fields.append(("proxy port", proxyPort.isEmpty ? "off" : proxyPort.map(sanitized).joined(separator: ", ")))
        }
        if let configFile = report.configFile {
            let state = report.configLoaded == false ? " (not found; defaults in use)" : ""
            fields.append(("config", sanitized(configFile) + state))
        }
        if let stateDirectory = report.stateDirectory { fields.append(("state", sanitized(stateDirectory))) }
        if let anchors = report.systemAnchors {
            let source = anchors.path.map { " from \(sanitized($0))" } ?? ""
            fields.append(("system anchors", "\(anchors.count)\(source)"))
        }
        if let userAnchors = report.userAnchors { fields.append(("your anchors", String(userAnchors))) }
        if let pins = report.pins { fields.append(("your pins", String(pins))) }
        if let identities = report.identities { fields.append(("identities", String(identities))) }
        if let store = report.secretStore {
            fields.append(("secret store", "\(sanitized(store.backend)): \(sanitized(store.reason))"))
        }
        if let cache = report.cache {
            fields.append(("http cache", Self.cacheSummary(cache)))
        }
        if let kerberos = report.kerberos {
            fields.append(("kerberos", Self.kerberosSummary(kerberos)))
        }
        let width = fields.map(\.0.count).max() ?? 0
        for (label, value) in fields {
            lines.append("\(label):" + String(repeating: " ", count: width - label.count + 1) + value)
        }
        for warning in report.warnings ?? [] {
            lines.append("warning: " + sanitized(warning))
        }
        if !report.counters.isEmpty {
            lines.append("counters:")
            let names = report.counters.keys.sorted(by: counterOrder)
            let nameWidth = names.map(\.count).max() ?? 0
            for name in names {
                let value = report.counters[name] ?? 0
                lines.append("  \(sanitized(name))" + String(repeating: " ", count: nameWidth - name.count + 2) + "\(value)")
            }
        }
        return lines.joined(separator: "\n")
    }

    /// `412 entries, 31.2 MiB of 1024 MiB; 1200 hits, 310 misses, 42 revalidated (offline)`.
    package static func cacheSummary(_ cache: CacheCounters) -> String {
        let megabytes = { (bytes: Int64) in String(format: "%.1f MiB", Double(bytes) / 1_048_576) }
        var text = "\(cache.entries) entries, \(megabytes(cache.bytes)) of \(cache.maxBytes >> 20) MiB; "
        text += "\(cache.hits) hits, \(cache.misses) misses, \(cache.revalidations) revalidated"
        if cache.servedStale > 0 { text += ", \(cache.servedStale) served stale" }
        if cache.evictions > 0 { text += ", \(cache.evictions) evicted" }
        if cache.offline { text += " (offline)" }
        return text
    }

    /// `alice@CORP.EXAMPLE, expires 2026-11-27 18:00:00 UTC; 12 tickets sent, 12 accepted`.
    package static func kerberosSummary(_ kerberos: StatusReport.KerberosStatus) -> String {
        var text: String
        switch kerberos.ticket {
        case "valid":
            text = sanitized(kerberos.principal ?? "?")
            if let expires = kerberos.expires { text += ", expires " + timestamp(expires) }
        case "expired":
            text = "ticket of \(sanitized(kerberos.principal ?? "?")) expired"
        default:
            text = "no ticket (run kinit)"
        }
        if let started = kerberos.contextsStarted, let accepted = kerberos.contextsAccepted {
            text += "; \(started) tickets sent, \(accepted) accepted"
        }
        if let failure = kerberos.lastFailure { text += "; last failure: " + sanitized(failure) }
        return text
    }

    /// The documented counters in their documented order, any others after them by name.
    static let knownCounters = [
        "client_connections_accepted", "client_connections_refused", "client_connections_open",
        "client_connections_on_full_path", "client_connections_timed_out",
        "requests_total", "requests_in_flight", "requests_relayed_directly", "broker_errors_total",
        "upstream_connections_open", "bytes_from_upstream", "bytes_to_upstream",
    ]

    static func counterOrder(_ a: String, _ b: String) -> Bool {
        let ia = knownCounters.firstIndex(of: a) ?? Int.max
        let ib = knownCounters.firstIndex(of: b) ?? Int.max
        return ia != ib ? ia < ib : a < b
    }

    /// `3d 4h`, `2h 3m`, `4m 5s`, `12s`: two units at most, enough to read at a glance.
    package static func duration(_ seconds: Double) -> String {
        let total = seconds.isFinite && seconds > 0 ? Int(seconds.rounded(.down)) : 0
        let days = total / 86_400
        let hours = total % 86_400 / 3_600
        let minutes = total % 3_600 / 60
        let secs = total % 60
        if days > 0 { return "\(days)d \(hours)h" }
        if hours > 0 { return "\(hours)h \(minutes)m" }
        if minutes > 0 { return "\(minutes)m \(secs)s" }
        return "\(secs)s"
    }

    // MARK: Building blocks

    /// `2025-01-31 12:00:00 UTC`: UTC so output is the same on every machine.
    package static func timestamp(_ date: Date) -> String {
        let c = utcCalendar.dateComponents([.year, .month, .day, .hour, .minute, .second], from: date)
        return String(
            format: "%04d-%02d-%02d %02d:%02d:%02d UTC",
            c.year ?? 0, c.month ?? 0, c.day ?? 0, c.hour ?? 0, c.minute ?? 0, c.second ?? 0
        )
    }

    /// `2025-01-31` (UTC).
    package static func date(_ date: Date) -> String {
        let c = utcCalendar.dateComponents([.year, .month, .day], from: date)
        return String(format: "%04d-%02d-%02d", c.year ?? 0, c.month ?? 0, c.day ?? 0)
    }

    private static var utcCalendar: Calendar {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC") ?? calendar.timeZone
        return calendar
    }

    /// Left-aligned columns separated by two spaces; the last column is not padded.
    package static func table(header: [String], rows: [[String]]) -> String {
        let all = [header] + rows
        let columns = header.count
        var widths = [Int](repeating: 0, count: columns)
        for row in all {
            for (index, cell) in row.enumerated() where index < columns {
                widths[index] = max(widths[index], cell.count)
            }
        }
        return all.map { row in
            row.enumerated().map { index, cell in
                index == row.count - 1 ? cell : cell + String(repeating: " ", count: widths[index] - cell.count)
            }.joined(separator: "  ")
        }.joined(separator: "\n")
    }

    /// `text` with every control character (C0, DEL, C1) replaced by `?`, so text from a server
    /// cannot move the cursor, change colours or fake lines on the user's terminal.
    package static func sanitized(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x00...0x1F, 0x7F...0x9F: out.append("?")
            case 0x2028, 0x2029, 0x202A...0x202E, 0x2066...0x2069: out.append("?")  // line separators, bidi overrides
            default: out.append(scalar)
            }
        }
        return String(out)
    }
}
