// Cancelling run() (issue 27 item 6): leaving the scope that runs the engine is a cancellation,
// and what was fetched must still reach the store and the leases be released, within a bound.

import FleetTokenStoreTesting
import Foundation
import Logging
import ServiceLifecycle
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// Fetches that ignore cancellation until the test lets them go (a client stuck in a call).
private final class StuckFetches: Sendable {
    private let waiters = Mutex<[CheckedContinuation<Void, Never>]?>([])

    /// Waits until ``release()``; cancellation does not end the wait.
    func wait() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = waiters.withLock { waiters -> Bool in
                guard waiters != nil else { return true }
                waiters!.append(continuation)
                return false
            }
            if now { continuation.resume() }
        }
    }

    var count: Int { waiters.withLock { $0?.count ?? 0 } }

    func release() {
        let all = waiters.withLock { waiters -> [CheckedContinuation<Void, Never>] in
            defer { waiters = nil }
            return waiters ?? []
        }
        all.forEach { $0.resume() }
    }
}

@Suite("Cancelling run()", .paced, .serialized)
struct CancelledRunTests {
    let key = try! TokenKey.vehicle("fetched-before-cancel")

    @Test("run() cancelled while a fetched token's commit waits for another process's lock: once the lock goes 0.5 s later, the token is in the store and no lease is left")
    func cancelWritesPending() async throws {
        let h = try LockedStoreHarness(busyTimeout: 3)
        defer { h.store.close() }
        let running = h.start()
        #expect(await eventually(within: 30) { await h.engine.isRunning })
        let events = StreamRecorder(h.engine.events())
        let shell = try SQLiteShell(path: h.path)
        defer { shell.quit() }
        let fetched = try await h.fetchBehindLock(key, shell: shell)
        // The first write gave up on the lock; the next attempt waits on the test clock.
        #expect(await eventually(within: 60) { events.elements.contains(where: \.isStoreDegraded) }, "\(events.elements)")

        running.cancel()
        shell.send(".shell sleep 0.5\nCOMMIT;\n")
        let ended = EndFlag()
        Task { _ = try? await running.value; ended.set() }
        #expect(await eventually(within: 60) { ended.isSet }, "run() did not return after its cancellation")
        #expect(await h.stored(key) == fetched, "the token fetched before the cancellation is not in the store")
        _ = try shell.execute("SELECT 1;") // the shell has let go
        #expect(try await LeaseRows(h.path).count == 0, "a refresh lease was left held")
    }

    @Test("the README's embedding: a ServiceGroup run with async let, its scope left while a commit waits for another process's lock; the token is in the store once the lock goes")
    func leavingTheScopeWritesPending() async throws {
        let h = try LockedStoreHarness(busyTimeout: 3)
        defer { h.store.close() }
        let events = StreamRecorder(h.engine.events())
        let shell = try SQLiteShell(path: h.path)
        defer { shell.quit() }
        var fetched: StoredToken?
        do {
            let group = ServiceGroup(services: [h.engine], gracefulShutdownSignals: [], logger: Logger(label: "group"))
            async let running: Void = group.run()
            #expect(await eventually(within: 30) { await h.engine.isRunning })
            fetched = try await h.fetchBehindLock(key, shell: shell)
            #expect(await eventually(within: 60) { events.elements.contains(where: \.isStoreDegraded) }, "\(events.elements)")
            shell.send(".shell sleep 0.5\nCOMMIT;\n")
            // Leaving the scope cancels `running` and waits for it.
        }
        #expect(await h.stored(key) == fetched, "the token fetched before leaving the scope is not in the store")
    }

    @Test("a shutdown that cannot finish (a fetch ignoring cancellation, the store locked throughout) gives up within its bound and names what it did not write")
    func shutdownIsBounded() async throws {
        let stuck = StuckFetches()
        let stuckKey = try TokenKey.vehicle("stuck")
        let time = TestTime()
        let fetcher = ScriptedFetcher { key, _ in
            if key == stuckKey { await stuck.wait() }
            return FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now))
        }
        let h = try LockedStoreHarness(busyTimeout: 0.5, time: time, fetcher: fetcher)
        defer { h.store.close() }
        let running = h.start()
        #expect(await eventually(within: 30) { await h.engine.isRunning })
        let events = StreamRecorder(h.engine.events())
        let shell = try SQLiteShell(path: h.path)
        defer { shell.quit() }
        _ = try shell.execute("BEGIN IMMEDIATE;")
        _ = try await h.engine.token(for: key)
        #expect(await eventually(within: 60) { events.elements.contains(where: \.isStoreDegraded) }, "\(events.elements)")
        let asking = Task { try? await h.engine.token(for: stuckKey) }
        #expect(await eventually(within: 30) { stuck.count == 1 })

        let started = ContinuousClock.now
        running.cancel()
        let ended = EndFlag()
        Task { _ = try? await running.value; ended.set() }
        let returned = await eventually(within: 60) { ended.isSet }
        #expect(returned, "run() did not return within 20 s of its cancellation (its shutdown waits without a bound)")
        if returned { #expect(ContinuousClock.now - started < .seconds(15)) }
        let warnings = h.log.entries.filter { $0.level >= .warning }.map { "\($0.message) \($0.metadata)" }
        #expect(warnings.contains { $0.contains("not written") && $0.contains(key.description) }, "\(warnings)")

        stuck.release()
        _ = await asking.value
        _ = try shell.execute("COMMIT;")
        _ = await eventually(within: 60) { ended.isSet }
    }
}
