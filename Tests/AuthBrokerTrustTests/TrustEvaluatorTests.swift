import AuthBrokerCore
import AuthBrokerTrust
import Foundation
import TestSupport
import Testing

@Suite("TrustEvaluator")
struct TrustEvaluatorTests {
    @Test("a leaf issued by a user anchor is trusted")
    func trustedViaUserAnchor() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "User CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["a.example.test"], issuer: ca)
        try fixture.store.addAnchors(pem: ca.pem, hosts: [])

        let decision = await fixture.evaluate([leaf], host: "a.example.test")
        #expect(decision.isTrusted)
        #expect(decision.failures.isEmpty)
        #expect(decision.chain.count == 1)
        #expect(decision.chain.first?.sha256 == leaf.sha256Fingerprint)
        #expect(decision.chain.first?.spkiSHA256 == leaf.spkiSHA256)
        #expect(decision.chain.first?.dnsNames == ["a.example.test"])
        #expect(decision.fromCache == false)
    }

    @Test("a leaf from an unknown CA is untrusted with unknown_issuer naming the CA")
    func unknownCA() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "Stranger CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["a.example.test"], issuer: ca)

        let decision = await fixture.evaluate([leaf], host: "a.example.test")
        #expect(!decision.isTrusted)
        #expect(decision.failures.map(\.code) == ["unknown_issuer"])
        guard case .unknownIssuer(let issuer) = decision.failures.first else {
            Issue.record("expected unknownIssuer, got \(decision.failures)")
            return
        }
        #expect(issuer.contains("CN=Stranger CA"))
    }

    @Test("a self-signed leaf is untrusted until it is an anchor itself")
    func selfSigned() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["self.example.test"], issuer: nil)

        let before = await fixture.evaluate([leaf], host: "self.example.test")
        #expect(before.failures == [.selfSigned])
        #expect(before.chain.first?.isSelfSigned == true)

        try fixture.store.addAnchors(pem: leaf.pem, hosts: [pattern("self.example.test")])
        let after = await fixture.evaluate([leaf], host: "self.example.test")
        #expect(after.isTrusted, "\(after.failures)")
        let wrongHost = await fixture.evaluate([leaf], host: "other.example.test")
        #expect(wrongHost.failures.map(\.code) == ["anchor_out_of_scope", "hostname_mismatch"])
    }

    @Test("an expired leaf fails with expired and its notAfter")
    func expiredLeaf() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "CA")
        let notAfter = Date(timeIntervalSince1970: (Date.now - 86400).timeIntervalSince1970.rounded(.down))
        let leaf = try TestPKI.makeLeaf(
            dnsNames: ["old.example.test"],
            issuer: ca,
            notBefore: .now - 86400 * 10,
            notAfter: notAfter
        )
        try fixture.store.addAnchors(pem: ca.pem, hosts: [])

        let decision = await fixture.evaluate([leaf], host: "old.example.test")
        #expect(decision.failures == [.expired(notAfter: notAfter)])
        #expect(decision.reasons.first?.contains("CN=old.example.test") == true)
    }

    @Test("an expired intermediate is reported too")
    func expiredIntermediate() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let root = try TestPKI.makeCA(commonName: "Root")
        let intermediate = try TestPKI.makeCA(
            commonName: "Old Intermediate",
            notBefore: .now - 86400 * 10,
            notAfter: .now - 60,
            issuer: root
        )
        let leaf = try TestPKI.makeLeaf(dnsNames: ["x.example.test"], issuer: intermediate)
        try fixture.store.addAnchors(pem: root.pem, hosts: [])

        let decision = await fixture.evaluate([leaf, intermediate], host: "x.example.test")
        #expect(decision.failures.map(\.code) == ["expired"])
        #expect(decision.reasons.first?.contains("Old Intermediate") == true)
    }

    @Test("a leaf not yet valid fails with not_yet_valid")
    func notYetValid() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "CA")
        let leaf = try TestPKI.makeLeaf(
            dnsNames: ["new.example.test"],
            issuer: ca,
            notBefore: .now + 86400,
            notAfter: .now + 86400 * 10
        )
        try fixture.store.addAnchors(pem: ca.pem, hosts: [])

        let decision = await fixture.evaluate([leaf], host: "new.example.test")
        #expect(decision.failures.map(\.code) == ["not_yet_valid"])
    }

    @Test("validity is judged at the given time")
    func fixedTime() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["t.example.test"], issuer: ca)
        try fixture.store.addAnchors(pem: ca.pem, hosts: [])

        let later = await fixture.evaluate([leaf], host: "t.example.test", now: .now + 86400 * 60)
        #expect(later.failures.map(\.code) == ["expired"])
        let now = await fixture.evaluate([leaf], host: "t.example.test")
        #expect(now.isTrusted)
    }

    @Test("a leaf for another name fails with hostname_mismatch listing its names")
    func wrongHost() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["right.example.test", "*.wild.example.test"], issuer: ca)
        try fixture.store.addAnchors(pem: ca.pem, hosts: [])

        let decision = await fixture.evaluate([leaf], host: "wrong.example.test")
        #expect(
            decision.failures == [
                .hostnameMismatch(host: "wrong.example.test", names: ["right.example.test", "*.wild.example.test"])
            ]
        )
        let wildcard = await fixture.evaluate([leaf], host: "a.wild.example.test")
        #expect(wildcard.isTrusted)
    }

    @Test("an IP-address leaf matches its IP and not another")
    func ipAddressLeaf() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "CA")
        let leaf = try TestPKI.makeLeaf(ipAddresses: ["192.0.2.10", "2001:db8::10"], issuer: ca)
        try fixture.store.addAnchors(pem: ca.pem, hosts: [])

        #expect(await fixture.evaluate([leaf], host: "192.0.2.10").isTrusted)
        #expect(await fixture.evaluate([leaf], host: "2001:db8::10").isTrusted)
        let other = await fixture.evaluate([leaf], host: "192.0.2.11")
        #expect(other.failures == [.hostnameMismatch(host: "192.0.2.11", names: ["192.0.2.10", "2001:db8::10"])])
        // An address is never matched by a DNS name equal to its text.
        let asName = await fixture.evaluate([leaf], host: "example.test")
        #expect(asName.failures.map(\.code) == ["hostname_mismatch"])
    }

    @Test("a chain through an intermediate is trusted; without the intermediate it is not")
    func intermediateChain() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let root = try TestPKI.makeCA(commonName: "Root")
        let intermediate = try TestPKI.makeCA(commonName: "Intermediate", issuer: root)
        let leaf = try TestPKI.makeLeaf(dnsNames: ["i.example.test"], issuer: intermediate)
        try fixture.store.addAnchors(pem: root.pem, hosts: [])

        let decision = await fixture.evaluate([leaf, intermediate], host: "i.example.test")
        #expect(decision.isTrusted, "\(decision.failures)")
        #expect(decision.chain.map(\.sha256) == [leaf.sha256Fingerprint, intermediate.sha256Fingerprint])

        let missing = await fixture.evaluate([leaf], host: "i.example.test")
        guard case .unknownIssuer(let issuer) = missing.failures.first else {
            Issue.record("expected unknownIssuer, got \(missing.failures)")
            return
        }
        #expect(issuer.contains("CN=Intermediate"))
    }

    @Test("an anchor scoped to *.internal.test vouches for a.internal.test only")
    func scopedAnchor() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "Internal CA")
        let inside = try TestPKI.makeLeaf(dnsNames: ["a.internal.test"], issuer: ca)
        let outside = try TestPKI.makeLeaf(dnsNames: ["other.example"], issuer: ca)
        let anchors = try fixture.store.addAnchors(pem: ca.pem, hosts: [pattern("*.internal.test")])
        let anchor = try #require(anchors.first)

        #expect(await fixture.evaluate([inside], host: "a.internal.test").isTrusted)
        let decision = await fixture.evaluate([outside], host: "other.example")
        #expect(decision.failures == [.anchorOutOfScope(anchorID: anchor.id, hosts: [try pattern("*.internal.test")])])
        #expect(decision.failures.first?.summary.contains("*.internal.test") == true)
        // The wildcard does not cover the bare domain.
        let bare = try TestPKI.makeLeaf(dnsNames: ["internal.test"], issuer: ca)
        #expect(await fixture.evaluate([bare], host: "internal.test").failures.map(\.code) == ["anchor_out_of_scope"])
    }

    @Test("a pin that matches a key of the chain keeps it trusted; a mismatch untrusts it")
    func pins() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let root = try TestPKI.makeCA(commonName: "Root")
        let intermediate = try TestPKI.makeCA(commonName: "Intermediate", issuer: root)
        let leaf = try TestPKI.makeLeaf(dnsNames: ["p.example.test"], issuer: intermediate)
        let stranger = try TestPKI.makeCA(commonName: "Stranger")
        try fixture.store.addAnchors(pem: root.pem, hosts: [])

        // Pinned to the root (not presented, but in the validated chain).
        try fixture.store.addPin(host: pattern("p.example.test"), spkiSHA256: root.spkiSHA256)
        #expect(await fixture.evaluate([leaf, intermediate], host: "p.example.test").isTrusted)

        try fixture.store.removePin(host: pattern("p.example.test"), spkiSHA256: root.spkiSHA256)
        try fixture.store.addPin(host: pattern("*.example.test"), spkiSHA256: stranger.spkiSHA256)
        let decision = await fixture.evaluate([leaf, intermediate], host: "p.example.test")
        #expect(!decision.isTrusted)
        #expect(
            decision.failures == [
                .pinMismatch(
                    host: "p.example.test",
                    pinned: [stranger.spkiSHA256],
                    presented: [leaf.spkiSHA256, intermediate.spkiSHA256, root.spkiSHA256]
                )
            ]
        )
        // A pin for another host changes nothing.
        let elsewhere = try TestPKI.makeLeaf(dnsNames: ["q.other.test"], issuer: root)
        #expect(await fixture.evaluate([elsewhere], host: "q.other.test").isTrusted)
    }

    @Test("a pin never makes an untrusted chain trusted")
    func pinIsNotTrust() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["s.example.test"], issuer: nil)
        try fixture.store.addPin(host: pattern("s.example.test"), spkiSHA256: leaf.spkiSHA256)
        let decision = await fixture.evaluate([leaf], host: "s.example.test")
        #expect(decision.failures == [.selfSigned])
    }

    @Test("decisions are cached and the cache forgets them when the store changes")
    func cache() async throws {
        let fixture = try EvaluatorFixture(cacheSize: 8)
        defer { fixture.directory.cleanUp() }
        let ca = try TestPKI.makeCA(commonName: "CA")
        let leaf = try TestPKI.makeLeaf(dnsNames: ["c.example.test"], issuer: ca)

        let first = await fixture.evaluate([leaf], host: "c.example.test")
        #expect(!first.isTrusted && !first.fromCache)
        let second = await fixture.evaluate([leaf], host: "c.example.test")
        #expect(!second.isTrusted && second.fromCache)
        // Another host is another key.
        #expect(await fixture.evaluate([leaf], host: "d.example.test").fromCache == false)

        try fixture.store.addAnchors(pem: ca.pem, hosts: [])
        let third = await fixture.evaluate([leaf], host: "c.example.test")
        #expect(third.isTrusted && !third.fromCache)
        #expect(await fixture.evaluate([leaf], host: "c.example.test").fromCache)
    }

    @Test("a cache of size 0 never serves a decision")
    func cacheDisabled() async throws {
        let fixture = try EvaluatorFixture(cacheSize: 0)
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["c.example.test"], issuer: nil)
        _ = await fixture.evaluate([leaf], host: "c.example.test")
        #expect(await fixture.evaluate([leaf], host: "c.example.test").fromCache == false)
    }

    @Test("the cache evicts the oldest decision when full")
    func cacheEviction() async throws {
        let fixture = try EvaluatorFixture(cacheSize: 2)
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["c.example.test"], issuer: nil)
        _ = await fixture.evaluate([leaf], host: "a.test")
        _ = await fixture.evaluate([leaf], host: "b.test")
        _ = await fixture.evaluate([leaf], host: "c.test")
        #expect(await fixture.evaluate([leaf], host: "c.test").fromCache)
        #expect(await fixture.evaluate([leaf], host: "a.test").fromCache == false)
    }

    @Test("system roots come from a PEM bundle; a missing bundle means none")
    func systemBundle() async throws {
        let root = try TestPKI.makeCA(commonName: "System Root")
        let other = try TestPKI.makeCA(commonName: "Other System Root")
        let bundle =
            "# comment line\n" + other.pem + "\n" + root.pem
            + "\n-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"
        let fixture = try EvaluatorFixture(systemBundle: bundle)
        defer { fixture.directory.cleanUp() }
        #expect(fixture.evaluator.systemAnchorCount == 2)
        let leaf = try TestPKI.makeLeaf(dnsNames: ["sys.example.test"], issuer: root)
        #expect(await fixture.evaluate([leaf], host: "sys.example.test").isTrusted)

        let empty = try EvaluatorFixture()
        defer { empty.directory.cleanUp() }
        #expect(empty.evaluator.systemAnchorCount == 0)
        #expect(await empty.evaluate([leaf], host: "sys.example.test").failures.map(\.code) == ["unknown_issuer"])
    }

    @Test("reloading the system bundle picks up new roots")
    func reloadSystemBundle() async throws {
        let fixture = try EvaluatorFixture(systemBundle: "")
        defer { fixture.directory.cleanUp() }
        #expect(fixture.evaluator.systemAnchorCount == 0)
        let root = try TestPKI.makeCA(commonName: "New Root")
        try root.pem.write(toFile: fixture.directory.file("system.pem"), atomically: true, encoding: .utf8)
        fixture.evaluator.reloadSystemAnchors()
        #expect(fixture.evaluator.systemAnchorCount == 1)
    }

    @Test("a distribution update that removes a root: noticed by its file, no longer trusted, and the generation moves (pooled connections retire)")
    func systemBundleUpdateNoticed() async throws {
        let root = try TestPKI.makeCA(commonName: "Doomed Root")
        let kept = try TestPKI.makeCA(commonName: "Kept Root")
        let fixture = try EvaluatorFixture(systemBundle: root.pem + kept.pem)
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["update.example.test"], issuer: root)
        #expect(await fixture.evaluate([leaf, root], host: "update.example.test").isTrusted)
        #expect(!fixture.evaluator.reloadSystemAnchorsIfChanged(), "nothing changed yet")

        let generation = fixture.store.generation
        // As update-ca-certificates does: a new file put in place.
        let bundle = fixture.directory.file("system.pem")
        try kept.pem.write(toFile: bundle + ".new", atomically: false, encoding: .utf8)
        #expect(rename(bundle + ".new", bundle) == 0)
        #expect(fixture.evaluator.reloadSystemAnchorsIfChanged())
        #expect(fixture.evaluator.systemAnchorCount == 1)
        #expect(fixture.store.generation > generation)
        #expect(await fixture.evaluate([leaf, root], host: "update.example.test").failures.map(\.code) == ["unknown_issuer"])
        #expect(!fixture.evaluator.reloadSystemAnchorsIfChanged())

        // Caught empty (an update half done): the roots there were stay, and the empty file is
        // not read again every second.
        try "".write(toFile: bundle + ".new", atomically: false, encoding: .utf8)
        #expect(rename(bundle + ".new", bundle) == 0)
        _ = fixture.evaluator.reloadSystemAnchorsIfChanged()
        #expect(fixture.evaluator.systemAnchorCount == 1)
        #expect(!fixture.evaluator.reloadSystemAnchorsIfChanged())
    }

    @Test(
        "hostile chains are malformed_certificate, never a crash",
        arguments: [
            [[UInt8]](),
            [[]],
            [[0x30, 0x03, 0x02, 0x01, 0x01]],
            [[UInt8](repeating: 0x30, count: 100)],
            [[UInt8](repeating: 0, count: 70_000)],
            Array(repeating: [UInt8]([0x30, 0x00]), count: 17),
        ]
    )
    func hostileChains(chain: [[UInt8]]) async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let decision = await fixture.evaluator.evaluate(chainDER: chain, host: "example.test")
        #expect(!decision.isTrusted)
        #expect(decision.failures.map(\.code) == ["malformed_certificate"])
    }

    @Test("a garbage intermediate after a good leaf is malformed_certificate with the leaf shown")
    func garbageIntermediate() async throws {
        let fixture = try EvaluatorFixture()
        defer { fixture.directory.cleanUp() }
        let leaf = try TestPKI.makeLeaf(dnsNames: ["g.example.test"], issuer: nil)
        let decision = await fixture.evaluator.evaluate(chainDER: [leaf.der, [1, 2, 3]], host: "g.example.test")
        #expect(decision.failures.map(\.code) == ["malformed_certificate"])
        #expect(decision.chain.map(\.sha256) == [leaf.sha256Fingerprint])
    }

    @Test("every failure has a code and a sentence")
    func failureTexts() throws {
        let failures: [TrustFailure] = [
            .unknownIssuer(issuer: "CN=X"), .selfSigned, .expired(notAfter: .now), .notYetValid(notBefore: .now),
            .hostnameMismatch(host: "h", names: []),
            .anchorOutOfScope(anchorID: "ab", hosts: [try pattern("*.x.test")]),
            .pinMismatch(host: "h", pinned: ["a"], presented: ["b"]), .malformedCertificate("bad"), .other("why"),
        ]
        #expect(Set(failures.map(\.code)).count == failures.count)
        for failure in failures {
            #expect(!failure.summary.isEmpty)
        }
    }
}
