import AuthBrokerCore
import Foundation
import _CryptoExtras
import SwiftASN1
import X509

// Rules for a chain that authenticates a TLS server, stricter than swift-certificates'
// `ServerIdentityPolicy` and `RFC5280Policy` where those follow older or looser readings. Each
// policy also explains itself (`failures(…)`) so that the broker's error names the rule and the
// certificate in the user's words. The user's own anchors relax none of them; an exception for
// the one certificate is the way to accept a server that breaks one.

/// The host name rules of RFC 6125 §6.4 as browsers apply them (CA/Browser Forum Baseline
/// Requirements §7.1.2.7.12, §7.1.4.3):
/// - the names are the subjectAltName's DNS names and IP addresses only; the subject CN is never
///   a fallback (RFC 6125 §6.4.4 allowed it, RFC 9525 §6.3 removed it; swift-certificates still
///   falls back, hence this policy);
/// - a wildcard is only a whole left-most label (`*.example.com`), matches exactly one label, and
///   needs two labels after it (`*` and `*.com` match nothing; `ba*.example.com` is not a wildcard
///   at all: RFC 9525 §6.3 drops the partial-label form);
/// - every dNSName is in the preferred name syntax (RFC 5280 §4.2.1.6: letters, digits and
///   hyphens; no underscore, no IP address written as a name), and no wildcard covers a whole
///   public suffix (`*.co.uk`, `*.s3.amazonaws.com`: BR §7.1.2.7.12, as browsers refuse it);
/// - a subject CN, when present, is exactly one, and a character-for-character copy of one of
///   those names (BR §7.1.4.3; an IP address in its RFC 3986 / RFC 5952 text).
struct ServerNamePolicy: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = [.X509ExtensionID.subjectAlternativeName]
    let host: String
    let publicSuffixes: PublicSuffixList

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        guard let leaf = chain.first else { return .failsToMeetPolicy(reason: "empty chain") }
        if let failure = Self.nameFailure(leaf, host: self.host) { return .failsToMeetPolicy(reason: failure) }
        if let failure = Self.consistencyFailure(leaf, publicSuffixes: self.publicSuffixes) {
            return .failsToMeetPolicy(reason: failure.summary)
        }
        return .meetsPolicy
    }

    /// Why `leaf` is not for `host`, or nil when one of its names matches.
    static func nameFailure(_ leaf: Certificate, host: String) -> String? {
        let names: (dns: [String], ip: [[UInt8]])
        do {
            names = try Self.names(of: leaf)
        } catch {
            return "its subjectAltName cannot be read"
        }
        if let address = HostPattern.ipAddressBytes(host) {
            return names.ip.contains(address) ? nil : "no IP address of it is \(host)"
        }
        let wanted = Self.normalized(host)
        return names.dns.contains { Self.matches(pattern: Self.normalized($0), host: wanted) } ? nil : "no name of it matches \(host)"
    }

    /// What makes the leaf's names unfit for any host: no subjectAltName, a name that is not a
    /// host name, a wildcard over a public suffix, or a subject CN that is not one of the names.
    static func consistencyFailure(_ leaf: Certificate, publicSuffixes: PublicSuffixList) -> TrustFailure? {
        func unfit(_ reason: String) -> TrustFailure { .unfitForServer(certificate: Self.describe(leaf), reason: reason) }
        guard let names = try? Self.names(of: leaf) else { return unfit("its subjectAltName extension is malformed") }
        if names.dns.isEmpty && names.ip.isEmpty {
            return unfit("it has no subjectAltName, so it names no host (its subject CN is not used as a host name)")
        }
        for name in names.dns {
            if HostPattern.ipAddressBytes(name) != nil {
                return unfit("its subjectAltName holds the IP address '\(name)' as a DNS name, where it may not be")
            }
            // An absolute name (a trailing dot) is not in the preferred name syntax, and a name
            // constraint's check reads its empty last label as "no match": `www.bank.example.`
            // would pass a CA's exclusion of `bank.example`, then match `www.bank.example`.
            if name.hasSuffix(".") {
                return unfit("its subjectAltName holds '\(name)', which ends with a dot (certificates name hosts without one)")
            }
            // HostPattern's grammar is RFC 1034 §3.5 as RFC 1123 §2.1 relaxes it, with a whole
            // left-most `*` label allowed: the preferred name syntax RFC 5280 §4.2.1.6 asks for.
            guard let pattern = try? HostPattern(parsing: name), !pattern.isIPAddress else {
                return unfit("its subjectAltName holds '\(name)', which is not a host name (letters, digits and hyphens)")
            }
            if name.hasPrefix("*."), case let base = Self.normalized(String(name.dropFirst(2))), publicSuffixes.isPublicSuffix(base) {
                return unfit("its name '\(name)' would cover every name under the public suffix '\(base)'")
            }
        }
        let commonNames = Self.commonNames(of: leaf)
        if commonNames.count > 1 { return unfit("its subject has \(commonNames.count) CNs, where one at most is allowed") }
        let sanTexts = Set(names.dns + names.ip.compactMap { HostPattern.ipAddressText($0) })
        for commonName in commonNames where !sanTexts.contains(commonName) {
            return unfit("its subject CN '\(commonName)' is not, character for character, one of the names in its subjectAltName")
        }
        return nil
    }

    /// Whether a normalised subjectAltName DNS entry matches a normalised host.
    static func matches(pattern: String, host: String) -> Bool {
        guard !pattern.isEmpty, !host.isEmpty else { return false }
        guard pattern.contains("*") else { return pattern == host }
        // Only "*." followed by at least two labels, with no other asterisk.
        guard pattern.hasPrefix("*."), !pattern.dropFirst().contains("*") else { return false }
        let suffix = pattern.dropFirst(2)
        guard suffix.split(separator: ".", omittingEmptySubsequences: false).count >= 2,
            !suffix.split(separator: ".", omittingEmptySubsequences: false).contains(where: \.isEmpty),
            HostPattern.ipAddressBytes(host) == nil
        else { return false }
        guard let dot = host.firstIndex(of: "."), dot != host.startIndex else { return false }
        return host[host.index(after: dot)...] == suffix
    }

    private static func normalized(_ name: String) -> String {
        var name = name.lowercased()
        if name.hasSuffix(".") { name.removeLast() }
        return name
    }

    static func names(of leaf: Certificate) throws -> (dns: [String], ip: [[UInt8]]) {
        var dns: [String] = []
        var ip: [[UInt8]] = []
        guard let alternativeNames = try leaf.extensions.subjectAlternativeNames else { return (dns, ip) }
        for name in alternativeNames {
            switch name {
            case .dnsName(let value): dns.append(value)
            case .ipAddress(let octets): ip.append(Array(octets.bytes))
            default: continue
            }
        }
        return (dns, ip)
    }

    static func commonNames(of certificate: Certificate) -> [String] {
        certificate.subject.flatMap { $0 }.filter { $0.type == .RDNAttributeType.commonName }.map {
            String($0.value) ?? $0.value.description
        }
    }

    static func describe(_ certificate: Certificate) -> String {
        "The certificate '\(certificate.subject)'"
    }
}

