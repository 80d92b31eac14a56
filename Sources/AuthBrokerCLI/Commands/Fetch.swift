import ArgumentParser
import AuthBrokerCore
import Foundation
import NIOCore
import NIOHTTP1

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

            var body = BrokerRequestBody.none
            var bodyDescriptor: CInt?
            var framing: (name: String, value: String)?
            if let dataFile {
                let (descriptor, length) = try LocalFile.openForReading(dataFile)
                bodyDescriptor = descriptor
                body = .file(descriptor: descriptor, length: length)
                framing = length.map { ("Content-Length", String($0)) } ?? ("Transfer-Encoding", "chunked")
            }
            defer { if let bodyDescriptor, bodyDescriptor != STDIN_FILENO { close(bodyDescriptor) } }

            let methodName = try method.map(MethodName.validate) ?? (dataFile == nil ? "GET" : "POST")
            let head = HTTPRequestHead(
                version: .http1_1, method: HTTPMethod(rawValue: methodName), uri: target.absoluteForm,
                headers: Self.requestHeaders(target: target, user: userHeaders, framing: framing)
            )
            let printer = ResponsePrinter(
                url: target.absoluteForm, outputPath: output, include: include, fail: fail
            )
            try await client.execute(head, body: body) { responseHead, responseBody in
                try await printer.handle(responseHead, &responseBody)
            }
        }
    }

    /// `Host` from the URL (RFC 9112 §3.2.2), curl's defaults unless the user set them, the
    /// user's headers in order, the body framing, and `Connection: close` (one request per run).
    static func requestHeaders(
        target: FetchTarget, user: [HeaderLine], framing: (name: String, value: String)?
    ) -> HTTPHeaders {
        var headers = HTTPHeaders()
        headers.add(name: "Host", value: target.origin.hostHeader)
        let names = Set(user.map { $0.name.lowercased() })
        if !names.contains("user-agent") { headers.add(name: "User-Agent", value: "authbrokerctl/\(AuthBrokerCtl.version)") }
        if !names.contains("accept") { headers.add(name: "Accept", value: "*/*") }
        for header in user { headers.add(name: header.name, value: header.value) }
        if let framing { headers.add(name: framing.name, value: framing.value) }
        headers.add(name: "Connection", value: "close")
        return headers
    }
}

/// Where a fetched response goes: broker errors to stderr as an explanation, the origin's
/// response (optionally with its head) to the output, chunk by chunk.
struct ResponsePrinter: Sendable {
    let url: String
    let outputPath: String?
    let include: Bool
    let fail: Bool

    /// Largest problem+json body read to explain a broker error.
    static let maxProblemBytes = 1024 * 1024

    func handle(_ head: HTTPResponseHead, _ body: inout BrokerResponseBody) async throws {
        switch BrokerErrorDetection.classify(head) {
        case .brokerError(let error, let details):
            let (buffer, complete) = try await body.collect(upTo: Self.maxProblemBytes)
            let problem =
                (complete ? BrokerErrorDetection.brokerProblem(in: buffer.readableBytesView) : nil)
                ?? HumanFormat.syntheticProblem(
                    error: ProxyErrorType(rawValue: error) ?? .proxyInternalError, status: Int(head.status.code), details: details,
                    requestID: head.headers.first(name: "Authbroker-Request-Id")
                )
            throw brokerFailure(problem)
        case .brokerProblem:
            let (buffer, complete) = try await body.collect(upTo: Self.maxProblemBytes)
            let problem =
                (complete ? BrokerErrorDetection.brokerProblem(in: buffer.readableBytesView) : nil)
                ?? HumanFormat.syntheticProblem(
                    error: .proxyInternalError, status: Int(head.status.code),
                    details: head.headers.first(name: BrokerHeaders.error),
                    requestID: head.headers.first(name: "Authbroker-Request-Id")
                )
            throw brokerFailure(problem)
        case .origin:
            break
        }

        if fail, head.status.code >= 400 {
            throw CLIError.plain(
                .httpError, "\(HumanFormat.sanitized(url)) returned HTTP \(head.status.code) \(HumanFormat.sanitized(head.status.reasonPhrase))"
            )
        }

        let descriptor = try outputPath.map(LocalFile.openForWriting) ?? STDOUT_FILENO
        defer { if descriptor != STDOUT_FILENO { close(descriptor) } }
        if include { try await LocalFile.write(Self.renderHead(head), to: descriptor) }
        while let chunk = try await body.next() {
            try await LocalFile.write(chunk, to: descriptor)
        }
    }

    private func brokerFailure(_ problem: ProblemDetails) -> CLIError {
        CLIError(
            CLIExitCode.forProblem(problem),
            HumanFormat.problem(problem, context: "cannot fetch \(HumanFormat.sanitized(url))", now: Date())
        )
    }

    /// The status line and header section as they would appear on the wire, as `curl -i` prints them.
    static func renderHead(_ head: HTTPResponseHead) -> ByteBuffer {
        var buffer = ByteBuffer()
        buffer.writeString("HTTP/\(head.version.major).\(head.version.minor) \(head.status.code) \(head.status.reasonPhrase)\r\n")
        for (name, value) in head.headers { buffer.writeString("\(name): \(value)\r\n") }
        buffer.writeString("\r\n")
        return buffer
    }
}
