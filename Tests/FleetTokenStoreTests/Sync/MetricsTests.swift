import CoreMetrics
import Foundation
import Metrics
import MetricsTestKit
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// Each test gives its engine its own metrics backend, so tests running in parallel (whose
/// engines use the process-wide one) cannot change what it counts.
@Suite("Metrics through swift-metrics")
struct MetricsTests {
    let testMetrics = TestMetrics()

    func total(_ label: String, _ dimensions: [(String, String)] = []) -> Int64 {
        (try? testMetrics.expectCounter(label, dimensions).totalValue) ?? 0
    }

    @Test("hits, misses, refreshes, failures by kind, offline serving and fetch latency are counted")
    func counters() async throws {
        let key = try TokenKey.vehicle("metered")
        let h = try EngineHarness(random: 1, metrics: testMetrics)
        let before = (hits: total("fleet_tokens_cache_hits_total"), misses: total("fleet_tokens_cache_misses_total"),
                      refreshes: total("fleet_tokens_refreshes_total"),
                      failures: total("fleet_tokens_refresh_failures_total", [("kind", "timeout")]),
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
        #expect(await eventually(within: 20) { total("fleet_tokens_refresh_failures_total", [("kind", "timeout")]) - before.failures == 1 })
        for _ in 0..<3 { #expect(try await h.engine.token(for: key) == first) }
        #expect(total("fleet_tokens_served_while_offline_total") - before.offline == 3)
        // Labels and dimensions carry neither token values nor subject ids.
        for counter in testMetrics.counters {
            let text = counter.label + counter.dimensions.map { "\($0.0)=\($0.1)" }.joined()
            #expect(!text.contains(first.value) && !text.contains(key.subjectID))
        }
    }
}
