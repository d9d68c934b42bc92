// Following other processes' changes when they come in a burst and when they land before
// run() subscribes: the store change broadcaster, the follower's re-read rule, and an engine on
// a real SQLite store (the PostgreSQL side is in FleetTokenPostgresTests).

import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("StoreChangeBroadcaster: a slow reader misses nothing", .paced)
struct StoreChangeBroadcasterTests {
    let keys = (0..<30).map { try! TokenKey.vehicle("k\($0)") }

    @Test("a reader that keeps up gets every change, in order")
    func itemized() async {
        let broadcaster = StoreChangeBroadcaster(limit: 10)
        var reader = broadcaster.subscribe().makeAsyncIterator()
        broadcaster.emit(contentsOf: keys.prefix(10).map { .upserted($0) })
        for key in keys.prefix(10) { #expect(await reader.next() == .upserted(key)) }
        broadcaster.emit(.removed(keys[10]))
        #expect(await reader.next() == .removed(keys[10]))
    }

    @Test("past the limit unread, one .unknown replaces them and what comes while it waits; later changes are itemized again")
    func overflow() async {
        let broadcaster = StoreChangeBroadcaster(limit: 10)
        var reader = broadcaster.subscribe().makeAsyncIterator()
        var other = broadcaster.subscribe().makeAsyncIterator()
        broadcaster.emit(contentsOf: keys.prefix(8).map { .upserted($0) })
        #expect(await other.next() == .upserted(keys[0]))
        broadcaster.emit(contentsOf: keys[8..<12].map { .removed($0) })
        broadcaster.emit(.upserted(keys[20]))
        #expect(await reader.next() == .unknown)
        broadcaster.emit(.upserted(keys[21]))
        #expect(await reader.next() == .upserted(keys[21]))
        // The other reader had read one: 11 unread were one too many as well; its `.unknown`
        // still waited when keys[21] came, so it covers that one too.
        #expect(await other.next() == .unknown)
        broadcaster.emit(.upserted(keys[22]))
        #expect(await other.next() == .upserted(keys[22]))
        #expect(await reader.next() == .upserted(keys[22]))
    }

    @Test("an .unknown emitted replaces what waits unread")
    func unknownCoalesces() async {
        let broadcaster = StoreChangeBroadcaster(limit: 10)
        var reader = broadcaster.subscribe().makeAsyncIterator()
        broadcaster.emit(contentsOf: [.upserted(keys[0]), .unknown, .removed(keys[1])])
        broadcaster.emit(.unknown)
        broadcaster.finish()
        #expect(await reader.next() == .unknown)
        #expect(await reader.next() == nil)
    }

    @Test("finish: unread changes are still read, then the stream ends; a later subscriber's stream is ended")
    func finish() async {
        let broadcaster = StoreChangeBroadcaster(limit: 10)
        var reader = broadcaster.subscribe().makeAsyncIterator()
        broadcaster.emit(.upserted(keys[0]))
        broadcaster.finish()
        #expect(await reader.next() == .upserted(keys[0]))
        #expect(await reader.next() == nil)
        var late = broadcaster.subscribe().makeAsyncIterator()
        #expect(await late.next() == nil)
        #expect(!broadcaster.hasSubscribers)
    }

    @Test("a waiting reader is woken by the next change; cancelling it ends its stream and unsubscribes it")
    func waitingAndCancelled() async {
        let broadcaster = StoreChangeBroadcaster(limit: 10)
        let received = Task { () -> [TokenStoreChange] in
            var seen: [TokenStoreChange] = []
            for await change in broadcaster.subscribe() { seen.append(change) }
            return seen
        }
        #expect(await eventually(within: 30) { broadcaster.hasSubscribers })
        broadcaster.emit(.upserted(keys[0]))
        received.cancel()
        let seen = await received.value
        #expect(seen.count <= 1)
        #expect(await eventually(within: 30) { !broadcaster.hasSubscribers })
    }

    @Test("a stream dropped unread unsubscribes")
    func dropped() async {
        let broadcaster = StoreChangeBroadcaster(limit: 10)
        do {
            let stream = broadcaster.subscribe()
            #expect(broadcaster.hasSubscribers)
            broadcaster.emit(.upserted(keys[0]))
            _ = stream
        }
        #expect(await eventually(within: 30) { !broadcaster.hasSubscribers })
    }
}

@Suite("PendingReread: what the change follower re-reads", .paced)
struct PendingRereadTests {
    let keys = (0..<5).map { try! TokenKey.trip("t\($0)") }

