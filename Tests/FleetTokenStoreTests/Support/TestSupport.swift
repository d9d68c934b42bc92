// FleetTokenStoreTests' storage support: file hashes and opening a store. (Directories, file
// modes, sqlite3 and stored tokens relative to a reference time are in TestSupportKit; test
// time and JWTs in the test kit.)

import Crypto
import FleetTokenStoreTesting
import Foundation
import Logging
import TestSupportKit
@testable import FleetTokenStore

func sha256(ofFile path: String) -> String {
    let data = FileManager.default.contents(atPath: path) ?? Data()
    return SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined()
}

func openStore(_ path: String, mode: StoreOpenMode = .agent, configure: (inout StoreConfiguration) -> Void = { _ in },
               logger: Logger = Logger(label: "test"), pollClock: (any Clock<Duration>)? = nil) throws -> SQLiteTokenRepository {
    var configuration = StoreConfiguration()
    configure(&configuration)
    guard let pollClock else {
        return try SQLiteTokenRepository(path: path, mode: mode, configuration: configuration, logger: logger)
    }
    return try SQLiteTokenRepository(path: path, mode: mode, configuration: configuration, logger: logger,
                                     migrator: SchemaMigrator(), pollClock: pollClock)
}

extension SQLiteTokenRepository {
    /// Runs the store's background work, as an engine's run() would, until the integrity check
    /// deferred from start-up has ended (or `seconds` passed); returns what it found.
    func deferredCheckFinding(within seconds: Double = 60) async -> String? {
        let work = Task { await self.runBackgroundWork() }
        defer { work.cancel() }
        _ = await eventually(within: seconds) { self.backgroundCheckHasRun }
        return backgroundIntegrityFinding()
    }

    /// Calls close() on a thread of its own and reports whether it returned within `seconds`.
    /// The bound is a safety net for a close() that hangs, not a timing goal: how long close()
    /// takes is a figure of the benchmarks (`lifecycle.close_*` in tools/benchmarks).
    func closeReturns(within seconds: Double = 30) async -> Bool {
        let closed = EndFlag()
        Thread.detachNewThread { self.close(); closed.set() }
        return await eventually(within: seconds) { closed.isSet }
    }

    /// Moves `clock` (this store's change-feed poll clock) on one poll interval at a time, up
    /// to one second of clock time, until `delivered` holds: the README's "seen within 1 s",
    /// checked on the feed's own clock, so a loaded machine cannot make it fail or pass.
    func deliversWithinOneSecond(_ clock: ManualClock, _ delivered: @escaping () -> Bool) async -> Bool {
        let interval = configuration.changePollInterval
        for _ in 0..<max(1, Int((1 / interval).rounded(.down))) {
            let before = monitor.completedPolls
            await clock.advance(by: .milliseconds(Int64(interval * 1000)))
            // The poll this step allows (real time only buys CPU; a poller not yet asleep when
            // the clock moved polls at the next step).
            _ = await eventually(within: 2) { self.monitor.completedPolls > before }
            if await eventually(within: 2, { delivered() }) { return true }
        }
        return delivered()
    }
}
