// The Fleet Engine proxy's core: one call in, one answer out. The call's rules, its method and
// resource, the subject and the caller's right to it, the engine's token, Fleet Engine's answer,
// and one retry with a new token when Fleet Engine rejects the first. Wire-independent: the
// listener (FleetEngineProxyService) reads and writes the wires.

public import FleetTokenHTTP
public import FleetTokenService
import FleetTokenStore
import Foundation
public import Logging
public import CoreMetrics
import NIOCore

/// Puts the right token on each Fleet Engine call and sends it on.
///
/// Create one over the agent's ``TokenAPI`` (whose allow list, client rules and invalidation
/// limit it shares) and serve it with ``FleetEngineProxyService``.
public struct FleetEngineProxy: Sendable {
    /// What the proxy does, besides the token API's rules.
    public struct Configuration: Sendable {
        /// Where calls go. Default: Fleet Engine itself.
        public var endpoint: FleetEngineEndpoint
        /// A PEM file of the CA certificates trusted for the endpoint; nil: the system's roots.
        public var caFile: String?
        /// Whose token goes on a call that names no single resource.
        public var subjectRule: FleetEngineSubjectRule
        /// The forward proxy to reach an `https` endpoint through (a CONNECT tunnel), as for the
        /// token provider: `--proxy`, `HTTPS_PROXY`, `NO_PROXY`. Default: direct. A plain `http://`
        /// endpoint (loopback only) is always reached directly.
        public var proxySettings: ProxySettings = .direct
        /// The longest a call waits for Fleet Engine (each attempt), unless the caller's
        /// `grpc-timeout` is shorter. Default 60 s.
        public var upstreamTimeout: Duration = .seconds(60)

        /// Reads what the proxy will read at start (the CA file, judged as every file that
        /// steers the agent), without connecting: for a configuration check.
        /// - Throws: ``FleetEngineProxyError`` when the CA file cannot be used.
        public func check() throws(FleetEngineProxyError) {
            _ = try FleetEngineUpstream.tlsContext(for: endpoint, caFile: caFile)
        }

        /// A configuration sending calls to `endpoint` with `subjectRule`.
        public init(endpoint: FleetEngineEndpoint, caFile: String? = nil, subjectRule: FleetEngineSubjectRule = FleetEngineSubjectRule()) {
            self.endpoint = endpoint
            self.caFile = caFile
            self.subjectRule = subjectRule
        }
    }

    let api: TokenAPI
    let configuration: Configuration
    let upstream: FleetEngineUpstream
    let logger: Logger
    let metrics: any MetricsFactory

    /// A proxy using `api`'s engine and access rules.
    /// - Throws: ``FleetEngineProxyError`` when the CA file cannot be used.
    public init(api: TokenAPI, configuration: Configuration, logger: Logger,
                metricsFactory: any MetricsFactory = MetricsSystem.factory) throws(FleetEngineProxyError) {
        self.api = api
        self.configuration = configuration
        self.upstream = try FleetEngineUpstream(endpoint: configuration.endpoint, caFile: configuration.caFile,
                                                proxySettings: configuration.proxySettings, logger: logger)
        self.logger = logger
        self.metrics = metricsFactory
    }

    /// What one call came to, for the access log and the metrics.
    struct Outcome {
        var method = "unknown"
        var subject: TokenKey?
        var fingerprint: String?
        var retried = false
    }

    /// The answer to `request`, which arrived on `transport` from `peer` (a Unix socket's caller;
    /// nil on TCP).
    package func handle(_ request: ProxyRequest, transport: ProxyTransport, peer: PeerIdentity?) async -> ProxyResponse {
        let started = ContinuousClock.now
        var outcome = Outcome()
        // The invalidation limiter forgets old entries a few at a time, on every call.
        api.limiter.sweep(now: .now)
        let response: ProxyResponse
        do {
            response = try await answer(request, transport: transport, peer: peer, outcome: &outcome)
        } catch {
            response = error.response(for: request.wire)
        }
        let code = request.wire == .grpc ? ProxyRefusal.statusName(response.grpcStatus ?? 2) : "\(response.status)"
        Counter(label: FleetTokenMetric.proxyRequests.name,
                dimensions: [("protocol", request.wire.rawValue), ("method", outcome.method), ("code", code)], factory: metrics).increment()
        logger.info("Fleet Engine call", metadata: Self.accessLog(request, outcome, code: code, peer: peer, since: started))
        return response
    }

