#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Secret bytes (a password, a private key) that never show up in logs and are wiped when freed.
///
/// `description`, `debugDescription` and the mirror print only the length, so interpolating a
/// value into a log message or dumping a struct that holds one reveals nothing. The bytes live in
/// one allocation owned by this object, written once in `init` and zeroed in `deinit`; there are
/// no copy-on-write copies to forget. Deliberately not `Codable`: a secret is serialised only by
/// a store, on purpose, through `withUnsafeBytes`.
///
/// - Warning: whatever a caller copies out (`withUnsafeBytes`, `stringValue()`) is the caller's
///   to wipe; Swift `String`s cannot be wiped, so prefer the bytes.
package final class SecretValue: @unchecked Sendable {  // the buffer is written only in init and deinit
    // @unchecked: the buffer is written only in init and deinit, so shared reads are safe.
    private let storage: UnsafeMutableRawBufferPointer

    /// Copies `bytes`.
    package init(bytes: some Collection<UInt8>) {
        let count = bytes.count
        self.storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(count, 1), alignment: 1)
        UnsafeMutableRawBufferPointer(rebasing: self.storage[0..<count]).copyBytes(from: bytes)
        self.count = count
    }

    /// Copies the bytes at `buffer` (from a C library's secure memory, say).
    package init(copying buffer: UnsafeRawBufferPointer) {
        let count = buffer.count
        self.storage = UnsafeMutableRawBufferPointer.allocate(byteCount: max(count, 1), alignment: 1)
        if count > 0, let base = buffer.baseAddress, let destination = self.storage.baseAddress {
            memcpy(destination, base, count)
        }
        self.count = count
    }

    /// The UTF-8 bytes of `string`.
    package convenience init(_ string: String) {
        self.init(bytes: string.utf8)
    }

    deinit {
        if let base = self.storage.baseAddress {
            Self.wipe(base, self.storage.count)
        }
        self.storage.deallocate()
    }

    /// The number of secret bytes.
    package let count: Int

    package var isEmpty: Bool { self.count == 0 }

    /// Calls `body` with the secret bytes; the pointer is valid only inside `body`.
    package func withUnsafeBytes<Result, Failure: Error>(
        _ body: (UnsafeRawBufferPointer) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        try body(UnsafeRawBufferPointer(rebasing: self.storage[0..<self.count]))
    }

    /// The secret as a string when it is valid UTF-8 (a password), else nil.
    ///
    /// - Warning: the returned `String` cannot be wiped; use it only where an API demands one.
    package func stringValue() -> String? {
        self.withUnsafeBytes { String(validating: $0, as: UTF8.self) }
    }

    /// Compares in time that depends on the lengths only, not on where the bytes differ.
    package func isEqual(to other: SecretValue) -> Bool {
        guard self.count == other.count else { return false }
        return self.withUnsafeBytes { mine in
            other.withUnsafeBytes { theirs in
                var difference: UInt8 = 0
                for index in 0..<mine.count { difference |= mine[index] ^ theirs[index] }
                return difference == 0
            }
        }
    }

    /// Zeroes `count` bytes at `pointer` in a way the optimiser may not remove (a plain
    /// `memset` before a free is a dead store it is allowed to drop).
    package static func wipe(_ pointer: UnsafeMutableRawPointer, _ count: Int) {
        guard count > 0 else { return }
        #if canImport(Darwin)
        _ = memset_s(pointer, count, 0, count)
        #else
        explicit_bzero(pointer, count)
        #endif
    }

    /// Zeroes a byte array in place (before it is dropped).
    package static func wipe(_ bytes: inout [UInt8]) {
        bytes.withUnsafeMutableBytes { buffer in
            if let base = buffer.baseAddress { wipe(base, buffer.count) }
        }
    }

}

extension SecretValue: CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    package var description: String { "<redacted \(self.count) bytes>" }
    package var debugDescription: String { "SecretValue(<redacted \(self.count) bytes>)" }
    package var customMirror: Mirror { Mirror(self, children: ["count": self.count], displayStyle: .class) }
}
