import AuthBrokerCore
import FuzzSupport

/// Fuzzes the configuration file reader: the TOML subset (`TOMLSubset`) and the settings built
/// from it (`BrokerSettings.parse`), with `BrokerSettings.load`'s UTF-8 rule in front.
///
/// Invariants: an error's line is a line of the input; the one-line `file:line: key: message`
/// form holds no line break or other control character (it goes to a terminal and the journal);
/// every key of a parsed document has a line; settings parse again to the same values.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzConfig(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: data, count: size)
    // `load(path:)` refuses a file that is not UTF-8 before parsing.
    guard let text = String(validating: bytes, as: UTF8.self) else { return 0 }
    let lineCount = bytes.reduce(1) { $0 + ($1 == 0x0A ? 1 : 0) }

    do {
        let document = try TOMLSubset.parse(text)
        for (table, values) in document.tables {
            for key in values.keys {
                Fuzz.check(document.line(of: key, in: table).map { (1...lineCount).contains($0) } == true, "no line for \(table).\(key)")
            }
        }
    } catch {
        Fuzz.check((1...lineCount).contains(error.line), "TOML error on line \(error.line) of \(lineCount)")
        Fuzz.check(isOneLine(error.message), "TOML error message is not one printable line")
    }

    do {
        let settings = try BrokerSettings.parse(text, file: "config.toml")
        let again = try? BrokerSettings.parse(text, file: "config.toml")
        Fuzz.check(again == settings, "parsing the same text twice gave different settings")
    } catch {
        if let line = error.line {
            Fuzz.check((1...lineCount).contains(line), "config error on line \(line) of \(lineCount)")
        }
        Fuzz.check(isOneLine(error.description), "config error is not one printable line: \(error.code)")
    }
    return 0
}

/// No C0 control character or DEL: the message prints as one line.
private func isOneLine(_ text: String) -> Bool {
    !text.unicodeScalars.contains { $0.value < 0x20 || $0.value == 0x7F }
}
