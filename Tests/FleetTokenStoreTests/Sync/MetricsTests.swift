import CoreMetrics
import Foundation
import Metrics
import MetricsTestKit
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// Each test gives its engine its own metrics backend, so tests running in parallel (whose
/// engines use the process-wide one) cannot change what it counts.
@Suite("Metrics through swift-metrics", .paced)
struct MetricsTests {
    let testMetrics = TestMetrics()

    func total(_ label: String, _ dimensions: [(String, String)] = []) -> Int64 {
        (try? testMetrics.expectCounter(label, dimensions).totalValue) ?? 0
    }

    @Test("hits, misses, refreshes, failures by error kind (label error), offline serving and fetch latency are counted")
    func counters() async throws {
        let key = try TokenKey.vehicle("metered")
        let h = try EngineHarness(random: 1, metrics: testMetrics)
        let before = (hits: total("fleet_tokens_cache_hits_total"), misses: total("fleet_tokens_cache_misses_total"),
                      refreshes: total("fleet_tokens_refreshes_total"),
                      failures: total("fleet_tokens_refresh_failures_total", [("error", "timeout")]),
                      offline: total("fleet_tokens_served_while_offline_total"))
        let fetchesTimed = (try? testMetrics.expectTimer("fleet_tokens_fetch_duration_seconds").values.count) ?? 0

        let first = try await h.engine.token(for: key)
        for _ in 0..<10 { _ = try await h.engine.token(for: key) }
        #expect(total("fleet_tokens_cache_misses_total") - before.misses == 1)
        #expect(total("fleet_tokens_cache_hits_total") - before.hits == 10)
        #expect(total("fleet_tokens_refreshes_total") - before.refreshes == 1)
        #expect(try testMetrics.expectTimer("fleet_tokens_fetch_duration_seconds").values.count - fetchesTimed == 1)

        h.fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .timeout(seconds: 15) }
        await h.time.advance(by: 3000)
        #expect(try await h.engine.token(for: key) == first) // starts the failing refresh
        #expect(await eventually(within: 60) { total("fleet_tokens_refresh_failures_total", [("error", "timeout")]) - before.failures == 1 })
        for _ in 0..<3 { #expect(try await h.engine.token(for: key) == first) }
        #expect(total("fleet_tokens_served_while_offline_total") - before.offline == 3)
        // Labels and dimensions carry neither token values nor subject ids.
        for counter in testMetrics.counters {
            let text = counter.label + counter.dimensions.map { "\($0.0)=\($0.1)" }.joined()
            #expect(!text.contains(first.value) && !text.contains(key.subjectID))
        }
    }

    @Test("earliest expiry gauge: absent with nothing tracked, 0 while a tracked subject holds no token, else the earliest expiry")
    func earliestExpiryGauge() async throws {
        let (early, late) = (try TokenKey.vehicle("early"), try TokenKey.trip("late"))
        let h = try EngineHarness(random: 1, metrics: testMetrics)
        let label = FleetTokenMetric.earliestExpiry.name
        func gauge() -> Double? { (try? testMetrics.expectGauge(label))?.lastValue }

        #expect(h.engine.recordEarliestTrackedExpiry() == nil)
        #expect(gauge() == nil)
        await h.engine.track([early, late])
        // Tracked, nothing fetched yet (the engine is not running): the epoch, not left out.
        #expect(h.engine.recordEarliestTrackedExpiry() == Date(timeIntervalSince1970: 0))
        #expect(gauge() == 0)

        let first = try await h.engine.token(for: early)
        #expect(h.engine.recordEarliestTrackedExpiry() == Date(timeIntervalSince1970: 0), "late still holds none")
        await h.time.advance(by: 100)
        let second = try await h.engine.token(for: late)
        #expect(second.expiresAt > first.expiresAt)
        #expect(h.engine.recordEarliestTrackedExpiry() == first.expiresAt)
        #expect(gauge() == first.expiresAt.timeIntervalSince1970)

        // An untracked subject's token does not count; with nothing tracked the gauge goes away.
        await h.engine.untrack([early])
        #expect(h.engine.recordEarliestTrackedExpiry() == second.expiresAt)
        await h.engine.untrack([late])
        #expect(h.engine.recordEarliestTrackedExpiry() == nil)
        #expect(gauge() == nil)
        #expect(!testMetrics.recorders.contains { $0.label.contains(early.subjectID) || $0.label.contains(late.subjectID) })
    }
}