/// What a server's chain may be used for (RFC 5280 §4.2.1.3, §4.2.1.9, §4.2.1.12; CA/Browser
/// Forum BR §7.1.2.7.10): the leaf's extended key usage, when present, includes serverAuth (or
/// anyExtendedKeyUsage); an empty one allows nothing; an intermediate restricted by extended key
/// usage includes serverAuth too (as browsers chain it); the leaf is not a CA (basicConstraints
/// CA:TRUE) and may not sign certificates (keyCertSign). swift-certificates' RFC5280Policy does
/// not look at extended key usage at all.
struct ServerUsagePolicy: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = [.X509ExtensionID.extendedKeyUsage]

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        if let failure = Self.failures(chain: Array(chain)).first { return .failsToMeetPolicy(reason: failure.summary) }
        return .meetsPolicy
    }

    /// Every usage failure of `chain` (leaf first; its last element, the root, is not judged).
    /// `leafIsAnchor`: the user trusts this very certificate (a self-signed server's, which
    /// `openssl req -x509` marks CA:TRUE by default); only its extended key usage is judged.
    static func failures(chain: [Certificate], leafIsAnchor: Bool = false) -> [TrustFailure] {
        guard let leaf = chain.first else { return [] }
        var failures: [TrustFailure] = []
        let describe = ServerNamePolicy.describe
        do {
            if let usage = try leaf.extensions.extendedKeyUsage {
                if !usage.contains(.serverAuth) && !usage.contains(.any) {
                    let allowed = usage.map(Self.name).joined(separator: ", ")
                    failures.append(
                        .unfitForServer(
                            certificate: describe(leaf),
                            reason: allowed.isEmpty
                                ? "its extended key usage is empty, which allows no use at all"
                                : "it is for \(allowed) only, not for TLS servers"
                        )
                    )
                }
            }
            if leafIsAnchor {
                // Trusted as itself: whether it may also sign others does not matter here.
            } else if case .isCertificateAuthority = try leaf.extensions.basicConstraints {
                failures.append(.unfitForServer(certificate: describe(leaf), reason: "it is a CA certificate (basicConstraints CA:TRUE), not a server's"))
            } else if try leaf.extensions.keyUsage?.keyCertSign == true {
                failures.append(.unfitForServer(certificate: describe(leaf), reason: "its key usage allows signing certificates, which a server's must not"))
            }
        } catch {
            failures.append(.unfitForServer(certificate: describe(leaf), reason: "an extension of it is malformed (\(error))"))
        }
        for intermediate in chain.dropFirst().dropLast() {
            guard let usage = try? intermediate.extensions.extendedKeyUsage else { continue }
            if !usage.contains(.serverAuth) && !usage.contains(.any) {
                failures.append(
                    .unfitForServer(certificate: describe(intermediate), reason: "this intermediate CA is restricted to other uses than TLS servers")
                )
            }
        }
        return failures
    }

    private static func name(_ usage: ExtendedKeyUsage.Usage) -> String {
        switch usage {
        case .clientAuth: "client authentication"
        case .codeSigning: "code signing"
        case .emailProtection: "e-mail"
        case .timeStamping: "time stamping"
        case .ocspSigning: "OCSP signing"
        case .serverAuth: "TLS servers"
        case .any: "any use"
        default: "\(usage)"
        }
    }
}

