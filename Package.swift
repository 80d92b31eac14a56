// swift-tools-version:6.0
import PackageDescription

// Upcoming features every target opts into: explicit `any`, and no member visible
// through a module the file did not import itself.
// The Makefile (so CI and `make` builds) sets AUTHBROKER_WARNINGS_AS_ERRORS=1: every target of
// ours, not the dependencies', then builds with warnings as errors, so "no warnings" holds by
// the build, not by review. Only then: SwiftPM refuses unsafe flags in a package used as a
// dependency, and apps depend on this one for AuthBrokerClient.
let warningsAsErrors: [SwiftSetting] =
    Context.environment["AUTHBROKER_WARNINGS_AS_ERRORS"] == "1" ? [.unsafeFlags(["-warnings-as-errors"])] : []
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("MemberImportVisibility"),
] + warningsAsErrors

let package = Package(
    name: "AuthBroker",
    platforms: [.macOS(.v14)],
    products: [
        .executable(name: "authbrokerd", targets: ["authbrokerd"]),
        .executable(name: "authbrokerctl", targets: ["authbrokerctl"]),
        // The only public API: a Swift library for apps that fetch through the daemon.
        .library(name: "AuthBrokerClient", targets: ["AuthBrokerClient"]),
        .executable(name: "authbroker-example", targets: ["authbroker-example"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-nio.git", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-nio-ssl.git", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates.git", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1.git", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-crypto.git", "3.12.3"..<"5.0.0"),
        .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
        // Latency histograms for the benchmark load generator only.
        .package(url: "https://github.com/HdrHistogram/hdrhistogram-swift.git", from: "0.2.0"),
    ],
    targets: [
        // Pure values and state machines, plus the few file and socket-peer checks every target
        // shares (PrivateFiles, SocketPeer); no NIOPosix.
        .target(
            name: "AuthBrokerCore",
            dependencies: [
                "CAuthBrokerSystem",
                "CZlib",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // Server-trust policy and evaluation (swift-certificates), plus the user's trust store.
        .target(
            name: "AuthBrokerTrust",
            dependencies: [
                "AuthBrokerCore",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                // _RSA: the modulus size of an RSA key (already built for X509).
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        // HTTP authentication maths and parsing (RFC 9110 §11, RFC 7617, RFC 7616, RFC 7615):
        // challenge parsing, Basic, Digest, nonce state, attempt policy. No I/O.
        .target(
            name: "AuthBrokerHTTPAuth",
            dependencies: [
                "AuthBrokerCore",
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // libsecret (the Secret Service client library) through a shim of non-variadic helpers.
        .systemLibrary(
            name: "CLibsecret",
            pkgConfig: "libsecret-1",
            providers: [.apt(["libsecret-1-dev"])]
        ),
        // The SecretStore protocol and its backends: the Secret Service and an encrypted file.
        .target(
            name: "AuthBrokerSecrets",
            dependencies: [
                "AuthBrokerCore",
                "CLibsecret",
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        // MIT Kerberos' GSS-API, through a shim of its macros and the few calls made.
        .systemLibrary(
            name: "CGSSAPI",
            pkgConfig: "krb5-gssapi",
            providers: [.apt(["libkrb5-dev"])]
        ),
        // HTTP Negotiate's Kerberos side: SPNEGO contexts and the user's credential, off the
        // event loops (every call may block on the credential cache or the KDC).
        .target(
            name: "AuthBrokerKerberos",
            dependencies: [
                "CGSSAPI",
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // Linux calls Swift cannot reach cleanly (struct ucred needs _GNU_SOURCE).
        .target(name: "CAuthBrokerSystem"),
        // zlib, for CRC32 (the cache's entry checksums): fast where a Swift loop is not.
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"])]),
        // Linux-PAM's application API (libpam).
        .systemLibrary(name: "CPAM", providers: [.apt(["libpam0g-dev"])]),
        // PAM re-authentication before a secret is revealed, and the per-peer grants it gives.
        .target(
            name: "AuthBrokerPAM",
            dependencies: [
                "CPAM",
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        // The daemon: listener, data plane, upstream pool, control API.
        .target(
            name: "AuthBrokerDaemon",
            dependencies: [
                "AuthBrokerCore",
                "AuthBrokerTrust",
                "AuthBrokerHTTPAuth",
                "AuthBrokerKerberos",
                "AuthBrokerPAM",
                "AuthBrokerSecrets",
                "CAuthBrokerSystem",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        // authbrokerctl's logic: commands and their output, over AuthBrokerClient (its one way
        // to the daemon). NIOPosix only for its thread pool, which takes the blocking file I/O.
        .target(
            name: "AuthBrokerCLI",
            dependencies: [
                "AuthBrokerClient",
                "AuthBrokerCore",
                // The password prompt's terminal guard (echo back on a signal).
                "CAuthBrokerSystem",
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strictSettings
        ),
        // The library apps (and authbrokerctl) link: async client, control API, BrokerURLProtocol.
        .target(
            name: "AuthBrokerClient",
            dependencies: [
                "AuthBrokerCore",
                "AuthBrokerHTTPAuth",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // Example app for the README: fetches a URL with each API of AuthBrokerClient.
        .executableTarget(name: "authbroker-example", dependencies: ["AuthBrokerClient"], swiftSettings: strictSettings),
        .executableTarget(
            name: "authbrokerd",
            dependencies: [
                "AuthBrokerDaemon", "AuthBrokerCore",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(name: "authbrokerctl", dependencies: ["AuthBrokerCLI"], swiftSettings: strictSettings),
        // BENCHMARK TOOL, not a product: the load generator `scripts/bench` drives (`make bench`).
        .executableTarget(
            name: "authbroker-load",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                // Only for the direct HTTPS baseline (the load generator's own TLS to the origin).
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Histogram", package: "hdrhistogram-swift"),
            ],
            swiftSettings: strictSettings
        ),
        // BENCHMARK REFERENCE, not a product: the least a SwiftNIO forward proxy does per request.
        .executableTarget(
            name: "authbroker-floor",
            dependencies: [
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        // SOAK TOOL, not a product: `make soak` (scripts/soak) drives the daemon with the test fixtures.
        .executableTarget(
            name: "authbroker-soak",
            dependencies: [
                "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: strictSettings
        ),
        // TEST TOOL, not a product: runs PAM as the (non-root) user it is started as.
        .executableTarget(name: "authbroker-pam-probe", dependencies: ["AuthBrokerPAM"], swiftSettings: strictSettings),

        // Test-only helpers: a PKI made at run time, in-process origin servers, daemon launcher.
        .target(
            name: "TestSupport",
            dependencies: [
                "AuthBrokerCore",
                "AuthBrokerHTTPAuth",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            path: "Tests/TestSupport",
            swiftSettings: strictSettings
        ),
        .testTarget(name: "AuthBrokerCoreTests", dependencies: ["AuthBrokerCore"], swiftSettings: strictSettings),
        .testTarget(
            name: "AuthBrokerHTTPAuthTests",
            dependencies: [
                "AuthBrokerHTTPAuth", "AuthBrokerCore",
                // Truncated SHA-512, to reproduce RFC 7616 §3.9.2's printed numbers.
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AuthBrokerTrustTests",
            dependencies: ["AuthBrokerTrust", "TestSupport", .product(name: "NIOConcurrencyHelpers", package: "swift-nio")],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AuthBrokerSecretsTests",
            dependencies: ["AuthBrokerSecrets", .product(name: "NIOConcurrencyHelpers", package: "swift-nio")],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AuthBrokerDaemonTests",
            dependencies: [
                "AuthBrokerDaemon", "AuthBrokerTrust", "TestSupport",
                // The codes of PAM and secret-store errors, for BrokerErrorCodeMappingTests.
                "AuthBrokerPAM", "AuthBrokerSecrets",
                .product(name: "NIOEmbedded", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AuthBrokerPAMTests",
            dependencies: [
                "AuthBrokerPAM",
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AuthBrokerClientTests",
            dependencies: [
                "AuthBrokerClient", "AuthBrokerCore", "AuthBrokerHTTPAuth", "TestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
            ],
            swiftSettings: strictSettings
        ),
        .testTarget(
            name: "AuthBrokerIntegrationTests",
            dependencies: ["AuthBrokerCore", "TestSupport"],
            // Read by path at run time (the HAR schema for scripts/validate-har).
            exclude: ["Fixtures"],
            swiftSettings: strictSettings
        ),
    ]
)

// FUZZ TARGETS, not products: libFuzzer harnesses (Fuzz/), declared only when scripts/fuzz
// builds them (AUTHBROKER_FUZZ=1, its own scratch path .build-fuzz, `--sanitize=fuzzer`).
// Each has no `main` (libFuzzer's is linked in), so an ordinary `swift build` could not link
// them; and they must be in this package, not a separate one, to reach `package` declarations.
if Context.environment["AUTHBROKER_FUZZ"] == "1" {
    let fuzzTargets: [(name: String, dependencies: [Target.Dependency])] = [
        ("fuzz-auth-challenge", ["AuthBrokerHTTPAuth", "AuthBrokerCore"]),
        ("fuzz-request-target", ["AuthBrokerCore", .product(name: "NIOHTTP1", package: "swift-nio")]),
        ("fuzz-config", ["AuthBrokerCore"]),
        (
            "fuzz-control-api",
            [
                "FuzzDaemonSupport", "AuthBrokerDaemon", "AuthBrokerTrust", "AuthBrokerCore",
                .product(name: "Logging", package: "swift-log"), .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
        ("fuzz-anchors-pem", ["AuthBrokerTrust", "AuthBrokerCore"]),
        (
            "fuzz-identity-import",
            [
                "FuzzDaemonSupport", "AuthBrokerDaemon", "AuthBrokerTrust", "AuthBrokerCore",
                .product(name: "NIOHTTP1", package: "swift-nio"),
            ]
        ),
    ]
    package.targets += [
        .target(
            name: "FuzzSupport",
            path: "Fuzz/Sources/FuzzSupport",
            swiftSettings: strictSettings
        ),
        .target(
            name: "FuzzDaemonSupport",
            dependencies: ["AuthBrokerDaemon", .product(name: "NIOConcurrencyHelpers", package: "swift-nio")],
            path: "Fuzz/Sources/FuzzDaemonSupport",
            swiftSettings: strictSettings
        ),
    ]
    for target in fuzzTargets {
        package.targets.append(
            .executableTarget(
                name: target.name,
                dependencies: target.dependencies + ["FuzzSupport"],
                path: "Fuzz/Sources/\(target.name)",
                swiftSettings: strictSettings
            )
        )
    }
}
