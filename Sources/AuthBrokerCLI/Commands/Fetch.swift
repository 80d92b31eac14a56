import ArgumentParser
import AuthBrokerClient
import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `authbrokerctl fetch URL`: a curl-like client of the data plane.
struct Fetch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Fetch a URL through the daemon, like curl.",
        discussion: """
            Sends `METHOD URL HTTP/1.1` (absolute form) over the daemon's socket and streams \
            the response body to stdout or --output. The daemon decides TLS trust and answers \
            authentication challenges; when it cannot fetch, authbrokerctl explains why on \
            stderr and says how to fix it.

            Examples:
              authbrokerctl fetch https://git.internal.test/api/health
              authbrokerctl fetch -i https://example.com/
              authbrokerctl fetch -X PUT -H 'Content-Type: application/json' \\
                  -d item.json https://api.internal.test/items/1
              tar c dir | authbrokerctl fetch -d - https://backup.internal.test/dir.tar
              authbrokerctl fetch --fail -o image.iso https://mirror.test/image.iso

            Exit codes: 3 daemon not running, 4 server certificate not trusted, 5 cannot reach \
            the server, 6 upstream or protocol error, 7 request rejected by the broker, \
            22 HTTP status 400 or more with --fail.
            """
    )

    @OptionGroup var connection: ConnectionOptions

    @Argument(help: "The http:// or https:// URL to fetch.")
    var url: String

    @Option(
        name: [.customShort("X"), .customLong("request")],
        help: ArgumentHelp("The request method. Default: GET, or POST with --data-file.", valueName: "method")
    )
    var method: String?

    @Option(
        name: [.customShort("H"), .customLong("header")],
        help: ArgumentHelp("A request header, 'Name: value'. Repeatable.", valueName: "header")
    )
    var headers: [String] = []

    @Option(
        name: [.customShort("d"), .customLong("data-file")],
        help: ArgumentHelp("Send this file as the request body ('-' for stdin), streamed.", valueName: "path")
    )
    var dataFile: String?

    @Option(
        name: [.customShort("o"), .customLong("output")],
        help: ArgumentHelp("Write the body to this file instead of stdout.", valueName: "path")
    )
    var output: String?

    @Flag(name: [.customShort("i"), .customLong("include")], help: "Print the status line and headers before the body.")
    var include = false

    @Flag(name: .customLong("fail"), help: "Exit 22, printing no body, when the server answers with a status of 400 or more.")
    var fail = false

    func validate() throws {
        do {
            _ = try FetchTarget(parsing: url)
            if let method { _ = try MethodName.validate(method) }
            for header in headers { _ = try HeaderLine(parsing: header) }
        } catch let error as InputError {
            throw ValidationError(error.message)
        }
        if dataFile == "" { throw ValidationError("--data-file needs a path, or '-' for stdin") }
        if output == "" { throw ValidationError("--output needs a path") }
    }

    func run() async throws {
        try await CommandRunner.run {
            let client = try connection.client()
            let target = try FetchTarget(parsing: url)
            let userHeaders = try headers.map { try HeaderLine(parsing: $0) }
            // Foundation's URL percent-encodes what RFC 3986 does not allow (`{`, `|`, ...); the
            // rest of the target goes as the daemon's own parser accepted it.
            guard let requestURL = URL(string: target.absoluteForm) else {
                throw CLIError.plain(.badRequest, "'\(HumanFormat.sanitized(url))' cannot be sent as a URL")
            }

            var body = BrokerRequestBody.empty
            var bodyDescriptor: CInt?
            if let dataFile {
                let (descriptor, length) = try LocalFile.openForReading(dataFile)
                bodyDescriptor = descriptor
                // With a length: Content-Length; from a pipe: chunked (the library frames it).
                body = .stream(LocalFile.Chunks(descriptor: descriptor, length: length), length: length.map { Int($0) })
            }
            defer { if let bodyDescriptor, bodyDescriptor != STDIN_FILENO { close(bodyDescriptor) } }

            let methodName = try method.map(MethodName.validate) ?? (dataFile == nil ? "GET" : "POST")
            let request = BrokerRequest(url: requestURL, method: methodName, headers: Self.requestHeaders(user: userHeaders), body: body)
            let printer = ResponsePrinter(url: target.absoluteForm, outputPath: output, include: include, fail: fail)
            try await ControlAPI(client: client).mappingErrors(context: "cannot fetch \(HumanFormat.sanitized(target.absoluteForm))") {
                try await printer.print(try await client.send(request))
            }
        }
    }

    /// curl's defaults unless the user set them, then the user's headers in order. The library
    /// adds `Host` from the URL (RFC 9112 §3.2.2), the body framing and `Connection: close`.
    static func requestHeaders(user: [HeaderLine]) -> BrokerHeaders {
        var headers = BrokerHeaders()
        let names = Set(user.map { $0.name.lowercased() })
        if !names.contains("user-agent") { headers.add("User-Agent", "authbrokerctl/\(AuthBrokerCtl.version)") }
        if !names.contains("accept") { headers.add("Accept", "*/*") }
        for header in user { headers.add(header.name, header.value) }
        return headers
    }
}

/// Where a fetched response goes: the origin's response (optionally with its head) to the
/// output, chunk by chunk. The daemon's own failures never get here: the library throws them.
struct ResponsePrinter: Sendable {
    let url: String
    let outputPath: String?
    let include: Bool
    let fail: Bool

    func print(_ response: BrokerResponse) async throws {
        if fail, response.status >= 400 {
            response.body.cancel()
            throw CLIError.plain(
                .httpError, "\(HumanFormat.sanitized(url)) returned HTTP \(response.status) \(HumanFormat.sanitized(response.head.reasonPhrase))"
            )
        }

        let descriptor = try outputPath.map(LocalFile.openForWriting) ?? STDOUT_FILENO
        defer { if descriptor != STDOUT_FILENO { close(descriptor) } }
        if include { try await LocalFile.write(Self.renderHead(response.head), to: descriptor) }
        for try await chunk in response.body {
            try await LocalFile.write(chunk, to: descriptor)
        }
    }

    /// The status line and header section as they would appear on the wire, as `curl -i` prints
    /// them (the daemon always answers HTTP/1.1).
    static func renderHead(_ head: BrokerResponseHead) -> [UInt8] {
        var text = "HTTP/1.1 \(head.status) \(head.reasonPhrase)\r\n"
        for (name, value) in head.headers { text += "\(name): \(value)\r\n" }
        text += "\r\n"
        return Array(text.utf8)
    }
}