/// Validity at the exact instant, not rounded to the second: RFC 5280 §4.1.2.5 makes a
/// certificate valid from notBefore, and a chain checked a fraction of a second earlier is not
/// yet valid.
struct ExactValidityPolicy: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []
    let now: Date

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        for certificate in chain where now < certificate.notValidBefore || now > certificate.notValidAfter {
            return .failsToMeetPolicy(reason: "'\(certificate.subject)' is not valid at \(now)")
        }
        return .meetsPolicy
    }
}

/// The certificate profile of RFC 5280 that swift-certificates' RFC5280Policy leaves unchecked,
/// for every certificate of a server's chain:
/// - every extension the broker knows decodes as DER (a malformed one is refused, not skipped);
/// - an RSA key's modulus is a whole number of bytes;
/// - the leaf carries an authority key identifier (§4.2.1.1) and no name constraints (§4.2.1.10:
///   CA certificates only); a subject that is empty goes with a critical subjectAltName, a
///   subject that is not with a non-critical one (§4.2.1.6);
/// - every certificate judged has non-critical key identifiers (§4.2.1.1, §4.2.1.2);
/// - an intermediate has both key identifiers (§4.2.1.1, §4.2.1.2), a critical basicConstraints
///   saying CA (§4.2.1.9), keyCertSign when it has a key usage (§4.2.1.3), and a subject (§4.1.2.6);
/// - the root, when it is one of the user's anchors (system roots are the system's business),
///   is judged as an intermediate, except that its authority key identifier may be absent and,
///   when present, must be its own key identifier alone (BR §7.1.2.1.3). System roots are not
///   judged: Mozilla's store itself holds roots that break this (Go Daddy Class 2, Starfield
///   Class 2, QuoVadis Root CA 2 and 3, Certigna name an issuer and serial in their AKI);
/// - name constraints are well formed (at least one subtree; no DNS constraint with a leading
///   period), and a wildcard subjectAltName may not cover a name an excluded subtree forbids
///   (`*.example.com` against an excluded `bad.example.com`): swift-certificates compares the
///   wildcard as a literal name.
struct CertificateProfilePolicy: VerifierPolicy {
    let verifyingCriticalExtensions: [ASN1ObjectIdentifier] = []
    /// The user's anchors: a root among them is judged; a system root is not.
    let userRoots: [Certificate]

