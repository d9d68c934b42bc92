// Issue 13: /readyz and the token route follow the engine's floor on an injected clock (no test
// waits for a token's lifetime), and idle clients do not block new ones. In-process engine and
// API on a real Unix socket and a real SQLite store.

import FleetTokenStoreTesting
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging
import NIOHTTP1
import ServiceLifecycle
import Synchronization
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token API readiness on an injected clock", .paced, .exclusive)
struct ReadinessClockTests {
    @Test("/readyz turns 503 once the provider has failed long enough for the token to pass the floor, and 200 again when it answers")
    func readinessFollowsTheFloor() async throws {
        let scratch = Scratch()
        // Only the wall clock is the test's: it jumps past the soft point and the floor.
        let time = TestTime(start: Date())
        // Opaque tokens valid for an hour from the test's wall clock, or failures when told.
        let opaque: ScriptedFetcher.Answer = { key, _ in
            FetchedToken(value: "opaque-\(key.subjectID)-\(UUID().uuidString)", statedExpiry: time.now.addingTimeInterval(3600))
        }
        let fetcher = ScriptedFetcher(opaque)
        var policy = RefreshPolicy()
        policy.allowOpaqueTokens = true
        let logger = Logger(label: "readiness-test")
        let store = try SQLiteTokenRepository(path: scratch.file("tokens.sqlite"), logger: logger)
        defer { store.close() }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, policy: policy, logger: logger, now: time.wall)
        let key = try TokenKey.vehicle("v-1")
        await engine.track([key])
        let socket = scratch.file("api.sock")
        let api = TokenAPI(engine: engine, configuration: .init(allowList: .init(subjects: [key]), readinessSubjects: [key]), logger: logger)
        let listening = Mutex(false)
        let service = TokenAPIService(api: api, engine: engine, addresses: [.unix(path: socket)], logger: logger,
                                      onListening: { _ in listening.withLock { $0 = true } })
        let group = ServiceGroup(services: [engine, service], logger: logger)
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            try await withAPIClient { client in
                let api = APIClient.unix(socket, client)
                #expect(await eventually(within: 60) { listening.withLock { $0 } })  // liveness only: the suite's start can be slow
                #expect(try await api.send("/v1/token/vehicle/v-1").status == 200)
                #expect(try await api.send("/readyz").status == 200)

                fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: nil) }
                // Past the soft point the held token is still served (and ready) while refreshes fail.
                time.jumpWallClock(by: 3600 * 0.9)
                #expect(try await api.send("/v1/token/vehicle/v-1").status == 200)
                #expect(try await api.send("/readyz").status == 200)
                // Past the floor: nothing usable.
                time.jumpWallClock(by: 3600 * 0.099)
                let ready = try await api.send("/readyz")
                #expect(ready.status == 503)
                #expect(ready.body.contains("vehicle/v-1 has no usable token"), "\(ready.body)")
                #expect(try await api.send("/v1/token/vehicle/v-1").status == 503)

                fetcher.setAnswer(opaque)
                time.jumpWallClock(by: 600)  // past any backoff
                #expect(try await eventually(within: 30) { try await api.send("/v1/token/vehicle/v-1").status == 200 })
                #expect(try await api.send("/readyz").status == 200)
            }
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
        #expect(!FileManager.default.fileExists(atPath: socket))
    }

    @Test("1,000 idle connections do not stop a new client being served")
    func idleConnections() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1"])
        var idle: [Int32] = []
        defer { for descriptor in idle { close(descriptor) } }
        for _ in 0..<1000 {
            let descriptor = try connectUnix(agent.socket)
            idle.append(descriptor)
            // Half of them send an unfinished request head: a slow client.
            if idle.count.isMultiple(of: 2) { _ = "GET /v1/subjects HTTP/1.1\r\nHost: x\r\n".withCString { write(descriptor, $0, strlen($0)) } }
        }
        let status = try await withAPIClient { client in try await APIClient.unix(agent.socket, client).send("/v1/token/vehicle/v-1").status }
        #expect(status == 200)
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }
}

/// A connected Unix stream socket to `path`.
func connectUnix(_ path: String) throws -> Int32 {
    let descriptor = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
    guard descriptor >= 0 else { throw ProcessFailure(message: "socket() failed: \(errno)") }
    let result = withUnixSocketAddress(path) { connect(descriptor, $0, $1) }
    guard result == 0 else {
        close(descriptor)
        throw ProcessFailure(message: "connect(\(path)) failed: \(errno)")
    }
    return descriptor
}
