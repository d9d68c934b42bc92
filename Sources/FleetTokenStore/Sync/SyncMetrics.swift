// Sync layer: the engine's swift-metrics instruments.

import Foundation
import Metrics
import Synchronization

/// The engine's swift-metrics instruments, named by ``FleetTokenMetric``. Labels and dimensions
/// never carry token values or subject ids (unbounded cardinality); failures are dimensioned by
/// error kind only.
struct SyncMetrics: Sendable {
    let hits: Counter
    let misses: Counter
    let storeReuses: Counter
    let refreshes: Counter
    let servedOffline: Counter
    let unavailable: Counter
    let storeWriteFailures: Counter
    let fetchLatency: Timer
    let earliestExpiry: ExpiryGauge
    let factory: any MetricsFactory

    /// Instruments made by `factory`: the process-wide `MetricsSystem.factory` unless the
    /// embedder (or a test) gives the engine its own.
    init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        hits = Counter(label: FleetTokenMetric.cacheHits.name, factory: factory)
        misses = Counter(label: FleetTokenMetric.cacheMisses.name, factory: factory)
        storeReuses = Counter(label: FleetTokenMetric.storeReuses.name, factory: factory)
        refreshes = Counter(label: FleetTokenMetric.refreshes.name, factory: factory)
        servedOffline = Counter(label: FleetTokenMetric.servedWhileOffline.name, factory: factory)
        unavailable = Counter(label: FleetTokenMetric.unavailable.name, factory: factory)
        storeWriteFailures = Counter(label: FleetTokenMetric.storeWriteFailures.name, factory: factory)
        fetchLatency = Timer(label: FleetTokenMetric.fetchDuration.name, factory: factory)
        earliestExpiry = ExpiryGauge(factory: factory)
    }

    /// Counts a failed fetch under its error's kind (`error`, not `kind`: everywhere else `kind`
    /// is the subject's kind).
    func failure(kind: String) {
        Counter(label: FleetTokenMetric.refreshFailures.name, dimensions: [("error", kind)], factory: factory).increment()
    }
}

/// The `fleet_tokens_earliest_expiry_timestamp_seconds` gauge, present only while there is
/// something to report: with no tracked subject it is destroyed (unregistered), since no value
/// means "nothing expires" (Prometheus text has `+Inf`, but not every backend writes it).
final class ExpiryGauge: Sendable {
    private let factory: any MetricsFactory
    private let gauge = Mutex<Gauge?>(nil)

    init(factory: any MetricsFactory) { self.factory = factory }

    /// Records `expiry`, or removes the gauge when nil.
    func record(_ expiry: Date?) {
        gauge.withLock { gauge in
            guard let expiry else {
                gauge?.destroy()
                gauge = nil
                return
            }
            if gauge == nil { gauge = Gauge(label: FleetTokenMetric.earliestExpiry.name, factory: factory) }
            gauge?.record(expiry.timeIntervalSince1970)
        }
    }
}