    func chainMeetsPolicyRequirements(chain: UnverifiedCertificateChain) -> PolicyEvaluationResult {
        let certificates = Array(chain)
        let judgeRoot = certificates.count > 1 && certificates.last.map { self.userRoots.contains($0) } == true
        if let failure = Self.failures(chain: certificates, judgeRoot: judgeRoot).first {
            return .failsToMeetPolicy(reason: failure.summary)
        }
        return .meetsPolicy
    }

    /// Every profile failure of `chain` (leaf first, root last when it was found).
    static func failures(chain: [Certificate], judgeRoot: Bool) -> [TrustFailure] {
        guard let leaf = chain.first else { return [] }
        var failures: [TrustFailure] = []
        func fail(_ certificate: Certificate, _ reason: String) {
            failures.append(.unfitForServer(certificate: ServerNamePolicy.describe(certificate), reason: reason))
        }
        for certificate in chain {
            if let broken = Self.undecodableExtension(certificate) {
                fail(certificate, "its \(broken) extension is not valid DER")
            }
            if let rsa = _RSA.Signing.PublicKey(certificate.publicKey), rsa.keySizeInBits % 8 != 0 {
                fail(certificate, "its RSA modulus is not a whole number of bytes")
            }
        }
        guard failures.isEmpty else { return failures }

        let judged = judgeRoot ? Array(chain.dropFirst()) : Array(chain.dropFirst().dropLast())
        for certificate in [leaf] + judged {
            for (oid, name) in [(ASN1ObjectIdentifier.X509ExtensionID.authorityKeyIdentifier, "authority"), (.X509ExtensionID.subjectKeyIdentifier, "subject")]
            where certificate.extensions[oid: oid]?.critical == true {
                fail(certificate, "its \(name) key identifier is marked critical, which RFC 5280 forbids")
            }
        }

        let extensions = leaf.extensions
        if chain.count > 1, (try? extensions.authorityKeyIdentifier) == nil {
            fail(leaf, "it has no authority key identifier")
        }
        if extensions[oid: .X509ExtensionID.nameConstraints] != nil {
            fail(leaf, "it carries name constraints, which only a CA may")
        }
        if let san = extensions[oid: .X509ExtensionID.subjectAlternativeName] {
            let emptySubject = leaf.subject.isEmpty
            if emptySubject && !san.critical {
                fail(leaf, "its subject is empty, so its subjectAltName must be critical, and it is not")
            } else if !emptySubject && san.critical {
                fail(leaf, "its subjectAltName is critical although it has a subject")
            }
        }

        for (index, authority) in judged.enumerated() {
            let isRoot = judgeRoot && index == judged.count - 1
            let caExtensions = authority.extensions
            let subjectKeyID = try? caExtensions.subjectKeyIdentifier
            if subjectKeyID == nil { fail(authority, "this CA has no subject key identifier") }
            if !isRoot, (try? caExtensions.authorityKeyIdentifier) == nil {
                fail(authority, "this intermediate CA has no authority key identifier")
            }
            // BR §7.1.2.1.3: a root's AKI, when present, is its own key identifier and nothing else.
            if isRoot, let authorityKeyID = try? caExtensions.authorityKeyIdentifier {
                if authorityKeyID.authorityCertIssuer != nil || authorityKeyID.authorityCertSerialNumber != nil {
                    fail(authority, "this root's authority key identifier names an issuer or serial number, which a root's may not")
                } else if authorityKeyID.keyIdentifier == nil || authorityKeyID.keyIdentifier != subjectKeyID?.keyIdentifier {
                    fail(authority, "this root's authority key identifier is not its own subject key identifier")
                }
            }
            if let constraints = caExtensions[oid: .X509ExtensionID.basicConstraints] {
                if !constraints.critical { fail(authority, "this CA's basicConstraints is not critical") }
                if case .notCertificateAuthority? = try? caExtensions.basicConstraints {
                    fail(authority, "it signs certificates but its basicConstraints says it is not a CA")
                }
            } else {
                fail(authority, "this CA has no basicConstraints")
            }
            if let usage = try? caExtensions.keyUsage, !usage.keyCertSign {
                fail(authority, "this CA's key usage does not allow signing certificates")
            }
            if authority.subject.isEmpty { fail(authority, "this CA has an empty subject") }
        }

        // Name constraints of every CA above the leaf, presented or anchored.
        let wildcards = ((try? ServerNamePolicy.names(of: leaf))?.dns ?? []).filter { $0.hasPrefix("*.") }.map {
            String($0.dropFirst(2)).lowercased()
        }
        for authority in chain.dropFirst() {
            guard authority.extensions[oid: .X509ExtensionID.nameConstraints] != nil,
                let constraints = try? authority.extensions.nameConstraints
            else { continue }
            if constraints.permittedSubtrees.isEmpty && constraints.excludedSubtrees.isEmpty {
                fail(authority, "its name constraints have neither permitted nor excluded subtrees")
                continue
            }
            let dnsConstraints = Array(constraints.permittedDNSDomains) + Array(constraints.excludedDNSDomains)
            if let bad = dnsConstraints.first(where: { $0.hasPrefix(".") }) {
                fail(authority, "its name constraint '\(bad)' starts with a period, which a DNS name constraint may not")
                continue
            }
            // swift-certificates drops a trailing dot from a constraint, this file's own checks
            // would not: refused, as names with one are.
            if let bad = dnsConstraints.first(where: { $0.hasSuffix(".") }) {
                fail(authority, "its name constraint '\(bad)' ends with a period, which a DNS name constraint may not")
                continue
            }
            for excluded in constraints.excludedDNSDomains {
                let forbidden = excluded.lowercased()
                for wildcard in wildcards where forbidden == wildcard || forbidden.hasSuffix("." + wildcard) {
                    fail(leaf, "its name '*.\(wildcard)' covers '\(excluded)', which the name constraints of '\(authority.subject)' exclude")
                }
            }
        }
        return failures
    }

