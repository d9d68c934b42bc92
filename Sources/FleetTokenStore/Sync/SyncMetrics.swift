// Sync layer: the engine's swift-metrics instruments.

import Metrics

/// The engine's swift-metrics instruments. Labels and dimensions never carry token values or
/// subject ids (unbounded cardinality); failures are dimensioned by error kind only.
struct SyncMetrics: Sendable {
    let hits = Counter(label: "fleet_tokens_cache_hits_total")
    let misses = Counter(label: "fleet_tokens_cache_misses_total")
    let storeReuses = Counter(label: "fleet_tokens_store_reuses_total")
    let refreshes = Counter(label: "fleet_tokens_refreshes_total")
    let servedOffline = Counter(label: "fleet_tokens_served_while_offline_total")
    let unavailable = Counter(label: "fleet_tokens_unavailable_total")
    let storeWriteFailures = Counter(label: "fleet_tokens_store_write_failures_total")
    let fetchLatency = Timer(label: "fleet_tokens_fetch_duration_seconds")

    func failure(kind: String) {
        Counter(label: "fleet_tokens_refresh_failures_total", dimensions: [("kind", kind)]).increment()
    }
}
