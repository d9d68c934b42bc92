// A caller's connection is idle when nothing moves on it and none of its calls is waiting for
// an answer: a call waiting on Fleet Engine (or on a retry: two upstream attempts and a fetch)
// longer than the idle timeout keeps its connection. The idle timeout was once shorter than a
// retried call's longest wait, and such a call lost its connection before its answer.

import _CryptoExtras
@testable import FleetEngineProxy
import FleetTokenService
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import NIOCore
import Synchronization
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("Fleet Engine proxy: idle connections", .paced)
struct ProxyIdleTests {
    @Test("a call waiting on Fleet Engine longer than the idle timeout keeps its connection and gets its answer; a connection with nothing waiting is closed")
    func waitingCallIsNotIdle() async throws {
        let scratch = Scratch()
        var logger = Logger(label: "proxy-idle-test")
        logger.logLevel = .warning
        let signing = try _RSA.Signing.PrivateKey(keySize: .bits2048)
        let fetcher = ScriptedFetcher { key, _ in
            FetchedToken(value: try! ProxyCallPathTests.signed(TestJWT.make(for: key, issuedAt: Date()), with: signing))
        }
        let store = try SQLiteTokenRepository(path: scratch.file("tokens.sqlite"), logger: logger)
        defer { store.close() }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger)
        let api = TokenAPI(engine: engine, configuration: .init(allowList: .init(patterns: [try SubjectAllowList.Pattern(parsing: "vehicle:*")]),
                                                                readinessSubjects: []), logger: logger)
        let fake = try FakeFleetEngine(publicKeyPEM: signing.publicKey.pemRepresentation)
        try await fake.start()
        defer { fake.close() }
        // Fleet Engine answers after five idle timeouts.
        fake.delayAnswers(by: .milliseconds(1_500))
        let proxy = try FleetEngineProxy(api: api, configuration: .init(endpoint: try FleetEngineEndpoint(parsing: fake.url)), logger: logger)
        let port = Mutex(0)
        let service = FleetEngineProxyService(proxy: proxy, addresses: [.tcp(host: "127.0.0.1", port: 0)], idleTimeout: .milliseconds(300),
                                              logger: logger, onListening: { address in
                                                  if case .tcp(_, let bound) = address { port.withLock { $0 = bound } }
                                              })

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await engine.run() }
            group.addTask { try await service.run() }
            var bound = 0
            for _ in 0..<1_000 where bound == 0 {
                try await Task.sleep(for: .milliseconds(10))
                bound = port.withLock { $0 }
            }
            try #require(bound != 0, "the proxy did not listen")
            let endpoint = RawHTTP.Endpoint.tcp(port: bound)
            let host = "127.0.0.1:\(bound)"

            let started = ContinuousClock.now
            // Off the cooperative pool: the proxy's fetch on a miss runs a task there.
            let answer = try await offCooperativePool {
                try RawHTTP.send(endpoint, "GET", "/v1/providers/p/vehicles/v-1", host: host,
                                 headers: [("x-goog-api-client", "gl-python/3.11 grpc/1.60")], timeout: 15)
            }
            #expect(answer.status == 200, "\(answer)")
            #expect(ContinuousClock.now - started >= .milliseconds(1_500), "the answer came after Fleet Engine's delay")
            #expect(fake.calls.count == 1 && fake.calls.first?.resource == "providers/p/vehicles/v-1", "\(fake.calls)")

            // A connection with nothing waiting: closed once idle (well before 5 s).
            let idle = RawHTTP.openIdle(endpoint)
            try #require(idle >= 0)
            defer { close(idle) }
            var poll = pollfd(fd: idle, events: Int16(POLLIN), revents: 0)
            #expect(Glibc.poll(&poll, 1, 5_000) == 1, "the idle connection was not closed")
            var byte: UInt8 = 0
            #expect(recv(idle, &byte, 1, 0) == 0, "closed without a byte")
            group.cancelAll()
        }
    }
}