    /// What the verifier refused in the chain, said in the user's words: a name an intermediate's
    /// constraints do not allow, a path length exceeded, a critical extension nobody here
    /// understands. The verifier decides these (RFC5280Policy, its critical-extension check), so
    /// this runs only to explain a refusal, never in the policy on every evaluation.
    static func verifierRefusalsInWords(chain: [Certificate]) -> [TrustFailure] {
        guard let leaf = chain.first else { return [] }
        var failures: [TrustFailure] = []
        func fail(_ certificate: Certificate, _ reason: String) {
            failures.append(.unfitForServer(certificate: ServerNamePolicy.describe(certificate), reason: reason))
        }
        for authority in chain.dropFirst() {
            // Malformed constraints are refused as such by `failures`; nothing to explain here.
            guard let constraints = try? authority.extensions.nameConstraints,
                !(constraints.permittedSubtrees.isEmpty && constraints.excludedSubtrees.isEmpty),
                !(Array(constraints.permittedDNSDomains) + Array(constraints.excludedDNSDomains)).contains(where: { $0.hasPrefix(".") })
            else { continue }
            for reason in Self.constraintViolations(of: leaf, constraints) {
                fail(leaf, "\(reason), by the name constraints of '\(authority.subject)'")
            }
        }
        // Path length (RFC 5280 §4.2.1.9): self-issued intermediates do not count.
        for (index, authority) in chain.enumerated().dropFirst() {
            guard case .isCertificateAuthority(let maxPathLength?)? = try? authority.extensions.basicConstraints else { continue }
            let below = chain[1..<index].filter { $0.subject != $0.issuer }.count
            if below > maxPathLength {
                fail(authority, "this CA allows \(maxPathLength) intermediate CA\(maxPathLength == 1 ? "" : "s") below it, and the chain has \(below)")
            }
        }
        // A critical extension no rule here understands: RFC 5280 §4.2 makes the certificate unusable.
        for certificate in chain {
            for unknown in certificate.extensions where unknown.critical && !Self.understoodCriticalExtensions.contains(unknown.oid) {
                fail(certificate, "it carries a critical extension the broker does not understand (\(unknown.oid))")
            }
        }
        return failures
    }

