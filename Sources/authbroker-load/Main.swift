import ArgumentParser
import Foundation
import Histogram
import NIOCore
import NIOPosix
import NIOSSL

/// A bounded HTTP/1.1 load generator for `scripts/bench`: keep-alive or one connection per
/// request, over TCP or a Unix socket, origin-form or absolute-form targets, every response checked.
@main
struct AuthBrokerLoad: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "authbroker-load",
        abstract: "Drive HTTP/1.1 load at a server or proxy for a fixed time or request count, then report.",
        discussion: """
            Examples:
              authbroker-load --url http://127.0.0.1:8080/64k --connections 32 --duration 5
              authbroker-load --unix-socket /tmp/ab.sock --absolute-form --url https://bench.test:8443/100b
              authbroker-load --url http://127.0.0.1:8080/1g --stream --rss-pid 1234
            """)

    @Option(help: "The URL to fetch (http or https).")
    var url: String

    @Option(help: "Connect to this Unix socket instead of the URL's host.")
    var unixSocket: String?

    @Option(help: "Connect to this HOST:PORT instead of the URL's host (a proxy).")
    var connect: String?

    @Flag(help: "Send the whole URL as the request target (proxy form); otherwise only its path.")
    var absoluteForm = false

    @Flag(help: "Through the --connect proxy with CONNECT, then TLS inside (https URLs): what programs honouring https_proxy do.")
    var tunnel = false

    @Option(help: "Connections (simulated clients) at once.")
    var connections = 1

    @Option(help: "Seconds to measure for (after the warm-up).")
    var duration = 5.0

    @Option(help: "Total requests instead of a duration, split evenly over the connections.")
    var requests: Int?

    @Option(help: "Seconds of untimed warm-up before measuring (duration mode).")
    var warmup = 0.5

    @Flag(help: "Open a new connection for every request (Connection: close); latency includes connect.")
    var newConnectionPerRequest = false

    @Flag(help: "One streamed request; report throughput. The body is counted, never kept.")
    var stream = false

    @Option(help: "Hold this many connections open and idle (after one request each), then report --rss-pid.")
    var holdIdle: Int?

    @Option(help: "Seconds to hold idle connections before measuring memory.")
    var holdSeconds = 2.0

    @Option(help: "Expected status of every response.")
    var expectStatus: UInt = 200

    @Option(help: "Expected body length of every response (default: learned from the first).")
    var expectLength: Int?

    @Option(help: "CA certificate file (PEM) that signs the server's certificate (direct HTTPS).")
    var cacert: String?

    @Option(help: "Event loop threads of the load generator.")
    var threads = 1

    @Option(help: "Report this process's CPU time per 1000 requests (repeatable: the times are added).")
    var cpuPid: [Int32] = []

    @Option(help: "Sample this process's resident memory (VmRSS) during the run.")
    var rssPid: Int32?

    @Option(help: "Give up on the whole run after this many seconds.")
    var timeout = 120.0

    @Option(help: "Errors after which a connection's worker stops.")
    var maxErrors = 1000

    @Flag(help: "Print the report as JSON.")
    var json = false

    func validate() throws {
        guard connections >= 1, connections <= 100_000 else {
            throw ValidationError("--connections must be 1 to 100000")
        }
        guard duration > 0, duration <= 3600, warmup >= 0, warmup <= 600, timeout > 0, timeout <= 7200 else {
            throw ValidationError("--duration, --warmup or --timeout is out of range")
        }
        if let requests, requests < connections {
            throw ValidationError("--requests must be at least --connections")
        }
        if let holdIdle, holdIdle < 1 || holdIdle > 100_000 {
            throw ValidationError("--hold-idle must be 1 to 100000")
        }
        guard (1...64).contains(threads) else { throw ValidationError("--threads must be 1 to 64") }
        if unixSocket != nil && connect != nil {
            throw ValidationError("--unix-socket and --connect are exclusive")
        }
        if tunnel && (connect == nil || absoluteForm || !url.lowercased().hasPrefix("https://")) {
            throw ValidationError("--tunnel needs --connect (the proxy), an https URL, and no --absolute-form")
        }
    }

    func run() async throws {
        let target = try TargetURL(url)
        let mode: LoadPlan.Mode =
            stream ? .stream : holdIdle != nil ? .holdIdle : newConnectionPerRequest ? .newConnectionPerRequest : .keepAlive
        let connectionCount = mode == .stream ? 1 : holdIdle ?? connections

        let address: SocketAddress
        if let unixSocket {
            address = try SocketAddress(unixDomainSocketPath: unixSocket)
        } else if let connect {
            let (host, port) = try TargetURL.splitHostPort(connect)
            address = try SocketAddress.makeAddressResolvingHost(host, port: port)
        } else {
            address = try SocketAddress.makeAddressResolvingHost(target.host, port: target.port)
        }

        var tls: NIOSSLContext?
        if target.scheme == "https" && !absoluteForm {
            var configuration = TLSConfiguration.makeClientConfiguration()
            if let cacert {
                configuration.trustRoots = .certificates(try NIOSSLCertificate.fromPEMFile(cacert))
            }
            tls = try NIOSSLContext(configuration: configuration)
        }

        let now = NIODeadline.now()
        let timed = mode == .keepAlive || mode == .newConnectionPerRequest
        let warm = timed && requests == nil ? warmup : 0
        let measureStart = now + .nanoseconds(Int64(warm * 1e9))
        let plan = LoadPlan(
            mode: mode,
            address: address,
            requestTarget: absoluteForm ? target.absolute : target.path,
            hostHeader: target.authority,
            tls: tls,
            serverHostname: target.isIPAddress ? nil : target.host,
            tunnelAuthority: tunnel ? "\(target.host):\(target.port)" : nil,
            connections: connectionCount,
            requestsPerWorker: timed ? requests.map { $0 / connectionCount } : 1,
            measureStart: measureStart,
            measureEnd: measureStart + .nanoseconds(Int64(duration * 1e9)),
            hardDeadline: now + .nanoseconds(Int64(timeout * 1e9)),
            expectedStatus: expectStatus,
            expectedLength: expectLength,
            maxErrorsPerWorker: maxErrors)

        let group = MultiThreadedEventLoopGroup(numberOfThreads: threads)
        let sampler = rssPid.map { ResidentSampler(pid: $0) }
        // With a warm-up, the "before" reading is taken when measuring starts.
        var cpuBefore: Double? = warm > 0 ? nil : ProcessProbe.cpuMilliseconds(pids: cpuPid)

        let runStart = NIODeadline.now()
        var results: [WorkerResult] = []
        var cpuDuringWarmup: Task<Double?, Never>?
        if warm > 0 {
            let pids = cpuPid
            cpuDuringWarmup = Task {
                try? await Task.sleep(for: .nanoseconds((measureStart - NIODeadline.now()).nanoseconds))
                return ProcessProbe.cpuMilliseconds(pids: pids)
            }
        }
        // Idle connections open in batches, so the server's accept backlog is never overrun.
        let batchSize = mode == .holdIdle ? 64 : connectionCount
        var opened = 0
        while opened < connectionCount {
            let batch = min(batchSize, connectionCount - opened)
            var futures: [EventLoopFuture<WorkerResult>] = []
            for _ in 0..<batch {
                let loop = group.next()
                let promise = loop.makePromise(of: WorkerResult.self)
                loop.execute { Worker(loop: loop, plan: plan, done: promise).start() }
                futures.append(promise.futureResult)
            }
            for future in futures { results.append(try await future.get()) }
            opened += batch
        }
        let runEnd = NIODeadline.now()
        if let cpuDuringWarmup { cpuBefore = await cpuDuringWarmup.value }
        let cpuAfter = ProcessProbe.cpuMilliseconds(pids: cpuPid)

        var held: [any Channel] = results.compactMap(\.heldChannel)
        if mode == .holdIdle {
            try await Task.sleep(for: .nanoseconds(Int64(holdSeconds * 1e9)))
        }
        let rss = await sampler?.finish()
        for channel in held { try? await channel.close() }
        let heldCount = held.count
        held.removeAll()
        try await group.shutdownGracefully()

        var total = WorkerResult()
        for result in results { total.merge(result) }
        let measuredStart = max(measureStart, runStart)
        let seconds = Double((runEnd - measuredStart).nanoseconds) / 1e9
        var report = LoadReport(
            mode: mode.rawValue,
            target: plan.requestTarget,
            address: unixSocket.map { "unix:\($0)" } ?? "\(address)",
            connections: connectionCount,
            seconds: seconds,
            requests: total.requests,
            requestsPerSecond: seconds > 0 ? Double(total.requests) / seconds : 0,
            bytes: total.bytes,
            errors: total.errors,
            reconnects: total.reconnects,
            latency: total.latency.totalCount > 0 ? LoadReport.Latency(total.latency) : nil,
            cpu: nil,
            rss: rss,
            stream: nil,
            heldConnections: mode == .holdIdle ? heldCount : nil)
        if let cpuBefore, let cpuAfter, !cpuPid.isEmpty {
            let used = cpuAfter - cpuBefore
            report.cpu = LoadReport.CPU(
                pids: cpuPid, totalMs: used,
                msPer1000Requests: total.requests > 0 ? used * 1000 / Double(total.requests) : 0)
        }
        if mode == .stream, let first = results.first, let nanos = first.transferNanos {
            let streamSeconds = Double(nanos) / 1e9
            report.stream = LoadReport.Stream(
                bytes: first.bytes, seconds: streamSeconds,
                mibPerSecond: Double(first.bytes) / 1_048_576 / streamSeconds,
                firstByteMs: first.firstByteNanos.map { Double($0) / 1e6 })
        }
        print(json ? try report.json() : report.text())
        if total.errors.total > 0 || total.requests == 0 {
            throw ExitCode(1)
        }
    }
}

