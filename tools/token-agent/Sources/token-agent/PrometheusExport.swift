// The agent's Prometheus backend: swift-metrics instruments made in a PrometheusCollectorRegistry
// with the help text of the library's metric catalog, and the build_info gauge.

import BuildStamp
import CoreMetrics
import FleetTokenStore
import Prometheus

/// A swift-metrics factory making Prometheus metrics with `# HELP` lines.
///
/// swift-prometheus's own `PrometheusMetricsFactory` registers every metric with empty help
/// (so `promtool check metrics` reports each one); this one looks the help up by name in
/// ``FleetTokenMetric/all``. Destroying is left to `PrometheusMetricsFactory`, which only
/// unregisters from the same registry.
struct DescribedPrometheusFactory: MetricsFactory {
    let registry: PrometheusCollectorRegistry
    private let help: [String: String]
    private let plain: PrometheusMetricsFactory

    init(registry: PrometheusCollectorRegistry, catalog: [FleetTokenMetric] = FleetTokenMetric.all) {
        self.registry = registry
        self.help = Dictionary(catalog.map { ($0.name, $0.help) }, uniquingKeysWith: { first, _ in first })
        self.plain = PrometheusMetricsFactory(registry: registry)
    }

    /// `label` with its help; empty help (no `# HELP` line) for a metric not in the catalog,
    /// which the promtool test then reports.
    private func described(_ label: String) -> MetricNameDescriptor {
        MetricNameDescriptor(metricName: label, unitName: "", helpText: help[label] ?? "")
    }

    func makeCounter(label: String, dimensions: [(String, String)]) -> any CounterHandler {
        registry.makeCounter(descriptor: described(label), labels: dimensions)
    }

    func makeFloatingPointCounter(label: String, dimensions: [(String, String)]) -> any FloatingPointCounterHandler {
        registry.makeCounter(descriptor: described(label), labels: dimensions)
    }

    func makeRecorder(label: String, dimensions: [(String, String)], aggregate: Bool) -> any RecorderHandler {
        guard aggregate else { return registry.makeGauge(descriptor: described(label), labels: dimensions) }
        let buckets = plain.valueHistogramBuckets[label] ?? plain.defaultValueHistogramBuckets
        return registry.makeValueHistogram(descriptor: described(label), labels: dimensions, buckets: buckets)
    }

    func makeMeter(label: String, dimensions: [(String, String)]) -> any MeterHandler {
        registry.makeGauge(descriptor: described(label), labels: dimensions)
    }

    func makeTimer(label: String, dimensions: [(String, String)]) -> any TimerHandler {
        let buckets = plain.durationHistogramBuckets[label] ?? plain.defaultDurationHistogramBuckets
        return registry.makeDurationHistogram(descriptor: described(label), labels: dimensions, buckets: buckets)
    }

    func destroyCounter(_ handler: any CounterHandler) { plain.destroyCounter(handler) }
    func destroyFloatingPointCounter(_ handler: any FloatingPointCounterHandler) { plain.destroyFloatingPointCounter(handler) }
    func destroyRecorder(_ handler: any RecorderHandler) { plain.destroyRecorder(handler) }
    func destroyMeter(_ handler: any MeterHandler) { plain.destroyMeter(handler) }
    func destroyTimer(_ handler: any TimerHandler) { plain.destroyTimer(handler) }
}

/// `fleet_tokens_build_info{version,revision} 1`: which build a scraped agent runs.
enum BuildInfo {
    /// The release version, as `--version` prints it.
    static let version = BuildStamp.version
    /// The git revision the binary was built from, as `--version` prints it (`unknown` when
    /// built without git).
    static let revision = BuildStamp.revision

    /// Registers the gauge in `registry` with the value 1.
    static func register(in registry: PrometheusCollectorRegistry) {
        let name = MetricNameDescriptor(metricName: "fleet_tokens_build_info", unitName: "",
                                        helpText: "The running token-agent's build: version and git revision as labels; always 1.")
        registry.makeGauge(descriptor: name, labels: [("version", version), ("revision", revision)]).set(to: 1)
    }
}
