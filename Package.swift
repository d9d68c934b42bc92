// swift-tools-version: 6.1
// FleetTokenStore: a persistent, offline-capable store of Fleet Engine authorization tokens.

import PackageDescription

/// Strict settings for every target of ours: Swift 6 mode is the package default; these add
/// checks that keep the public surface honest.
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "FleetTokenStore",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "FleetTokenStore", targets: ["FleetTokenStore"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-crypto", "4.1.0"..<"6.0.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
        .package(url: "https://github.com/pointfreeco/swift-clocks", from: "1.1.1"),
    ],
    targets: [
        // The schema: numbered SQL files compiled into the binary, so a deployed agent reads no
        // schema file at run time.
        .target(
            name: "FleetTokenMigrations",
            path: "Migrations",
            exclude: ["README.md"],
            resources: [
                .embedInCode("V0001__create_tokens.sql"),
                .embedInCode("V0002__leases_and_change_log.sql"),
            ],
            swiftSettings: strictSettings
        ),
        .target(
            name: "FleetTokenStore",
            dependencies: [
                "FleetTokenMigrations",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "HeapModule", package: "swift-collections"),
            ],
            swiftSettings: strictSettings
        ),
        // A helper process for tests of several processes sharing one store.
        .executableTarget(
            name: "token-engine-probe",
            dependencies: [
                "FleetTokenStore",
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/EngineProbe"
        ),
        .testTarget(
            name: "FleetTokenStoreTests",
            dependencies: [
                "FleetTokenStore",
                "token-engine-probe",
                "FleetTokenMigrations",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Clocks", package: "swift-clocks"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            resources: [.copy("Fixtures")],
            swiftSettings: [.enableUpcomingFeature("ExistentialAny")]
        ),
    ],
    swiftLanguageModes: [.v6]
)