    @Test("just subscribed: everything held, once")
    func afterSubscribing() {
        var pending = PendingReread.afterSubscribing
        pending.note(.upserted(keys[0]))
        #expect(pending.take() == .everything)
        #expect(pending.take() == nil)
        #expect(pending.isEmpty)
    }

    @Test("changes gathered: each key once, in the order first changed, in one re-read")
    func gathered() {
        var pending = PendingReread()
        for change: TokenStoreChange in [.upserted(keys[2]), .removed(keys[0]), .upserted(keys[2]), .removed(keys[1])] {
            pending.note(change)
        }
        #expect(pending.take() == .keys([keys[2], keys[0], keys[1]]))
        pending.note(.removed(keys[2]))
        #expect(pending.take() == .keys([keys[2]]))
    }

    @Test(".unknown, or more keys than it gathers, is a re-read of everything held")
    func everything() throws {
        var pending = PendingReread()
        pending.note(.upserted(keys[0]))
        pending.note(.unknown)
        pending.note(.removed(keys[1]))
        #expect(pending.take() == .everything)

        for i in 0...PendingReread.maximumKeys { pending.note(.removed(try TokenKey.vehicle("v\(i)"))) }
        #expect(pending.take() == .everything)
    }
}

@Suite("An engine on SQLite following a burst and a start-up change", .paced)
struct SQLiteChangeBurstTests {
    @Test("a purge of 6,300 rows (more than one poll itemizes) by another process: each of the 300 held subjects is refetched, none served purged")
    func purgeBurst() async throws {
        let feedClock = ManualClock()
        let h = try EngineHarness(feedClock: feedClock)
        let held = try (0..<300).map { try TokenKey.vehicle("h\($0)") }
        let filler = try (0..<6000).map { try TokenKey.trip("f\($0)") }
        let other = try openStore(h.dir.file("tokens.sqlite"), mode: .adminReadWrite)
        defer { other.close() }
        let before = held.map { token($0, expiresIn: 3600, now: h.time.now) }
        try await other.upsert(before)
        try await other.upsert(filler.map { token($0, expiresIn: 3600, now: h.time.now) })
        await h.engine.track(held)
        #expect(held.allSatisfy { h.engine.heldToken(for: $0)?.source == .store })
        let running = h.start()
        defer { running.cancel() }
        #expect(await eventually(within: 60) { await h.engine.isRunning })
        #expect(await h.engine.settle())
        #expect(h.fetcher.total == 0)

        #expect(try await other.purge(.all) == 6300)
        let purged = Dictionary(uniqueKeysWithValues: before.map { ($0.key, $0.value) })
        let stillServed = { held.filter { h.engine.heldToken(for: $0)?.token.value == purged[$0] } }
        #expect(await h.store.deliversWithinOneSecond(feedClock) { stillServed().isEmpty },
                "\(stillServed().count) of \(held.count) held subjects still serve their purged token")
        #expect(await eventually(within: 30) { held.allSatisfy { h.fetcher.count($0) == 1 } },
                "\(held.filter { h.fetcher.count($0) == 1 }.count) of \(held.count) held subjects refetched")
        #expect(h.fetcher.total == held.count)
        running.cancel()
        _ = try? await running.value
    }

    @Test("a purge committed between track()'s load and run(): the purged token is not served once run() follows the store")
    func purgeBeforeRun() async throws {
        let feedClock = ManualClock()
        let h = try EngineHarness(feedClock: feedClock)
        let key = try TokenKey.vehicle("start-gap")
        let admin = try openStore(h.dir.file("tokens.sqlite"), mode: .adminReadWrite)
        defer { admin.close() }
        let before = token(key, expiresIn: 3600, now: h.time.now)
        try await admin.upsert(before)
        let events = StreamRecorder(h.engine.events())
        await h.engine.track([key])
        #expect(h.engine.heldToken(for: key)?.token.value == before.value)
        // The window: loaded, not yet following the store.
        #expect(try await admin.purge(.key(key)) == 1)

        let running = h.start()
        defer { running.cancel() }
        #expect(await eventually(within: 60) { await h.engine.isRunning })
        #expect(await h.store.deliversWithinOneSecond(feedClock) { events.elements.contains(.removedExternally(key: key)) },
                "the purge before run() was never seen")
        #expect(await eventually(within: 30) { h.fetcher.count(key) == 1 })
        let served = try await h.engine.token(for: key)
        #expect(served.value != before.value)
        running.cancel()
        _ = try? await running.value
    }
}
