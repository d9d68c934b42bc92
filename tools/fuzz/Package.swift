// swift-tools-version: 6.1
// libFuzzer harnesses for FleetTokenStore, kept out of the main build: `./run` builds them with
// `--sanitize=fuzzer` into this folder's own `.build` and runs each for a bounded time.

import PackageDescription

/// The root package's strict settings (Swift 6 mode is the package default).
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("MemberImportVisibility"),
]

let package = Package(
    name: "FleetTokenFuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "FleetTokenStore", path: "../.."),
    ],
    targets: [
        // Property checks and input helpers shared by the harnesses.
        .target(
            name: "FuzzSupport",
            swiftSettings: strictSettings
        ),
        // One executable per target; each has a single source file without top-level code, so
        // SwiftPM compiles it with -parse-as-library and libFuzzer supplies `main`.
        .executableTarget(
            name: "fuzz-provider-response",
            dependencies: [
                "FuzzSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "FleetTokenHTTPSyntax", package: "FleetTokenStore"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "fuzz-jwt-claims",
            dependencies: [
                "FuzzSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "fuzz-proxy-settings",
            dependencies: [
                "FuzzSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "FleetTokenHTTPSyntax", package: "FleetTokenStore"),
            ],
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "fuzz-body-template",
            dependencies: [
                "FuzzSupport",
                .product(name: "FleetTokenStore", package: "FleetTokenStore"),
                .product(name: "FleetTokenHTTPSyntax", package: "FleetTokenStore"),
            ],
            swiftSettings: strictSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
