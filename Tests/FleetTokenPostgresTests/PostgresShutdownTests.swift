// Cancelling run() on PostgreSQL (issue 27 item 6): every call's wait there throws at once in a
// cancelled task, so a shutdown run in the cancelled task itself released no lease and other
// hosts waited for the lease to expire (30 s).

import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("Cancelling an engine's run() on PostgreSQL", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresShutdownTests {
    let logger = Logger(label: "shutdown")

    @Test("run() cancelled while its flight holds a refresh lease: another host takes the lease at once, not after it expires")
    func cancelReleasesLeases() async throws {
        let (_, _, configuration) = try await freshDatabase()
        let fetcher = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
        let key = try TokenKey.vehicle("leased")
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { first in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { second in
                let engine = TokenSyncEngine(repository: first, fetcher: fetcher, logger: logger)
                let running = Task { try await engine.run() }
                #expect(await eventually(within: 30) { await engine.isRunning })
                fetcher.close()
                let asking = Task { try? await engine.token(for: key) }
                // The flight holds the key's lease while its fetch waits.
                #expect(await eventually(within: 30) { fetcher.waitingAtGate == 1 })
                let seen = try await second.acquireRefreshLease(for: key, holder: "other-host", now: Date(), duration: 30)
                guard case .heldElsewhere = seen else {
                    Issue.record("the engine's flight did not hold the lease: \(seen)")
                    return
                }

                running.cancel()
                let ended = EndFlag()
                Task { _ = try? await running.value; ended.set() }
                #expect(await eventually(within: 60) { ended.isSet }, "run() did not return after its cancellation")
                _ = await asking.value
                let answer = try await second.acquireRefreshLease(for: key, holder: "other-host", now: Date(), duration: 30)
                if case .acquired = answer {} else {
                    Issue.record("another host cannot take the lease after run() was cancelled: \(answer)")
                }
                fetcher.open()
            }
        }
    }
}
