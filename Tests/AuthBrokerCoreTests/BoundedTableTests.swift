import AuthBrokerCore
import Testing

@Suite("Bounded table")
struct BoundedTableTests {
    @Test("never more than its capacity; the least recently used goes first")
    func evictsLeastRecentlyUsed() {
        var table = BoundedTable<String, Int>(capacity: 3)
        table["a"] = 1
        table["b"] = 2
        table["c"] = 3
        #expect(table["a"] == 1)  // a is now the most recently used
        table["d"] = 4
        #expect(table.count == 3)
        #expect(table.peek("b") == nil)
        #expect(table.peek("a") == 1)
        for index in 0..<1000 { table["k\(index)"] = index }
        #expect(table.count == 3)
        #expect(table.peek("k999") == 999)
    }

    @Test("replacing or removing an entry does not evict another; update counts as a use")
    func replaceAndUpdate() {
        var table = BoundedTable<String, Int>(capacity: 2)
        table["a"] = 1
        table["b"] = 2
        table["a"] = 10
        #expect(table.count == 2)
        #expect(table.peek("b") == 2)
        table["b"] = nil
        #expect(table.count == 1)
        table.update("c", default: 0) { $0 += 5 }
        table.update("a", default: 0) { $0 += 1 }
        table["d"] = 4
        #expect(table.peek("c") == nil)
        #expect(table.peek("a") == 11)
        #expect(BoundedTable<Int, Int>(capacity: 0).capacity == 1)
    }
}
