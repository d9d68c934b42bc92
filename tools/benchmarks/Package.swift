// swift-tools-version: 6.1
// Benchmarks of FleetTokenStore, kept out of the main build: `./run` builds and runs them.

import PackageDescription

let package = Package(
    name: "FleetTokenBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "FleetTokenStore", path: "../.."),
        .package(url: "https://github.com/ordo-one/package-benchmark", from: "1.38.0", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        // The bare-route baseline of the token API: the same server framework as token-agent's.
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.0.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
        // The Fleet Engine proxy's figures: HTTP/2 clients and the upstream stand-in.
        .package(url: "https://github.com/apple/swift-nio-http2", from: "1.46.0"),
        // The raw baseline of the PostgreSQL figures: the client the repository is built on.
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.0"),
    ],
    targets: [
        // Fixtures shared by the benchmarks and the measurements: stores, tokens, the raw SQLite baseline.
        .target(
            name: "BenchmarkSupport",
            dependencies: [
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/BenchmarkSupport"
        ),
        // package-benchmark suites: hit path, persistence, purge, start-up, each beside its baseline.
        .executableTarget(
            name: "TokenStoreBenchmarks",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "Benchmark", package: "package-benchmark"),
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Benchmarks/TokenStoreBenchmarks",
            plugins: [.plugin(name: "BenchmarkPlugin", package: "package-benchmark")]
        ),
        // Whole-process figures: concurrency, idle CPU, memory per key, reader stalls, throughput.
        .executableTarget(
            name: "token-store-measurements",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "FleetTokenHTTP", package: "FleetTokenStore"),
                .product(name: "DevTokenIssuer", package: "FleetTokenStore"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/Measurements"
        ),
        // The token API of a release token-agent process over its Unix socket, against a bare
        // route; the agent's start-up, memory and request coalescing. Prints JSON like the above.
        .executableTarget(
            name: "token-api-measurements",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "DevTokenIssuer", package: "FleetTokenStore"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/APIMeasurements"
        ),
        // The Fleet Engine proxy of a release token-agent against the same calls sent straight to
        // an upstream stand-in in the tool, gRPC and REST; calls per second at 64 callers.
        .executableTarget(
            name: "fleet-engine-proxy-measurements",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "DevTokenIssuer", package: "FleetTokenStore"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
            ],
            path: "Sources/ProxyMeasurements"
        ),
        // The baseline server: one Hummingbird route answering a constant body, with the token
        // API's server settings, on a Unix socket.
        .executableTarget(
            name: "token-api-bare-route",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/BareRoute"
        ),
        // The hit ratio's figure: hit and baseline in alternating blocks, median of the rounds' ratios.
        .executableTarget(
            name: "token-store-hit-pair",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
            ],
            path: "Sources/HitPair"
        ),
        // The persist ratio's figure: repository and raw upserts in alternating blocks, median
        // of the rounds' ratios.
        .executableTarget(
            name: "token-store-persist-pair",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
            ],
            path: "Sources/PersistPair"
        ),
        // The encrypted start-up figure: starts with a key on 100,000 and 1,000 sealed rows in
        // alternating order, median of the rounds' ratios.
        .executableTarget(
            name: "token-store-startup-pair",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
            ],
            path: "Sources/StartupPair"
        ),
        // The PostgreSQL figures against a server given by --url: the repository's upserts
        // against raw postgres-nio (alternating blocks) and fetches per key per lifetime of
        // three engines on one database. Prints JSON like the above.
        .executableTarget(
            name: "token-store-postgres-measurements",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "FleetTokenPostgres", package: "FleetTokenStore"),
                .product(name: "FleetTokenStoreTesting", package: "FleetTokenStore"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/PostgresMeasurements"
        ),
        // Lifecycle figures: close() with a pending integrity check and beside a reader, and a
        // release token-agent's `--once` on the leases of a killed agent. Prints JSON like the above.
        .executableTarget(
            name: "token-store-lifecycle-measurements",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "DevTokenIssuer", package: "FleetTokenStore"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Sources/LifecycleMeasurements"
        ),
        // One path in a loop, for counting its instructions under valgrind's callgrind.
        .executableTarget(
            name: "token-store-profile",
            dependencies: [
                "BenchmarkSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
            ],
            path: "Sources/Profile"
        ),
    ],
    swiftLanguageModes: [.v6]
)
