import ArgumentParser
import AuthBrokerCore
import Foundation

/// `authbrokerctl pins ...`: SPKI pins.
struct Pins: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List, add and remove public-key pins.",
        discussion: """
            A pin requires a host's certificate chain to contain a key with the given SHA-256 \
            SubjectPublicKeyInfo digest (base64, as curl's --pinnedpubkey sha256//...). \
            'authbrokerctl anchors trust-server URL' shows it as "key pin" for each \
            certificate a server presents (answer N to the question to change nothing).

            Examples:
              authbrokerctl pins list
              PIN='YLh1dUR9y6Kja30RrAn7JKnbQG/uEtLMkBgFF2Fuihg='
              authbrokerctl pins add api.example.com "$PIN"
              authbrokerctl pins remove api.example.com "$PIN"
            """,
        subcommands: [List.self, Add.self, Remove.self]
    )

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "List your pins.",
            discussion: """
                Examples:
                  authbrokerctl pins list
                  authbrokerctl pins list --json
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions

        func run() async throws {
            try await CommandRunner.run {
                let api = ControlAPI(client: try connection.client())
                let (list, raw) = try await api.call("GET", "/v1/pins", context: "cannot list pins", as: PinList.self)
                if output.json { Console.out(raw) } else { Console.out(HumanFormat.pinsTable(list.pins)) }
            }
        }
    }

    /// HOST and SPKI_SHA256, checked before anything is sent.
    struct PinArguments: ParsableArguments {
        @Argument(help: ArgumentHelp("Host pattern (example.com, *.example.com, 192.0.2.1).", valueName: "host"))
        var host: String

        @Argument(help: ArgumentHelp("Base64 SHA-256 of the SubjectPublicKeyInfo (a sha256// prefix is accepted).", valueName: "spki-sha256"))
        var spki: String

        func validate() throws {
            _ = try parsed()
        }

        func parsed() throws -> (host: String, spki: String) {
            do {
                _ = try HostPattern(parsing: host)
            } catch {
                throw ValidationError(error.message)
            }
            do {
                return (host, try SPKIPin.normalize(spki))
            } catch let error as InputError {
                throw ValidationError(error.message)
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Pin a host to a public key.",
            discussion: """
                Example:
                  PIN='YLh1dUR9y6Kja30RrAn7JKnbQG/uEtLMkBgFF2Fuihg='
                  authbrokerctl pins add api.example.com "$PIN"
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions
        @OptionGroup var pin: PinArguments

        func run() async throws {
            try await CommandRunner.run {
                let (host, spki) = try pin.parsed()
                let api = ControlAPI(client: try connection.client())
                let request = try AddPinRequest(host: host, spkiSHA256: spki).brokerJSON()
                let (added, raw) = try await api.call("POST", "/v1/pins", json: request, context: "cannot add pin", as: AddedPin.self)
                if output.json {
                    Console.out(raw)
                } else {
                    Console.out("Pinned \(HumanFormat.sanitized(added.pin.host)) to key sha256//\(HumanFormat.sanitized(added.pin.spkiSHA256))")
                }
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a pin.",
            discussion: """
                Example:
                  authbrokerctl pins remove api.example.com "$PIN"

                Exits 8 when there is no such pin.
                """
        )

        @OptionGroup var connection: ConnectionOptions
        @OptionGroup var output: OutputOptions
        @OptionGroup var pin: PinArguments

        func run() async throws {
            try await CommandRunner.run {
                let (host, spki) = try pin.parsed()
                let api = ControlAPI(client: try connection.client())
                let path = "/v1/pins?host=\(QueryEncoding.encode(host))&spki_sha256=\(QueryEncoding.encode(spki))"
                let (removed, raw) = try await api.call("DELETE", path, context: "cannot remove pin", as: RemovedPin.self)
                if output.json {
                    Console.out(raw)
                } else {
                    Console.out("Removed pin of \(HumanFormat.sanitized(removed.removed.host)) to key sha256//\(HumanFormat.sanitized(removed.removed.spkiSHA256))")
                }
            }
        }
    }
}

/// Percent-encoding of a query value: everything but RFC 3986 unreserved characters, so a
/// base64 `+`, `/` or `=` arrives intact.
package enum QueryEncoding {
    package static func encode(_ value: String) -> String {
        var out = ""
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.unicodeScalars.append(Unicode.Scalar(byte))
            default:
                out += String(format: "%%%02X", byte)
            }
        }
        return out
    }
}
