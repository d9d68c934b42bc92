// StoreHealth: what subscribers are told must end where the store's state ends, however a
// failed write and a good one cross.

import CoreMetrics
import Dispatch
import FleetTokenStoreTesting
import Foundation
import Logging
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// Holds the thread that logs a message beginning with `prefix` (after saying so on `entered`)
/// until `release` is signalled, at most a second.
private struct HoldingLogHandler: LogHandler {
    let prefix: String
    let entered: DispatchSemaphore
    let release: DispatchSemaphore
    var logLevel: Logger.Level = .trace
    var metadata: Logger.Metadata = [:]

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(level: Logger.Level, message: Logger.Message, metadata: Logger.Metadata?, source: String,
             file: String, function: String, line: UInt) {
        guard message.description.hasPrefix(prefix) else { return }
        entered.signal()
        _ = release.wait(timeout: .now() + 1)
    }
}

@Suite("Store health: degraded and recovered in the order they happen", .paced)
struct StoreHealthTests {
    // Found by a review: a flight's failed failure-record write and the committer's good write
    // can cross. The state changed under the lock and the event was sent after it, so
    // .storeRecovered could reach subscribers before the .storeDegraded it ends: the agent's
    // stdout and /readyz then said "degraded" of a store that works, until its next failure.
    @Test("a failure that is still being reported when a success comes: subscribers get .storeDegraded, then .storeRecovered")
    func crossingTransitions() async throws {
        let events = EventBroadcaster<TokenSyncEvent>()
        let seen = events.subscribe()
        let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0)
        let logger = Logger(label: "health") { _ in
            HoldingLogHandler(prefix: "token store write failed", entered: entered, release: release)
        }
        let health = StoreHealth(events: events, metrics: SyncMetrics(factory: NOOPMetricsHandler.instance), logger: logger)
        let failureDone = DispatchSemaphore(value: 0), successDone = DispatchSemaphore(value: 0)

        // The waits below block a thread: not one of the cooperative pool's. Threads of their
        // own for the two writes too: a blocked GCD worker need not be replaced at once.
        let (reported, failureEnded, successEnded) = try await offCooperativePool { () -> (Bool, Bool, Bool) in
            Thread.detachNewThread {
                health.writeFailed(.databaseUnavailable(path: "tokens", reason: "a test's failure"))
                failureDone.signal()
            }
            guard entered.wait(timeout: .now() + 10) == .success else { return (false, false, false) }
            // The success, while the failure is held in its report (half a second to finish).
            Thread.detachNewThread {
                health.writeSucceeded()
                successDone.signal()
            }
            let successFirst = successDone.wait(timeout: .now() + 0.5) == .success
            release.signal()
            let failureEnded = failureDone.wait(timeout: .now() + 10) == .success
            return (true, failureEnded, successFirst || successDone.wait(timeout: .now() + 10) == .success)
        }
        try #require(reported, "the failure was reported")
        #expect(failureEnded && successEnded, "both writes' reports ended")
        events.finish()

        var transitions: [String] = []
        for await event in seen {
            switch event {
            case .storeDegraded: transitions.append("degraded")
            case .storeRecovered: transitions.append("recovered")
            default: break
            }
        }
        #expect(transitions == ["degraded", "recovered"], "the store works; the last word must say so")
    }
}
