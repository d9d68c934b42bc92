// The engine while another process holds the store's write lock (issue 27 items 4 and 6): an
// invalidation takes effect in memory at once and reaches the store when it can, in order; the
// group commit's loop sleeps while another task writes; cancelling run() still writes what is
// pending, within a bound.

import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// An engine on a real SQLite store whose writes give up on another process's lock after
/// `busyTimeout`, driven by test time.
struct LockedStoreHarness {
    let dir = Scratch()
    let time: TestTime
    let store: SQLiteTokenRepository
    let fetcher: ScriptedFetcher
    let engine: TokenSyncEngine
    let log = LogRecorder()

    var path: String { dir.file("tokens.sqlite") }

    init(busyTimeout: TimeInterval, time: TestTime = TestTime(), fetcher: ScriptedFetcher? = nil) throws {
        self.time = time
        store = try openStore(dir.file("tokens.sqlite")) { $0.busyTimeout = busyTimeout }
        self.fetcher = fetcher ?? .minting(time)
        engine = TokenSyncEngine(repository: store, fetcher: self.fetcher, logger: log.logger, clock: time.clock,
                                 now: time.wall, random: { 0.5 })
    }

    func start() -> Task<Void, any Error> {
        let engine = self.engine
        return Task { try await engine.run() }
    }

    /// Fetches `key` while `shell` takes the store's write lock between the fetch's lease and its
    /// commit (the lease is taken before the lock, so the fetch's only write left is its commit):
    /// the token returned waits behind the lock for its commit.
    func fetchBehindLock(_ key: TokenKey, shell: SQLiteShell) async throws -> StoredToken {
        fetcher.close()
        let engine = self.engine
        let asking = Task { try await engine.token(for: key) }
        #expect(await eventually(within: 30) { fetcher.waitingAtGate == 1 })
        _ = try shell.execute("BEGIN IMMEDIATE;")
        fetcher.open()
        return try await asking.value
    }

    /// The token the store holds for `key` now (nil when none or unreadable).
    func stored(_ key: TokenKey) async -> StoredToken? {
        ((try? await store.entry(for: key)) ?? nil)?.token
    }
}

extension TokenSyncEvent {
    var isStoreDegraded: Bool {
        if case .storeDegraded = self { return true }
        return false
    }
}

@Suite("The engine while another process holds the store's write lock", .paced, .serialized)
struct StoreLockTests {
    let held = try! TokenKey.vehicle("held")
    let pending = try! TokenKey.vehicle("pending")
    let storedOnly = try! TokenKey.vehicle("stored-only")
    let askedAfter = try! TokenKey.vehicle("asked-after")

    @Test("invalidate returns at once while another process holds the write lock with a commit pending; memory never serves the invalidated tokens, and the store drops them once the lock is gone")
    func invalidateWhileLocked() async throws {
        let h = try LockedStoreHarness(busyTimeout: 0.5)
        defer { h.store.close() }
        let running = h.start()
        #expect(await eventually(within: 30) { await h.engine.isRunning })
        let rejected = try await h.engine.token(for: held)
        // Two tokens another process stored: one nobody here asks for, one asked for after its invalidation.
        let otherOnly = token(storedOnly, expiresIn: 3000), otherAsked = token(askedAfter, expiresIn: 3000)
        try await h.store.upsert([otherOnly, otherAsked])
        #expect(await eventually(within: 30) { await h.stored(held) == rejected })
        let events = StreamRecorder(h.engine.events())

        let shell = try SQLiteShell(path: h.path)
        defer { shell.quit() }
        _ = try shell.execute("BEGIN IMMEDIATE;")
        // A fetched token whose commit fails on the lock; its retry is 2 s away on the test clock.
        let waiting = try await h.engine.token(for: pending)
        #expect(await eventually(within: 60) { events.elements.contains(where: \.isStoreDegraded) }, "\(events.elements)")

        var invalidations: [Task<Void, Never>] = []
        for key in [held, storedOnly, askedAfter] {
            let returned = EndFlag()
            invalidations.append(Task { await h.engine.invalidate(key); returned.set() })
            // The lock is held until the test lets it go: a call waiting for it never returns.
            // The bound allows for a task's start with the whole suite on two cores.
            #expect(await eventually(within: 10) { returned.isSet },
                    "invalidate(\(key)) did not return within 10 s while another process held the write lock")
        }
        // In memory at once: the rejected token is not served (a new one is fetched for whoever asks)...
        #expect(h.engine.heldToken(for: held)?.token != rejected)
        #expect(try await h.engine.token(for: held) != rejected)
        // ...and a token the store still holds is not taken from it again.
        #expect(await h.stored(askedAfter) == otherAsked, "the store cannot have been written while locked")
        #expect(try await h.engine.token(for: askedAfter) != otherAsked, "a token invalidated while the store was locked was read back from it")

