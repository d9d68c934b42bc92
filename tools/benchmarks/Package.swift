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
