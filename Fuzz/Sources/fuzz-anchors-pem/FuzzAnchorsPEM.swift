import AuthBrokerCore
import AuthBrokerTrust
import FuzzSupport

/// Fuzzes the anchors PEM import (`TrustStore.addAnchors`: PEM splitting, X.509 parsing,
/// de-duplication), and the trust store file written after it.
///
/// Each input gets a fresh store. Invariants: anchors added have distinct ids; a store that
/// accepted them opens again from its file with the same anchors (the JSON file round-trips
/// whatever certificate the parser accepted); refusals carry a code and a message.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzAnchorsPEM(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let text = Fuzz.text(UnsafeRawBufferPointer(start: data, count: size))
    scratch.reset()
    let path = scratch.file("trust.json")
    guard let store = try? TrustStore(path: path) else {
        Fuzz.check(false, "an empty trust store did not open")
        return 0
    }
    do {
        let added = try store.addAnchors(pem: text, hosts: hosts)
        Fuzz.check(!added.isEmpty, "addAnchors accepted input and added nothing")
        Fuzz.check(Set(added.map(\.id)).count == added.count, "the same anchor returned twice")
        for anchor in added {
            _ = (anchor.applies(to: "a.corp.test"), anchor.applies(to: "other.test"))
        }
        do {
            let reopened = try TrustStore(path: path)
            Fuzz.check(reopened.anchors() == store.anchors(), "the anchors read back differ from those added")
        } catch {
            Fuzz.check(false, "the store written after adding anchors does not open: \(error)")
        }
    } catch {
        Fuzz.check(!error.code.isEmpty && !error.description.isEmpty, "a refusal without a code or message")
    }
    return 0
}

private let scratch = ScratchDirectory(label: "fuzz-anchors-pem")
// A literal that parses.
private let hosts = [try! HostPattern(parsing: "*.corp.test")]
