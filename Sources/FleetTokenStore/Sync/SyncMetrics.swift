// Sync layer: the engine's swift-metrics instruments.

import Metrics

/// The engine's swift-metrics instruments. Labels and dimensions never carry token values or
/// subject ids (unbounded cardinality); failures are dimensioned by error kind only.
struct SyncMetrics: Sendable {
    let hits: Counter
    let misses: Counter
    let storeReuses: Counter
    let refreshes: Counter
    let servedOffline: Counter
    let unavailable: Counter
    let storeWriteFailures: Counter
    let fetchLatency: Timer
    let factory: any MetricsFactory

    /// Instruments made by `factory`: the process-wide `MetricsSystem.factory` unless the
    /// embedder (or a test) gives the engine its own.
    init(factory: any MetricsFactory = MetricsSystem.factory) {
        self.factory = factory
        hits = Counter(label: "fleet_tokens_cache_hits_total", factory: factory)
        misses = Counter(label: "fleet_tokens_cache_misses_total", factory: factory)
        storeReuses = Counter(label: "fleet_tokens_store_reuses_total", factory: factory)
        refreshes = Counter(label: "fleet_tokens_refreshes_total", factory: factory)
        servedOffline = Counter(label: "fleet_tokens_served_while_offline_total", factory: factory)
        unavailable = Counter(label: "fleet_tokens_unavailable_total", factory: factory)
        storeWriteFailures = Counter(label: "fleet_tokens_store_write_failures_total", factory: factory)
        fetchLatency = Timer(label: "fleet_tokens_fetch_duration_seconds", factory: factory)
    }

    func failure(kind: String) {
        Counter(label: "fleet_tokens_refresh_failures_total", dimensions: [("kind", kind)], factory: factory).increment()
    }
}
