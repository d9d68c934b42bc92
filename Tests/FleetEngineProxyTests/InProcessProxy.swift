// The Fleet Engine proxy in process, as its tests set it up: a real SQLite store, an engine whose
// scripted provider signs each token with a key a fake Fleet Engine trusts, the token API
// allowing `vehicle:*`, the fake, and the proxy in front of it; and the proxy's service on a
// loopback listener.

import _CryptoExtras
@testable import FleetEngineProxy
import FleetTokenService
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import CoreMetrics
import Logging
import NIOCore
import ServiceLifecycle
import Synchronization
import TestSupportKit
import Testing

struct InProcessProxy: Sendable {
    let scratch: Scratch
    let logger: Logger
    let fetcher: ScriptedFetcher
    let store: SQLiteTokenRepository
    let engine: TokenSyncEngine
    let fake: FakeFleetEngine
    let proxy: FleetEngineProxy

    /// A rig whose `number`th fetch (from 1) mints a token issued at `issuedAt(number)`; the
    /// proxy counts through `metrics` and, given `log`, logs there.
    static func make(label: String, issuedAt: @escaping @Sendable (Int) -> Date = { _ in Date() },
                     metrics: any MetricsFactory = MetricsSystem.factory, log: LogRecorder? = nil,
                     requestBodyBudget: Int? = nil) async throws -> InProcessProxy {
        let scratch = Scratch()
        var logger = log?.logger ?? Logger(label: label)
        if log == nil { logger.logLevel = .warning }
        let signing = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let fetcher = ScriptedFetcher { key, number in
            FetchedToken(value: try! ProxyCallPathTests.signed(TestJWT.make(for: key, issuedAt: issuedAt(number)), with: signing))
        }
        let store = try SQLiteTokenRepository(path: scratch.file("tokens.sqlite"), logger: logger)
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger)
        let api = TokenAPI(engine: engine, configuration: .init(allowList: .init(patterns: [try SubjectAllowList.Pattern(parsing: "vehicle:*")]),
                                                                readinessSubjects: []), logger: logger)
        let fake = try FakeFleetEngine(publicKeyPEM: signing.publicKey.pemRepresentation)
        do {
            try await fake.start()
            var configuration = FleetEngineProxy.Configuration(endpoint: try FleetEngineEndpoint(parsing: fake.url))
            if let requestBodyBudget { configuration.requestBodyBudget = requestBodyBudget }
            let proxy = try FleetEngineProxy(api: api, configuration: configuration, logger: logger, metricsFactory: metrics)
            return InProcessProxy(scratch: scratch, logger: logger, fetcher: fetcher, store: store, engine: engine, fake: fake, proxy: proxy)
        } catch {
            fake.close()
            store.close()
            throw error
        }
    }

    /// Closes the proxy's upstream connections, the fake and the store.
    func close() {
        proxy.upstream.close()
        fake.close()
        store.close()
    }

    /// Runs the engine and the proxy's service on 127.0.0.1 (`idleTimeout` for its connections)
    /// while `body` runs with the port bound.
    func withService(idleTimeout: TimeAmount = FleetEngineProxyService.idleTimeout,
                     _ body: @Sendable (Int) async throws -> Void) async throws {
        try await withServiceGroup(idleTimeout: idleTimeout) { port, _ in try await body(port) }
    }

    /// As ``withService(idleTimeout:_:)``, the engine and the service in a `ServiceGroup` that
    /// `body` gets too (to start a graceful shutdown); cancelled after `body` unless it ended.
    func withServiceGroup(idleTimeout: TimeAmount = FleetEngineProxyService.idleTimeout,
                          _ body: @Sendable (Int, ServiceGroup) async throws -> Void) async throws {
        let port = Mutex(0)
        let service = FleetEngineProxyService(proxy: proxy, addresses: [.tcp(host: "127.0.0.1", port: 0)], idleTimeout: idleTimeout,
                                              logger: logger, onListening: { address in
                                                  if case .tcp(_, let bound) = address { port.withLock { $0 = bound } }
                                              })
        let services = ServiceGroup(configuration: .init(services: [engine, service], logger: logger))
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await services.run() }
            var bound = 0
            for _ in 0..<1_000 where bound == 0 {
                try await Task.sleep(for: .milliseconds(10))
                bound = port.withLock { $0 }
            }
            try #require(bound != 0, "the proxy did not listen")
            try await body(bound, services)
            group.cancelAll()
        }
    }
}
