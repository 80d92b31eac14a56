import AuthBrokerDaemon
import Testing

@Suite("Request ids")
struct RequestIDTests {
    @Test("16 lowercase hex digits, none repeated across 200,000 requests")
    func formatAndUniqueness() {
        var seen = Set<String>()
        var malformed: [String] = []
        let digits = Set("0123456789abcdef".utf8)
        for _ in 0..<200_000 {
            let id = RequestIDs.make()
            if id.utf8.count != 16 || !id.utf8.allSatisfy(digits.contains) { malformed.append(id) }
            seen.insert(id)
        }
        #expect(malformed.isEmpty)
        #expect(seen.count == 200_000)
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
