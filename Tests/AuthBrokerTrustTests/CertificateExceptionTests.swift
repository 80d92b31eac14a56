import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import TestSupport
import Testing

/// Exact-certificate exceptions: the evaluator's decision, the store on disk, the parsers.
@Suite("Certificate exceptions")
struct CertificateExceptionTests {
    @Test(
        "an exception trusts exactly its leaf on its host despite the failure",
        arguments: ["unknown_issuer", "self_signed", "expired", "hostname_mismatch"]
    )
    func trustsDespiteFailure(failure: String) async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let stranger = try TestPKI.makeCA(commonName: "Stranger CA")
        let leaf: TestIdentity
        switch failure {
        case "unknown_issuer": leaf = try TestPKI.makeLeaf(dnsNames: ["nas.example.test"], issuer: stranger)
        case "self_signed": leaf = try TestPKI.makeLeaf(dnsNames: ["nas.example.test"], issuer: nil)
        case "expired":
            leaf = try TestPKI.makeLeaf(
                dnsNames: ["nas.example.test"], issuer: nil, notBefore: .now - 86400 * 10, notAfter: .now - 86400
            )
        default: leaf = try TestPKI.makeLeaf(dnsNames: ["other.example.test"], issuer: nil)
        }
        let before = await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "nas.example.test", port: 5001)
        #expect(!before.isTrusted)
        #expect(before.failures.map(\.code).contains(failure), "\(before.failures)")

        try fixture.store.addException(
            host: pattern("nas.example.test"), port: 5001, sha256: leaf.sha256Fingerprint, persistent: true
        )
        let after = await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "nas.example.test", port: 5001)
        #expect(after.isTrusted, "\(after.failures)")
        #expect(after.byException)
        #expect(after.chain.first?.sha256 == leaf.sha256Fingerprint)

        // Another port, an unknown port, another host: not covered.
        #expect(!(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "nas.example.test", port: 443).isTrusted))
        #expect(!(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "nas.example.test").isTrusted))
        #expect(!(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "b.example.test", port: 5001).isTrusted))
    }

    @Test("another leaf on the same host is not trusted by the exception")
    func otherLeafNotTrusted() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let trusted = try TestPKI.makeLeaf(dnsNames: ["nas.example.test"], issuer: nil)
        let impostor = try TestPKI.makeLeaf(dnsNames: ["nas.example.test"], issuer: nil)
        try fixture.store.addException(host: pattern("nas.example.test"), port: nil, sha256: trusted.sha256Fingerprint, persistent: false)
        #expect(await fixture.evaluator.evaluate(chainDER: [trusted.der], host: "nas.example.test", port: 1).isTrusted)
        let other = await fixture.evaluator.evaluate(chainDER: [impostor.der], host: "nas.example.test", port: 1)
        #expect(!other.isTrusted)
        #expect(other.failures == [.selfSigned])
        #expect(!other.byException)
    }

    @Test("a wildcard exception without a port covers every port of every host below it")
    func wildcard() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["*.lab.example.test"], issuer: nil)
        try fixture.store.addException(host: pattern("*.lab.example.test"), port: nil, sha256: leaf.sha256Fingerprint, persistent: true)
        #expect(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "a.lab.example.test", port: 8443).isTrusted)
        #expect(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "b.lab.example.test").isTrusted)
        #expect(!(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "lab.example.test").isTrusted))
    }

    @Test("pins still apply to a chain trusted by an exception")
    func pinsStillApply() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["pinned.example.test"], issuer: nil)
        let otherKey = try TestPKI.makeLeaf(dnsNames: ["x.example.test"], issuer: nil)
        try fixture.store.addException(host: pattern("pinned.example.test"), port: nil, sha256: leaf.sha256Fingerprint, persistent: true)
        try fixture.store.addPin(host: pattern("pinned.example.test"), spkiSHA256: otherKey.spkiSHA256)
        let decision = await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "pinned.example.test", port: 443)
        #expect(!decision.isTrusted)
        #expect(decision.failures.map(\.code) == ["pin_mismatch"])

        try fixture.store.addPin(host: pattern("pinned.example.test"), spkiSHA256: leaf.spkiSHA256)
        #expect(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "pinned.example.test", port: 443).isTrusted)
    }

    @Test("under an exception a pin is met only by a certificate that signed its way down to the leaf, not by one appended")
    func pinNeedsSignatures() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        // The pinned CA is real and public; the excepted leaf (expired, say) was not issued by it.
        let pinnedCA = try TestPKI.makeCA(commonName: "Pinned CA")
        let impostor = try TestPKI.makeLeaf(dnsNames: ["pinned.example.test"], issuer: nil)
        try fixture.store.addException(host: pattern("pinned.example.test"), port: nil, sha256: impostor.sha256Fingerprint, persistent: true)
        try fixture.store.addPin(host: pattern("pinned.example.test"), spkiSHA256: pinnedCA.spkiSHA256)
        let appended = await fixture.evaluator.evaluate(chainDER: [impostor.der, pinnedCA.der], host: "pinned.example.test", port: 443)
        #expect(!appended.isTrusted && appended.failures.map(\.code) == ["pin_mismatch"])

        // A leaf the pinned CA did sign, excepted (for a name it lacks, say): the pin is met,
        // also with an unrelated certificate sent between them (TLS 1.3 allows extra ones).
        let issued = try TestPKI.makeLeaf(dnsNames: ["other.example.test"], issuer: pinnedCA)
        try fixture.store.addException(host: pattern("pinned.example.test"), port: nil, sha256: issued.sha256Fingerprint, persistent: true)
        #expect(await fixture.evaluator.evaluate(chainDER: [issued.der, pinnedCA.der], host: "pinned.example.test", port: 443).isTrusted)
        let unrelated = try TestPKI.makeCA(commonName: "Unrelated")
        #expect(
            await fixture.evaluator.evaluate(chainDER: [issued.der, unrelated.der, pinnedCA.der], host: "pinned.example.test", port: 443).isTrusted
        )
    }

    @Test("adding or removing an exception invalidates cached decisions (the generation bumps)")
    func cacheInvalidation() async throws {
        let fixture = try EvaluatorFixture(cacheSize: 16)
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["c.example.test"], issuer: nil)
        #expect(!(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "c.example.test", port: 443).isTrusted))
        let generation = fixture.store.generation
        try fixture.store.addException(host: pattern("c.example.test"), port: 443, sha256: leaf.sha256Fingerprint, persistent: false)
        #expect(fixture.store.generation > generation)
        let trusted = await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "c.example.test", port: 443)
        #expect(trusted.isTrusted && !trusted.fromCache)
        try fixture.store.removeException(host: pattern("c.example.test"), port: 443, sha256: leaf.sha256Fingerprint)
        #expect(!(await fixture.evaluator.evaluate(chainDER: [leaf.der], host: "c.example.test", port: 443).isTrusted))
    }

    @Test("saved exceptions survive reopening the store; session ones do not")
    func persistence() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        let store = try TrustStore(path: path)
        let saved = try store.addException(
            host: pattern("nas.example.test"), port: 5001, sha256: String(repeating: "ab", count: 32), persistent: true
        )
        try store.addException(host: pattern("once.example.test"), port: 443, sha256: String(repeating: "cd", count: 32), persistent: false)
        #expect(saved.sha256 == Array(repeating: "AB", count: 32).joined(separator: ":"))
        #expect(store.exceptions().saved == [saved])
        #expect(store.exceptions().session.count == 1)
        // Adding the same again changes nothing.
        let generation = store.generation
        #expect(try store.addException(host: pattern("nas.example.test"), port: 5001, sha256: saved.sha256, persistent: true) == saved)
        #expect(store.generation == generation)

        let reopened = try TrustStore(path: path)
        #expect(reopened.exceptions().saved == [saved])
        #expect(reopened.exceptions().session.isEmpty)

        let removed = try reopened.removeException(host: pattern("nas.example.test"), port: 5001, sha256: saved.sha256.lowercased())
        #expect(removed.persistent && removed.exception == saved)
        #expect(try TrustStore(path: path).exceptions().saved.isEmpty)
        #expect(throws: TrustStoreError.self) {
            try reopened.removeException(host: pattern("nas.example.test"), port: 5001, sha256: saved.sha256)
        }
    }

    @Test("a store file written before exceptions existed still opens; one with exceptions round-trips")
    func backwardCompatible() throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        try #"{"version": 1, "anchors": [], "pins": []}"#.write(toFile: path, atomically: true, encoding: .utf8)
        let store = try TrustStore(path: path)
        #expect(store.exceptions().saved.isEmpty)
        try #"""
        {"version": 1, "anchors": [], "pins": [], "exceptions": [
          {"host": "NAS.example.test", "port": 5001, "sha256": "\#(String(repeating: "0a", count: 32))", "added_at": "2026-01-01T00:00:00Z"}]}
        """#.write(toFile: path, atomically: true, encoding: .utf8)
        let withExceptions = try TrustStore(path: path)
        let exception = try #require(withExceptions.exceptions().saved.first)
        #expect(exception.host.description == "nas.example.test")
        #expect(exception.port == 5001)
        #expect(exception.sha256.hasPrefix("0A:0A:"))
    }

    @Test(
        "a corrupt exception in the file is an error naming the file",
        arguments: [
            #"[{"host": "http://x", "sha256": "00", "added_at": "2026-01-01T00:00:00Z"}]"#,
            #"[{"host": "x.test", "sha256": "not hex", "added_at": "2026-01-01T00:00:00Z"}]"#,
            #"[{"host": "x.test", "port": 0, "sha256": "\#(String(repeating: "0a", count: 32))", "added_at": "2026-01-01T00:00:00Z"}]"#,
        ]
    )
    func corruptException(exceptions: String) throws {
        let directory = try TemporaryDirectory()
        defer { directory.cleanUp() }
        let path = directory.file("trust.json")
        try #"{"version": 1, "anchors": [], "pins": [], "exceptions": \#(exceptions)}"#.write(toFile: path, atomically: true, encoding: .utf8)
        do {
            _ = try TrustStore(path: path)
            Issue.record("a corrupt store opened")
        } catch {
            #expect(error.code == "corrupt_file")
            #expect(error.message.contains(path))
        }
    }

    @Test(
        "hosts with and without ports parse; bad ones are typed errors",
        arguments: [
            ("nas.example.test", "nas.example.test", nil as Int?, nil as String?),
            ("NAS.example.test:5001", "nas.example.test", 5001, nil),
            ("*.example.test:8443", "*.example.test", 8443, nil),
            ("192.0.2.7:443", "192.0.2.7", 443, nil),
            ("::1", "::1", nil, nil),
            ("[::1]", "::1", nil, nil),
            ("[2001:db8::1]:8443", "2001:db8::1", 8443, nil),
            ("nas.example.test:0", "", nil, "invalid_host"),
            ("nas.example.test:65536", "", nil, "invalid_host"),
            ("nas.example.test:http", "", nil, "invalid_host"),
            ("nas.example.test:", "", nil, "invalid_host"),
            ("[::1]x", "", nil, "invalid_host"),
            ("https://nas.example.test/", "", nil, "invalid_host"),
            ("", "", nil, "invalid_host"),
            ("*", "", nil, "invalid_host"),
        ]
    )
    func parseHost(input: String, host: String, port: Int?, error code: String?) {
        do {
            let parsed = try CertificateException.parseHost(input)
            #expect(code == nil, "\(input) parsed")
            #expect(parsed.host.description == host)
            #expect(parsed.port == port)
        } catch {
            #expect(error.code == code, "\(input): \(error.message)")
        }
    }

    @Test(
        "fingerprints: hex with or without colons, any case, openssl's form; others refused",
        arguments: [
            (String(repeating: "ab", count: 32), true),
            (Array(repeating: "Ab", count: 32).joined(separator: ":"), true),
            ("SHA256 Fingerprint=" + Array(repeating: "AB", count: 32).joined(separator: ":"), true),
            (String(repeating: "ab", count: 31), false),
            (String(repeating: "zz", count: 32), false),
            ("", false),
            (String(repeating: "ab", count: 33), false),
        ]
    )
    func fingerprint(input: String, valid: Bool) {
        do {
            let canonical = try CertificateException.canonicalFingerprint(input)
            #expect(valid)
            #expect(canonical == Array(repeating: "AB", count: 32).joined(separator: ":"))
        } catch {
            #expect(!valid)
            #expect(error.code == "invalid_fingerprint")
        }
    }

    @Test("hostDescription writes an IPv6 host with a port in brackets")
    func hostDescription() throws {
        let sha = String(repeating: "ab", count: 32)
        let v6 = CertificateException(host: try pattern("2001:db8::1"), port: 8443, sha256: sha, addedAt: Date())
        #expect(v6.hostDescription == "[2001:db8::1]:8443")
        let name = CertificateException(host: try pattern("nas.test"), port: nil, sha256: sha, addedAt: Date())
        #expect(name.hostDescription == "nas.test")
    }
}
