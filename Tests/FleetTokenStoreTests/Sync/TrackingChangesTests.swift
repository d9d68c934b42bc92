// The engine's tracking changes (trackingChanges()), which the file sink follows: told once a
// change has taken effect, and only for a change (a reload calls track and untrack every time).

import FleetTokenStoreTesting
import Foundation
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Tracking changes, told once they have taken effect", .paced)
struct TrackingChangesTests {
    @Test("track() tells once the stored tokens of the keys it added are loaded, untrack() once it removed some; calls that change nothing tell nothing")
    func toldForChangesOnly() async throws {
        let time = TestTime()
        let store = InMemoryTokenRepository()
        let v1 = try TokenKey.vehicle("v-1"), v2 = try TokenKey.vehicle("v-2")
        let now = time.now
        try await store.upsert([StoredToken(key: v2, value: TestJWT.make(for: v2, issuedAt: now, lifetime: 3600), expiresAt: now + 3600,
                                            issuedAt: now, fetchedAt: now)], clearFailure: true)
        let engine = TokenSyncEngine(repository: store, fetcher: ScriptedFetcher.minting(time), logger: LogRecorder().logger,
                                     clock: time.clock, now: time.wall)
        // Each value with whether v-2's stored token was in memory when it was read.
        let told = Mutex<[(keys: Set<TokenKey>, v2Held: Bool)]>([])
        let changes = engine.trackingChanges()
        let reader = Task {
            for await change in changes { told.withLock { $0.append((change.keys, engine.heldToken(for: v2) != nil)) } }
        }
        defer { reader.cancel() }

        await engine.track([v1, v2])
        #expect(await eventually(within: 30) { told.withLock { $0.count } == 1 })
        #expect(told.withLock { $0.first?.keys } == [v1, v2])
        #expect(told.withLock { $0.first?.v2Held } == true, "told after the stored token was loaded")

        // What a reload that changed no subject does: nothing to tell. Any value would be in the
        // stream already when these calls return; the wait gives the reader time to take it.
        await engine.track([v1])
        await engine.untrack([try TokenKey.vehicle("never-tracked")])
        await engine.track([])
        await engine.untrack([])
        try await Task.sleep(for: .milliseconds(200))
        #expect(told.withLock { $0.count } == 1, "calls that changed nothing told \(told.withLock { $0.count - 1 }) times")

        await engine.untrack([v1])
        #expect(await eventually(within: 30) { told.withLock { $0.count } == 2 })
        #expect(told.withLock { $0.last?.keys } == [v2])
    }
}
