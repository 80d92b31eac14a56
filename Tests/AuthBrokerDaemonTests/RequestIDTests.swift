@testable import AuthBrokerDaemon
import Testing

@Suite("Request ids")
struct RequestIDTests {
    @Test("15 lowercase hex digits, none repeated across 200,000 requests")
    func formatAndUniqueness() {
        var seen = Set<String>()
        var malformed: [String] = []
        let digits = Set("0123456789abcdef".utf8)
        for _ in 0..<200_000 {
            let id = RequestIDs.make()
            if id.utf8.count != 15 || !id.utf8.allSatisfy(digits.contains) { malformed.append(id) }
            seen.insert(id)
        }
        #expect(malformed.isEmpty)
        #expect(seen.count == 200_000)
    }

    @Test("the scrambling stays below 2^60 and maps distinct counters to distinct values, across the wrap too")
    func scramblingIsOneToOne() {
        let counters: [UInt64] = Array(0..<50_000) + Array((RequestIDs.mask - 50_000)...RequestIDs.mask)
        let values = counters.map(RequestIDs.scrambled)
        #expect(values.allSatisfy { $0 <= RequestIDs.mask })
        #expect(Set(values).count == counters.count)
    }

    @Test("Consecutive ids do not look sequential")
    func consecutiveIDsDiffer() {
        let first = RequestIDs.make()
        let second = RequestIDs.make()
        // Scrambled: far more than the last digit differs between neighbours.
        let differing = zip(first.utf8, second.utf8).filter { $0 != $1 }.count
        #expect(differing > 4)
    }
}
