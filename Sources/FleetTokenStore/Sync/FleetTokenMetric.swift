// Sync layer: the catalog of the metrics the library emits, with the help text a Prometheus
// exporter shows for each (swift-metrics itself has no place for help text).

/// A metric the library emits through swift-metrics: its name, type, labels and help text.
///
/// swift-metrics carries labels only; a backend that exports help text (Prometheus's `# HELP`)
/// looks the text up here by name, as token-agent does. Names follow Prometheus's conventions:
/// counters end in `_total`, durations are in `_seconds`, points in time are
/// `_timestamp_seconds` (Unix time). No label carries a token value or a subject id, so the
/// number of series stays bounded at any number of subjects.
public struct FleetTokenMetric: Sendable, Hashable {
    /// How the metric is exported.
    public enum Kind: String, Sendable, Hashable {
        /// Only grows (swift-metrics `Counter`).
        case counter
        /// Goes up and down (swift-metrics `Gauge`).
        case gauge
        /// A distribution of durations (swift-metrics `Timer`).
        case histogram
    }

    /// The exported name, e.g. `fleet_tokens_cache_hits_total`.
    public let name: String
    /// How it is exported.
    public let kind: Kind
    /// The label names its series carry (none for most).
    public let labels: [String]
    /// One line saying what it measures, for `# HELP`.
    public let help: String

    init(_ name: String, _ kind: Kind, labels: [String] = [], help: String) {
        self.name = name
        self.kind = kind
        self.labels = labels
        self.help = help
    }
}

extension FleetTokenMetric {
    /// Tokens handed out from memory (fresh, or past the soft point).
    public static let cacheHits = FleetTokenMetric(
        "fleet_tokens_cache_hits_total", .counter,
        help: "Tokens handed out from memory without waiting (fresh, or past the soft point while a refresh runs).")
    /// Requests that found no usable token in memory and waited for the shared fetch.
    public static let cacheMisses = FleetTokenMetric(
        "fleet_tokens_cache_misses_total", .counter,
        help: "Token requests that found no usable token in memory and waited for the shared fetch or the store.")
    /// Tokens taken from the store instead of fetched.
    public static let storeReuses = FleetTokenMetric(
        "fleet_tokens_store_reuses_total", .counter,
        help: "Tokens taken from the store (kept from before a restart, or written by another process) instead of fetched.")
    /// Successful fetches from the provider.
    public static let refreshes = FleetTokenMetric(
        "fleet_tokens_refreshes_total", .counter,
        help: "Tokens fetched from the provider and accepted.")
    /// Failed fetches, by the error's kind.
    public static let refreshFailures = FleetTokenMetric(
        "fleet_tokens_refresh_failures_total", .counter, labels: ["error"],
        help: "Fetches from the provider that failed, by the error's kind (unreachable, timeout, httpStatus, a token validation kind, ...).")
    /// Tokens handed out while refreshes fail (offline mode).
    public static let servedWhileOffline = FleetTokenMetric(
        "fleet_tokens_served_while_offline_total", .counter,
        help: "Tokens handed out while their refreshes fail (offline mode: the held token, above the floor).")
    /// Requests answered with no token at all.
    public static let unavailable = FleetTokenMetric(
        "fleet_tokens_unavailable_total", .counter,
        help: "Token requests answered with no token: the fetch failed and no token above the floor was held.")
    /// Store writes that failed.
    public static let storeWriteFailures = FleetTokenMetric(
        "fleet_tokens_store_write_failures_total", .counter,
        help: "Writes to the token store that failed (tokens are still served from memory).")
    /// How long fetches from the provider took.
    public static let fetchDuration = FleetTokenMetric(
        "fleet_tokens_fetch_duration_seconds", .histogram,
        help: "How long fetches from the provider took, successful or not.")
    /// The earliest expiry among the tracked subjects' tokens.
    public static let earliestExpiry = FleetTokenMetric(
        "fleet_tokens_earliest_expiry_timestamp_seconds", .gauge,
        help: "Earliest expiry (Unix time, this host's clock) among the tokens of the tracked subjects; 0 while a tracked subject holds no token.")
    /// When the provider client certificate expires.
    public static let clientCertificateExpiry = FleetTokenMetric(
        "fleet_tokens_client_certificate_expiry_timestamp_seconds", .gauge,
        help: "When the client certificate presented to the token provider expires (Unix time).")

    /// Calls through the Fleet Engine proxy, by wire, method and the answer's code.
    public static let proxyRequests = FleetTokenMetric(
        "fleet_tokens_proxy_requests_total", .counter, labels: ["protocol", "method", "code"],
        help: "Calls through the Fleet Engine proxy, by protocol (grpc, rest), method and the code answered (gRPC status name, or HTTP status).")
    /// Calls the Fleet Engine proxy sent once more with a new token after Fleet Engine rejected one.
    public static let proxyRetries = FleetTokenMetric(
        "fleet_tokens_proxy_retries_total", .counter, labels: ["protocol", "method"],
        help: "Calls the Fleet Engine proxy sent once more, with a token fetched after Fleet Engine rejected the first (UNAUTHENTICATED, PERMISSION_DENIED, 401, 403).")
    /// How long Fleet Engine took to answer the proxy's calls.
    public static let proxyUpstreamDuration = FleetTokenMetric(
        "fleet_tokens_proxy_upstream_duration_seconds", .histogram, labels: ["protocol"],
        help: "How long Fleet Engine took to answer a call sent by the proxy (each attempt), answered or not.")

    /// Every metric the library emits (FleetTokenStore, FleetTokenHTTP and FleetEngineProxy).
    public static let all: [FleetTokenMetric] = [
        cacheHits, cacheMisses, storeReuses, refreshes, refreshFailures, servedWhileOffline, unavailable,
        storeWriteFailures, fetchDuration, earliestExpiry, clientCertificateExpiry,
        proxyRequests, proxyRetries, proxyUpstreamDuration,
    ]
}
