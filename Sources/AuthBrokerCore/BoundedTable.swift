/// A dictionary that holds at most `capacity` entries, forgetting the least recently used.
///
/// For the daemon's per-origin memory (Digest sessions, accepted spaces, realms seen): an
/// origin that varies its realm on every response, or a client that visits a million hosts,
/// must not grow it without bound. Eviction scans for the oldest entry, O(capacity) once the
/// table is full; with capacities in the thousands that is cheaper than keeping an order list.
package struct BoundedTable<Key: Hashable, Value> {
    private var entries: [Key: (value: Value, used: UInt64)] = [:]
    private var clock: UInt64 = 0
    package let capacity: Int

    /// - Parameter capacity: at least 1.
    package init(capacity: Int) {
        self.capacity = max(1, capacity)
    }

    package var count: Int { entries.count }

    /// The value for `key`, marking it used; setting nil removes it.
    package subscript(key: Key) -> Value? {
        mutating get {
            guard let entry = entries[key] else { return nil }
            clock &+= 1
            entries[key] = (entry.value, clock)
            return entry.value
        }
        set {
            guard let newValue else {
                entries[key] = nil
                return
            }
            if entries[key] == nil, entries.count >= capacity, let oldest = entries.min(by: { $0.value.used < $1.value.used })?.key {
                entries[oldest] = nil
            }
            clock &+= 1
            entries[key] = (newValue, clock)
        }
    }

    /// The value for `key` without marking it used.
    package func peek(_ key: Key) -> Value? {
        entries[key]?.value
    }

    /// Changes the value in place (`default` when absent), marking it used.
    package mutating func update<Result>(_ key: Key, default defaultValue: @autoclosure () -> Value, _ body: (inout Value) -> Result) -> Result {
        var value = self[key] ?? defaultValue()
        let result = body(&value)
        self[key] = value
        return result
    }
}

extension BoundedTable: Sendable where Key: Sendable, Value: Sendable {}