    private func answer(_ request: ProxyRequest, transport: ProxyTransport, peer: PeerIdentity?,
                        outcome: inout Outcome) async throws(ProxyRefusal) -> ProxyResponse {
        if let refusal = ProxyRequestRules.refusal(request, transport: transport) { throw refusal }
        let call: FleetEngineCall
        do {
            switch request.wire {
            case .grpc: call = try FleetEngineCall(grpcPath: request.target, message: GRPCUnaryFrame.message(in: request.body))
            case .rest: call = try FleetEngineCall(httpMethod: request.method, target: request.target)
            }
        } catch let refusal as FleetEngineCallRefusal {
            throw ProxyRefusal(refusal)
        } catch let refusal as ProxyRefusal {
            throw refusal
        } catch {
            throw .badRequest("\(error)")
        }
        outcome.method = call.method.name
        let key: TokenKey
        do {
            key = try configuration.subjectRule.subject(for: call)
        } catch {
            throw ProxyRefusal(error)
        }
        outcome.subject = key
        if let reason = api.accessRefusal(key, peer: peer) { throw .forbidden(reason) }
        if let reason = api.dynamicCapRefusal(key) {
            throw ProxyRefusal(grpcStatus: 14, httpStatus: 503, message: "token-agent's Fleet Engine proxy: \(reason)", retryAfter: 60)
        }
        let timeout = timeLimit(request)
        var token = try await self.token(for: key)
        outcome.fingerprint = token.fingerprint.description
        var response = try await send(request, token: token, timeout: timeout)
        guard TokenRejection.rejectsToken(response, wire: request.wire) else { return response }

        // Rejected: a token fetched after the rejection, once. The per-key limit of
        // POST /v1/invalidate holds; when another call invalidated the key meanwhile, the token
        // it fetched is the new one.
        if case .allowed = api.limiter.admit(key, now: .now) { await api.engine.invalidate(key) }
        let fresh = try await self.token(for: key)
        guard fresh.fingerprint != token.fingerprint else { return response }
        logger.notice("Fleet Engine rejected the token; sending the call once more with a new one", metadata: [
            "method": "\(call.method.name)", "subject": "\(key)", "fingerprint_old": "\(token.fingerprint)",
            "fingerprint_new": "\(fresh.fingerprint)", "status": "\(request.wire == .grpc ? "\(response.grpcStatus ?? 0)" : "\(response.status)")",
        ])
        Counter(label: FleetTokenMetric.proxyRetries.name,
                dimensions: [("protocol", request.wire.rawValue), ("method", call.method.name)], factory: metrics).increment()
        outcome.retried = true
        token = fresh
        outcome.fingerprint = token.fingerprint.description
        response = try await send(request, token: token, timeout: timeout)
        return response
    }

    private func token(for key: TokenKey) async throws(ProxyRefusal) -> StoredToken {
        do {
            return try await api.engine.token(for: key)
        } catch {
            throw ProxyRefusal(grpcStatus: 14, httpStatus: 503, message:
                "token-agent's Fleet Engine proxy has no usable token for \(key) (last error: \(error.lastErrorKind)); see the agent's log",
                retryAfter: error.retryAfterSeconds)
        }
    }

    private func send(_ request: ProxyRequest, token: StoredToken, timeout: TimeAmount) async throws(ProxyRefusal) -> ProxyResponse {
        let started = ContinuousClock.now
        defer {
            Timer(label: FleetTokenMetric.proxyUpstreamDuration.name, dimensions: [("protocol", request.wire.rawValue)], factory: metrics)
                .recordNanoseconds(Int64((ContinuousClock.now - started) / .nanoseconds(1)))
        }
        do {
            var response = try await upstream.send(request, token: token.value, timeout: timeout)
            response.headers = ProxyRequestRules.callerHeaders(response.headers)
            return response
        } catch .timeout {
            throw ProxyRefusal(grpcStatus: 4, httpStatus: 504, message: "token-agent's Fleet Engine proxy: \(UpstreamFailure.timeout)")
        } catch {
            throw ProxyRefusal(grpcStatus: 14, httpStatus: 502, message: "token-agent's Fleet Engine proxy: \(error)")
        }
    }

    /// The caller's `grpc-timeout` when shorter than ``Configuration/upstreamTimeout``.
    private func timeLimit(_ request: ProxyRequest) -> TimeAmount {
        let cap = configuration.upstreamTimeout
        let capNanoseconds = cap.components.seconds * 1_000_000_000 + cap.components.attoseconds / 1_000_000_000
        let asked = request.header("grpc-timeout").flatMap(GRPCTimeout.nanoseconds)
        return .nanoseconds(min(capNanoseconds, asked ?? capNanoseconds))
    }

    static func accessLog(_ request: ProxyRequest, _ outcome: Outcome, code: String, peer: PeerIdentity?,
                          since started: ContinuousClock.Instant) -> Logger.Metadata {
        let elapsed = ContinuousClock.now - started
        var metadata: Logger.Metadata = [
            "protocol": "\(request.wire.rawValue)", "method": "\(outcome.method)", "code": "\(code)",
            "latency_ms": "\(elapsed.accessLogMilliseconds)",
        ]
        if let subject = outcome.subject { metadata["subject"] = "\(subject)" }
        if let fingerprint = outcome.fingerprint { metadata["fingerprint"] = "\(fingerprint)" }
        if outcome.retried { metadata["retried"] = "true" }
        if let peer {
            metadata["uid"] = "\(peer.uid)"
            metadata["pid"] = "\(peer.pid)"
        }
        return metadata
    }
}

/// gRPC's `grpc-timeout` header: up to 8 digits and a unit (`H`, `M`, `S`, `m`, `u`, `n`).
package enum GRPCTimeout {
    /// The timeout in nanoseconds, or nil when the value is not of that form.
    package static func nanoseconds(_ value: String) -> Int64? {
        guard let unit = value.last, value.count >= 2, value.count <= 9,
              let amount = Int64(value.dropLast()), amount >= 0 else { return nil }
        let scale: Int64 = switch unit {
        case "H": 3_600_000_000_000
        case "M": 60_000_000_000
        case "S": 1_000_000_000
        case "m": 1_000_000
        case "u": 1_000
        case "n": 1
        default: 0
        }
        guard scale > 0 else { return nil }
        let (product, overflow) = amount.multipliedReportingOverflow(by: scale)
        return overflow ? Int64.max : product
    }
}