    /// The critical extensions that swift-certificates' RFC5280Policy and the server policies act on.
    static let understoodCriticalExtensions: Set<ASN1ObjectIdentifier> = [
        .X509ExtensionID.basicConstraints, .X509ExtensionID.nameConstraints, .X509ExtensionID.keyUsage,
        .X509ExtensionID.subjectAlternativeName, .X509ExtensionID.extendedKeyUsage,
    ]

    /// Each of `leaf`'s DNS names and IP addresses that `constraints` do not permit or exclude.
    static func constraintViolations(of leaf: Certificate, _ constraints: NameConstraints) -> [String] {
        guard let names = try? ServerNamePolicy.names(of: leaf) else { return [] }
        func within(_ name: String, _ domain: String) -> Bool {
            let name = name.lowercased()
            let domain = domain.lowercased()
            return domain.isEmpty || name == domain || name.hasSuffix("." + domain)
        }
        func inRange(_ address: [UInt8], _ range: ASN1OctetString) -> Bool {
            let bytes = Array(range.bytes)
            guard bytes.count == address.count * 2 else { return false }
            let mask = bytes[address.count...]
            return zip(zip(address, bytes), mask).allSatisfy { pair, mask in pair.0 & mask == pair.1 & mask }
        }
        var violations: [String] = []
        let permittedDNS = Array(constraints.permittedDNSDomains)
        for name in names.dns {
            let base = name.hasPrefix("*.") ? String(name.dropFirst(2)) : name
            if !permittedDNS.isEmpty && !permittedDNS.contains(where: { within(base, $0) }) {
                violations.append("its name '\(name)' is outside the names permitted (\(permittedDNS.joined(separator: ", ")))")
            } else if let excluded = constraints.excludedDNSDomains.first(where: { within(base, $0) }) {
                violations.append("its name '\(name)' is excluded ('\(excluded)')")
            }
        }
        let permittedIP = Array(constraints.permittedIPRanges)
        for address in names.ip {
            let text = HostPattern.ipAddressText(address) ?? "?"
            let sameFamily = permittedIP.filter { $0.bytes.count == address.count * 2 }
            if !sameFamily.isEmpty && !sameFamily.contains(where: { inRange(address, $0) }) {
                violations.append("its IP address \(text) is outside the addresses permitted")
            } else if constraints.excludedIPRanges.contains(where: { inRange(address, $0) }) {
                violations.append("its IP address \(text) is in an excluded range")
            }
        }
        return violations
    }

    /// The first known extension of `certificate` that does not decode, by name.
    private static func undecodableExtension(_ certificate: Certificate) -> String? {
        let extensions = certificate.extensions
        let checks: [(String, () throws -> Void)] = [
            ("basicConstraints", { _ = try extensions.basicConstraints }),
            ("keyUsage", { _ = try extensions.keyUsage }),
            ("extendedKeyUsage", { _ = try extensions.extendedKeyUsage }),
            ("subjectAltName", { _ = try extensions.subjectAlternativeNames }),
            ("nameConstraints", { _ = try extensions.nameConstraints }),
            ("authorityKeyIdentifier", { _ = try extensions.authorityKeyIdentifier }),
            ("subjectKeyIdentifier", { _ = try extensions.subjectKeyIdentifier }),
        ]
        for (name, check) in checks {
            do { try check() } catch { return name }
        }
        return nil
    }

    /// Whether checking `leaf`'s names against the constraints of `chain` is bounded work: a
    /// crafted chain with thousands of names and subtrees made swift-certificates' check run for
    /// seconds. Chrome and Go cap the same product.
    static let maxNameConstraintChecks = 65_536

    static func nameConstraintWork(leaf: Certificate, authorities: [Certificate]) -> Int {
        let names = (try? leaf.extensions.subjectAlternativeNames.map { Array($0).count }) ?? 0
        let subtrees = authorities.reduce(0) { total, authority in
            guard let constraints = try? authority.extensions.nameConstraints else { return total }
            return total + constraints.permittedSubtrees.count + constraints.excludedSubtrees.count
        }
        return (names + 1) * subtrees
    }
}
