import AuthBrokerCore
import NIOHTTP1
import Testing

@Suite("BrokerDirectives")
struct BrokerDirectivesTests {
    @Test(
        "Authbroker-Interactive: seconds from 1 to 600 or yes; anything else is no wait",
        arguments: [
            ("30", 30), (" 600\t", 600), ("1", 1), ("yes", 120), ("YES", 120), ("true", 120), ("?1", 120), ("3 0", 30),
            ("0", nil), ("601", nil), ("-5", nil), ("", nil), ("no", nil), ("1.5", nil), ("+10", 10),
            ("99999999999999999999999", nil), ("٣", nil),
        ] as [(String, Int?)]
    )
    func interactiveWait(value: String, seconds: Int?) {
        #expect(BrokerDirectives.interactiveWait(value) == seconds.map { .seconds($0) })
    }

    @Test(
        "Authbroker-Debug: keylog among comma-separated tokens, any case; anything else is no key log",
        arguments: [
            ("keylog", true), ("KeyLog", true), ("trace, keylog", true), (" keylog ,x", true), ("\tkeylog", true),
            ("", false), ("keylogs", false), ("key log", true), ("nokeylog", false), ("keylog=1", false), (",,,", false),
        ] as [(String, Bool)]
    )
    func debugKeyLog(value: String, logged: Bool) {
        #expect(BrokerDirectives(headers: HTTPHeaders([("Authbroker-Debug", value)])).keyLog == logged)
    }

    @Test("the last of each field wins, names are case-insensitive, persist is lower-cased, other fields are ignored")
    func lastWins() {
        let headers = HTTPHeaders([
            ("Authbroker-Identity", "old"), ("AUTHBROKER-IDENTITY", "laptop"),
            ("Authbroker-Interactive", "30"), ("authbroker-interactive", "never"),
            ("Authbroker-Persist", "SESSION"),
            ("Authbroker-Unknown", "x"), ("Identity", "not-a-directive"),
        ])
        #expect(
            BrokerDirectives(headers: headers)
                == BrokerDirectives(identity: "laptop", interactiveWait: nil, persist: "session")
        )
        #expect(BrokerDirectives(headers: HTTPHeaders()) == BrokerDirectives())
    }
}