        _ = try shell.execute("COMMIT;")
        let landed = await eventually(within: 30) {
            await h.time.advance(by: 2) // the commit's retry
            let (one, two, three, four) = (await h.stored(storedOnly), await h.stored(pending), await h.stored(held), await h.stored(askedAfter))
            return one == nil && two == waiting && three.map { $0 != rejected } == true && four.map { $0 != otherAsked } == true
        }
        let (storedOnlyNow, pendingNow) = (await h.stored(storedOnly), await h.stored(pending))
        #expect(landed, "store after the lock: stored-only still held \(storedOnlyNow != nil), pending written \(pendingNow == waiting)")
        for invalidation in invalidations { await invalidation.value }
        running.cancel()
        _ = try? await running.value
    }

    @Test("the removals of keys memory holds no entry for are counted while they wait for the store, and the count falls back to 0 once they are written; a held key's does not count")
    func unheldRemovalsCounted() async throws {
        let h = try LockedStoreHarness(busyTimeout: 0.5)
        defer { h.store.close() }
        let running = h.start()
        #expect(await eventually(within: 30) { await h.engine.isRunning })
        _ = try await h.engine.token(for: held)
        #expect(await eventually(within: 30) { await h.stored(held) != nil })
        #expect(h.engine.removalsWaitingForUnheldSubjects == 0)

        let shell = try SQLiteShell(path: h.path)
        defer { shell.quit() }
        _ = try shell.execute("BEGIN IMMEDIATE;")
        let unheld = try (0..<3).map { try TokenKey.trip("never-held-\($0)") }
        for key in unheld { await h.engine.invalidate(key) }
        #expect(h.engine.removalsWaitingForUnheldSubjects == 3, "\(h.engine.removalsWaitingForUnheldSubjects)")
        // A held key's entry stays (without its token) while its removal waits: not counted.
        await h.engine.invalidate(held)
        #expect(h.engine.holds(held))
        #expect(h.engine.removalsWaitingForUnheldSubjects == 3, "\(h.engine.removalsWaitingForUnheldSubjects)")

        _ = try shell.execute("COMMIT;")
        let drained = await eventually(within: 30) {
            await h.time.advance(by: 2) // the commit's retry
            return h.engine.removalsWaitingForUnheldSubjects == 0
        }
        #expect(drained, "still waiting: \(h.engine.removalsWaitingForUnheldSubjects)")
        running.cancel()
        _ = try? await running.value
    }

    @Test("a token whose commit is under way when its key is invalidated never reaches the store after the removal")
    func invalidationAfterCommitUnderWay() async throws {
        // Without run(): the commit is written by a task of its own, and nothing refetches the key.
        let h = try LockedStoreHarness(busyTimeout: 30)
        defer { h.store.close() }
        let shell = try SQLiteShell(path: h.path)
        defer { shell.quit() }
        let fetched = try await h.fetchBehindLock(held, shell: shell)

        let returned = EndFlag()
        let invalidation = Task { await h.engine.invalidate(held); returned.set() }
        #expect(await eventually(within: 10) { returned.isSet }, "invalidate did not return within 10 s while the key's commit waited for the lock")
        #expect(h.engine.heldToken(for: held) == nil)

        _ = try shell.execute("COMMIT;")
        let removed = await eventually(within: 30) {
            await h.time.advance(by: 2)
            let settled = await h.engine.isSettled
            let stored = await h.stored(held)
            return settled && stored == nil
        }
        let left = await h.stored(held)
        #expect(removed, "the store holds \(left == fetched ? "the invalidated token" : left == nil ? "nothing" : "another token") for the key")
        await invalidation.value
        await h.engine.shutdown()
        #expect(await h.stored(held) == nil, "the invalidated token reached the store after its removal")
    }

    @Test("run()'s commit loop stays idle while another writer retries a locked store (CPU time of a probe process)")
    func commitLoopIdleWhileAnotherWrites() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        try openStore(path).close()
        let probe = productsDirectory.appendingPathComponent("token-engine-probe").path
        let ready = dir.file("ready"), go = dir.file("go")
        let window = 3000
        async let measured = runCapturing([probe, "idle-while-blocked", path, ready, go, "\(window)"], timeout: 60)
        #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: ready) })
        let shell = try SQLiteShell(path: path)
        defer { shell.quit() }
        _ = try shell.execute("BEGIN IMMEDIATE;")
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        let result = try await measured
        _ = try shell.execute("COMMIT;")
        #expect(result.status == 0, "\(result.stderr)")
        let cpu = result.stdout.split(separator: " ").first { $0.hasPrefix("cpu_ms=") }.flatMap { Int($0.dropFirst(7)) }
        let used = try #require(cpu, "no measurement: \(result.stdout) \(result.stderr)")
        // Spinning costs about the whole window (one core); sleeping costs a few milliseconds.
        #expect(used < window / 4, "the engine used \(used) ms of CPU in \(window) ms while a write it did not own waited for the lock")
    }
}
