// swift-tools-version: 6.2
// FleetTokenStore: a persistent, offline-capable store of Fleet Engine authorization tokens.

import PackageDescription

/// Strict settings for every library and executable target: Swift 6 mode is the package
/// default; these add checks that keep the public surface honest.
let strictSettings: [SwiftSetting] = [
    .enableUpcomingFeature("ExistentialAny"),
    .enableUpcomingFeature("InternalImportsByDefault"),
    .enableUpcomingFeature("MemberImportVisibility"),
]
let testSettings: [SwiftSetting] = [.enableUpcomingFeature("ExistentialAny")]

let package = Package(
    name: "FleetTokenStore",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "FleetTokenStore", targets: ["FleetTokenStore"]),
        .library(name: "FleetTokenHTTP", targets: ["FleetTokenHTTP"]),
        .library(name: "FleetTokenHTTPSyntax", targets: ["FleetTokenHTTPSyntax"]),
        .library(name: "FleetTokenService", targets: ["FleetTokenService"]),
        .library(name: "FleetEngineProxy", targets: ["FleetEngineProxy"]),
        .library(name: "DevTokenIssuer", targets: ["DevTokenIssuer"]),
        .library(name: "FleetTokenStoreTesting", targets: ["FleetTokenStoreTesting"]),
        .library(name: "FleetTokenPostgres", targets: ["FleetTokenPostgres"]),
        .executable(name: "token-agent", targets: ["token-agent"]),
        .executable(name: "dev-token-server", targets: ["dev-token-server"]),
        .executable(name: "tokenctl", targets: ["tokenctl"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-crypto", "4.1.0"..<"6.0.0"),
        .package(url: "https://github.com/apple/swift-collections", from: "1.1.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.0"),
        // The Fleet Engine proxy: gRPC and REST callers over HTTP/2 (prior knowledge) and
        // HTTP/1.1 on one listener, and its HTTP/2 connection to Fleet Engine (gRPC's status is
        // in trailers, which AsyncHTTPClient does not expose).
        .package(url: "https://github.com/apple/swift-nio-http2", from: "1.46.0"),
        // The proxy's CONNECT tunnel to Fleet Engine through a forward proxy.
        .package(url: "https://github.com/apple/swift-nio-extras", from: "1.35.0"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.0"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.0"),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.0"),
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.8.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.0"),
        .package(url: "https://github.com/apple/swift-http-types", from: "1.0.0"),
        // token-agent's config file, environment and reload; YAML through Yams (also used
        // directly, for line numbers in messages).
        .package(url: "https://github.com/apple/swift-configuration", from: "1.4.0", traits: ["JSON", "YAML", "Reloading"]),
        .package(url: "https://github.com/jpsim/Yams", from: "6.2.0"),
        .package(url: "https://github.com/apple/swift-system", from: "1.4.0"),
        // The PostgreSQL repository (FleetTokenPostgres only: the core and SQLite do not link it).
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.0"),
        // `swift package generate-documentation` for the DocC catalogs.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.4.0"),
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
                .embedInCode("V0003__value_key_id.sql"),
                .embedInCode("V0004__failure_configuration_digest.sql"),
                .embedInCode("postgres/V0001__postgres_tokens_leases_notify.sql"),
                .embedInCode("postgres/V0002__postgres_value_key_id.sql"),
                .embedInCode("postgres/V0003__postgres_failure_configuration_digest.sql"),
            ],
            swiftSettings: strictSettings
        ),
        // The library agents embed: model, SQLite storage, sync engine. No HTTP dependency.
        .target(
            name: "FleetTokenStore",
            dependencies: [
                "FleetTokenMigrations",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "HeapModule", package: "swift-collections"),
            ],
            swiftSettings: strictSettings
        ),
        // What a provider's configuration says, read without I/O: proxy settings and NO_PROXY,
        // host and IP syntax, percent encoding, request body templates, the answer's format,
        // strict JSON. Apart from the client so that the fuzz harnesses (tools/fuzz) build it
        // without the HTTP stack; FleetTokenHTTP re-exports it.
        .target(
            name: "FleetTokenHTTPSyntax",
            dependencies: ["FleetTokenStore"],
            swiftSettings: strictSettings
        ),
        // The HTTP provider client, separate so the core stays lean.
        .target(
            name: "FleetTokenHTTP",
            dependencies: [
                "FleetTokenStore",
                "FleetTokenHTTPSyntax",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOFoundationCompat", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                // ConfigurationDigester's SHA-256.
                .product(name: "Crypto", package: "swift-crypto"),
            ],
            swiftSettings: strictSettings
        ),
        // The local token API an embedder serves beside its engine (Hummingbird): routes, access
        // rules, listeners and connection caps. token-agent's own parts are TokenAgentRuntime.
        .target(
            name: "FleetTokenService",
            dependencies: [
                "FleetTokenStore",
                // The HTTP-date of the `Date` header.
                "FleetTokenHTTPSyntax",
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HTTPTypes", package: "swift-http-types"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        // The Fleet Engine proxy an embedder (or token-agent) serves beside the token API: one
        // listener for gRPC and REST callers, the token of the resource each call names, one
        // HTTP/2 connection to Fleet Engine. Its own target, so the token API alone does not
        // link HTTP/2.
        .target(
            name: "FleetEngineProxy",
            dependencies: [
                "FleetTokenStore",
                "FleetTokenService",
                "FleetTokenHTTP",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOExtras", package: "swift-nio-extras"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "CoreMetrics", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: strictSettings
        ),
        // The PostgreSQL repository, for replicas on several hosts sharing one database. Its own
        // target and product, so the core and the SQLite-only tools do not link postgres-nio.
        .target(
            name: "FleetTokenPostgres",
            dependencies: [
                "FleetTokenStore",
                "FleetTokenMigrations",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        // The test kit, for embedders' tests and this package's own (as swift-log's
        // InMemoryLogging): test time, a scripted fetcher, a JWT builder, a log recorder and a
        // secret scanner.
        .target(
            name: "FleetTokenStoreTesting",
            dependencies: [
                "FleetTokenStore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "InMemoryLogging", package: "swift-log"),
            ],
            swiftSettings: strictSettings
        ),
        // The version, the git revision built from and the Swift version, for the executables'
        // `--version` and token-agent's build_info gauge. The plugin writes the revision at
        // build time (git rev-parse in the package directory; "unknown" without git).
        .target(
            name: "BuildStamp",
            swiftSettings: strictSettings,
            plugins: ["BuildStampPlugin"]
        ),
        .plugin(name: "BuildStampPlugin", capability: .buildTool()),
        // The development issuer, usable in-process (demo mode, tests) and standalone.
        .target(
            name: "DevTokenIssuer",
            dependencies: [
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "tools/dev-token-server/Sources/DevTokenIssuer",
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "dev-token-server",
            dependencies: [
                "BuildStamp",
                "DevTokenIssuer",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "tools/dev-token-server/Sources/dev-token-server",
            swiftSettings: strictSettings
        ),
        // What only token-agent uses beside the token API: its log handler, the systemd
        // notifier, the subjects file and the file sinks. Internal to the package (no product).
        .target(
            name: "TokenAgentRuntime",
            dependencies: [
                "FleetTokenStore",
                "FleetTokenService",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            path: "tools/token-agent/Sources/TokenAgentRuntime",
            swiftSettings: strictSettings
        ),
        // token-agent's environment as tokenctl reads it too: which source sets an option
        // (TOKEN_AGENT_DB before TOKEN_STORE_DB) and a list variable split as the agent splits it.
        .target(
            name: "AgentVariables",
            dependencies: [.product(name: "Configuration", package: "swift-configuration")],
            path: "tools/token-agent/Sources/AgentVariables",
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "token-agent",
            dependencies: [
                "BuildStamp",
                "AgentVariables",
                "TokenAgentRuntime",
                "FleetTokenStore",
                "FleetTokenHTTP",
                "FleetTokenService",
                "FleetEngineProxy",
                "FleetTokenPostgres",
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Metrics", package: "swift-metrics"),
                "DevTokenIssuer",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "UnixSignals", package: "swift-service-lifecycle"),
                .product(name: "Configuration", package: "swift-configuration"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "SystemPackage", package: "swift-system"),
            ],
            path: "tools/token-agent/Sources/token-agent",
            swiftSettings: strictSettings
        ),
        .executableTarget(
            name: "tokenctl",
            dependencies: [
                "BuildStamp",
                "AgentVariables",
                "FleetTokenStore",
                "FleetTokenPostgres",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                // The agent's config file (`tokenctl --config`).
                .product(name: "Yams", package: "Yams"),
            ],
            path: "tools/tokenctl",
            swiftSettings: strictSettings
        ),
        // A helper process for tests of several processes sharing one store.
        .executableTarget(
            name: "token-engine-probe",
            dependencies: [
                "FleetTokenStore",
                "FleetTokenStoreTesting",
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/EngineProbe"
        ),
        // Test support shared by the test targets, with the repository contract every store runs.
        .target(
            name: "TestSupportKit",
            dependencies: [
                "FleetTokenStore",
                "FleetTokenStoreTesting",
                "FleetTokenHTTP",
                // TransportKit: the TLS token server, the CONNECT proxy and the test PKI, used by
                // FleetTokenHTTPTests and by the agent's transport tests in AgentOperationsTests.
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                // FleetEngineKit: the fake Fleet Engine (HTTP/2, RS256 JWTs, the method table).
                "FleetTokenService",
                .product(name: "NIOHTTP2", package: "swift-nio-http2"),
                .product(name: "NIOHPACK", package: "swift-nio-http2"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            path: "Tests/TestSupportKit",
            swiftSettings: testSettings
        ),
        // A test VFS simulating power loss as SQLite's crash tests do (tests only; see its header).
        .target(
            name: "PowerLossVFS",
            dependencies: [.product(name: "GRDBSQLite", package: "GRDB.swift")],
            path: "Tests/PowerLossVFS"
        ),
        .testTarget(
            name: "FleetTokenStoreTests",
            dependencies: [
                "TestSupportKit",
                "PowerLossVFS",
                "FleetTokenStoreTesting",
                "FleetTokenStore",
                "FleetTokenMigrations",
                "token-engine-probe",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            resources: [.copy("Fixtures")],
            swiftSettings: testSettings
        ),
        .testTarget(
            name: "FleetTokenHTTPTests",
            dependencies: [
                "TestSupportKit",
                "FleetTokenStoreTesting",
                "FleetTokenHTTP",
                "FleetTokenHTTPSyntax",
                "FleetTokenStore",
                "DevTokenIssuer",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
            ],
            swiftSettings: testSettings
        ),
        .testTarget(
            name: "TokenServiceTests",
            dependencies: [
                "TestSupportKit",
                "FleetTokenStoreTesting",
                "FleetTokenService",
                "TokenAgentRuntime",
                "FleetTokenStore",
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ],
            swiftSettings: testSettings
        ),
        .testTarget(
            name: "FleetEngineProxyTests",
            dependencies: [
                "TestSupportKit",
                "FleetTokenStoreTesting",
                "FleetEngineProxy",
                "FleetTokenService",
                "FleetTokenStore",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "MetricsTestKit", package: "swift-metrics"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
            ],
            swiftSettings: testSettings
        ),
        .testTarget(
            name: "EndToEndTests",
            dependencies: [
                "TestSupportKit",
            ],
            swiftSettings: testSettings
        ),
        // The PostgreSQL repository against a real server: a private cluster each test process
        // starts (initdb + pg_ctl, as an unprivileged user) and stops.
        .testTarget(
            name: "FleetTokenPostgresTests",
            dependencies: [
                "TestSupportKit",
                "FleetTokenStoreTesting",
                "FleetTokenStore",
                "FleetTokenPostgres",
                "FleetTokenMigrations",
                "tokenctl",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Logging", package: "swift-log"),
            ],
            swiftSettings: testSettings
        ),
        // Every test that starts token-agent processes, with the one agent fixture: the daemon
        // (config file, environment, reload, systemd notify and watchdog, JSON logs), its token
        // API, its stores (SQLite and PostgreSQL) and its transport; all through real processes.
        .testTarget(
            name: "AgentOperationsTests",
            dependencies: [
                "BuildStamp",
                "TestSupportKit",
                "FleetTokenStoreTesting",
                "FleetTokenStore",
                "FleetTokenService",
                "TokenAgentRuntime",
                "FleetTokenPostgres",
                "token-agent",
                "dev-token-server",
                "tokenctl",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                "DevTokenIssuer",
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "_CryptoExtras", package: "swift-crypto"),
                .product(name: "JWTKit", package: "jwt-kit"),
            ],
            swiftSettings: testSettings
        ),
    ],
    swiftLanguageModes: [.v6]
)