/// The parts of an `http` or `https` URL the load generator needs.
struct TargetURL {
    var scheme: String
    var host: String
    var port: Int
    var path: String
    var authority: String
    var absolute: String

    var isIPAddress: Bool { host.contains(":") || host.allSatisfy { $0.isNumber || $0 == "." } }

    init(_ text: String) throws {
        guard let separator = text.range(of: "://") else { throw ValidationError("--url must be http:// or https://") }
        scheme = text[..<separator.lowerBound].lowercased()
        guard scheme == "http" || scheme == "https" else { throw ValidationError("--url must be http:// or https://") }
        let rest = text[separator.upperBound...]
        let slash = rest.firstIndex(of: "/") ?? rest.endIndex
        authority = String(rest[..<slash])
        path = slash == rest.endIndex ? "/" : String(rest[slash...])
        absolute = text
        let defaultPort = scheme == "https" ? 443 : 80
        if authority.hasPrefix("[") || authority.contains(":") {
            (host, port) = try Self.splitHostPort(authority, defaultPort: defaultPort)
        } else {
            (host, port) = (authority, defaultPort)
        }
        guard !host.isEmpty else { throw ValidationError("--url has no host") }
    }

    /// Splits `host:port` or `[v6]:port`; the brackets are removed.
    static func splitHostPort(_ text: String, defaultPort: Int? = nil) throws -> (String, Int) {
        let host: Substring
        let portText: Substring?
        if text.hasPrefix("["), let close = text.firstIndex(of: "]") {
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            portText = after.hasPrefix(":") ? after.dropFirst() : nil
        } else if let colon = text.lastIndex(of: ":") {
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        } else {
            host = Substring(text)
            portText = nil
        }
        guard let port = portText.flatMap({ Int($0) }) ?? defaultPort, (1...65535).contains(port) else {
            throw ValidationError("\(text): expected HOST:PORT")
        }
        return (String(host), port)
    }
}
