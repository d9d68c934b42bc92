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
package import NIOCore

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
        /// The most bytes of request bodies held at once, over all calls and connections: a
        /// call whose body would pass it is refused (`RESOURCE_EXHAUSTED` / 503). Default 64 MiB
        /// (Fleet Engine's requests are a few KiB; one body may have up to 16 MiB).
        public var requestBodyBudget: Int = 64 << 20

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
    /// Request bytes held by all calls (``Configuration/requestBodyBudget``).
    package let bodyBudget: RequestBodyBudget
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
        self.bodyBudget = RequestBodyBudget(limit: configuration.requestBodyBudget)
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

    /// A call whose rules passed: what it is, whose token it needs, how long it may wait.
    struct PreparedCall: Sendable {
        let call: FleetEngineCall
        let key: TokenKey
        /// When the caller stops waiting (its `grpc-timeout`, at most the upstream timeout, from
        /// the call's arrival): the wait for a token, the call and its one retry all take from it.
        let deadline: NIODeadline
    }

    /// The answer to `request`, which arrived on `transport` from `peer` (a Unix socket's caller;
    /// nil on TCP).
    package func handle(_ request: ProxyRequest, transport: ProxyTransport, peer: PeerIdentity?) async -> ProxyResponse {
        let started = ContinuousClock.now
        var outcome = Outcome()
        let response: ProxyResponse
        do {
            let prepared = try prepare(request, transport: transport, peer: peer, outcome: &outcome)
            response = await answer(request, prepared, sent: nil, on: upstream.defaultLoop, outcome: &outcome)
        } catch {
            response = error.response(for: request.wire)
        }
        return finish(request, response, outcome, peer: peer, since: started)
    }

    /// The rest of a prepared call, awaiting what it must: the token (on a miss, the shared
    /// fetch) and Fleet Engine's answer, unless `sent` holds both already; then the one retry of
    /// a rejected token. Refusals come back as their answers.
    private func answer(_ request: ProxyRequest, _ prepared: PreparedCall, sent: (token: StoredToken, first: ProxyResponse)?,
                        on loop: any EventLoop, outcome: inout Outcome) async -> ProxyResponse {
        do throws(ProxyRefusal) {
            let (token, first): (StoredToken, ProxyResponse)
            if let sent {
                (token, first) = sent
            } else {
                token = try await self.token(for: prepared.key)
                outcome.fingerprint = token.fingerprint.description
                first = try await send(request, token: token, before: prepared.deadline, on: loop)
            }
            return try await retryIfRejected(request, prepared, first: first, token: token, on: loop, outcome: &outcome)
        } catch {
            return error.response(for: request.wire)
        }
    }

    /// Answers `request` by calling `reply` (on any thread). A call whose token is in memory is
    /// answered from `loop` (the caller's connection's) to the end, on `loop`'s own connection to
    /// Fleet Engine: no task and no other thread. A miss (waiting for the shared fetch) or a
    /// rejected token (one retry) continues in a task that `inTask` runs; when it runs no more
    /// tasks (it returns false: the service is stopping) the call is answered `UNAVAILABLE`.
    package func handle(_ request: ProxyRequest, transport: ProxyTransport, peer: PeerIdentity?, on loop: any EventLoop,
                        inTask: @escaping @Sendable (_ work: @escaping @Sendable () async -> Void) -> Bool,
                        reply: @escaping @Sendable (ProxyResponse) -> Void) {
        let started = ContinuousClock.now
        var outcome = Outcome()
        let prepared: PreparedCall
        do {
            prepared = try prepare(request, transport: transport, peer: peer, outcome: &outcome)
        } catch {
            return reply(finish(request, error.response(for: request.wire), outcome, peer: peer, since: started))
        }
        // The rest of the call in a task; `UNAVAILABLE` when no task runs any more.
        let continueInTask = { @Sendable (_ outcome: Outcome, _ sent: (token: StoredToken, first: ProxyResponse)?) in
            let queued = inTask {
                var outcome = outcome
                let response = await self.answer(request, prepared, sent: sent, on: loop, outcome: &outcome)
                reply(self.finish(request, response, outcome, peer: peer, since: started))
            }
            guard !queued else { return }
            let refusal = ProxyRefusal(grpcStatus: 14, httpStatus: 503, message: "token-agent's Fleet Engine proxy is stopping: retry shortly", retryAfter: 1)
            reply(self.finish(request, refusal.response(for: request.wire), outcome, peer: peer, since: started))
        }
        guard let token = api.engine.tokenIfHeld(for: prepared.key) else { return continueInTask(outcome, nil) }
        outcome.fingerprint = token.fingerprint.description
        let sent = outcome
        startSending(request, token: token, before: prepared.deadline, on: loop).whenComplete { result in
            switch result {
            case .failure(let error):
                let refusal = error as? ProxyRefusal ?? .upstream(error)
                reply(self.finish(request, refusal.response(for: request.wire), sent, peer: peer, since: started))
            case .success(let first) where TokenRejection.rejectsToken(first, wire: request.wire):
                continueInTask(sent, (token, first))
            case .success(let response):
                reply(self.finish(request, response, sent, peer: peer, since: started))
            }
        }
    }

    /// The answer to a call refused before it was read whole (its body past the cap), counted
    /// and access-logged as every other call is, under its method when its path names one.
    package func refusedUnread(_ request: ProxyRequest, _ refusal: ProxyRefusal, peer: PeerIdentity?) -> ProxyResponse {
        var outcome = Outcome()
        let method = switch request.wire {
        case .grpc: FleetEngineMethod.grpc(path: request.target)?.name
        case .rest: (try? FleetEngineCall(httpMethod: request.method, target: request.target))?.method.name
        }
        if let method { outcome.method = method }
        return finish(request, refusal.response(for: request.wire), outcome, peer: peer, since: .now)
    }

    /// The metrics and the access log of a call answered with `response`; returns `response`.
    private func finish(_ request: ProxyRequest, _ response: ProxyResponse, _ outcome: Outcome, peer: PeerIdentity?,
                        since started: ContinuousClock.Instant) -> ProxyResponse {
        let code = request.wire == .grpc ? ProxyRefusal.statusName(response.effectiveGRPCStatus) : "\(response.status)"
        Counter(label: FleetTokenMetric.proxyRequests.name,
                dimensions: [("protocol", request.wire.rawValue), ("method", outcome.method), ("code", code)], factory: metrics).increment()
        logger.info("Fleet Engine call", metadata: Self.accessLog(request, outcome, code: code, peer: peer, since: started))
        return response
    }

    /// The call's rules, decided without waiting: the listener's request rules, the method and
    /// its resource, the subject, the caller's right to it and the dynamic-subject cap.
    private func prepare(_ request: ProxyRequest, transport: ProxyTransport, peer: PeerIdentity?,
                         outcome: inout Outcome) throws(ProxyRefusal) -> PreparedCall {
        // The invalidation limiter forgets old entries a few at a time, on every call.
        api.limiter.sweep(now: .now)
        if let refusal = ProxyRequestRules.refusal(request, transport: transport) { throw refusal }
        // A REST path in the token API's normal form, so that the path the proxy reads the
        // resource from is the path Fleet Engine acts on (no `%2D` for `-`, no `.` segment).
        if request.wire == .rest, let problem = RequestTarget.problem(request.target) {
            throw .badRequest("the request target \(problem): send the path in normal form, e.g. /v1/providers/p/vehicles/truck-7")
        }
        let call: FleetEngineCall
        do {
            switch request.wire {
            case .grpc:
                // The method first: an unknown one (answered as soon as its headers come, with no
                // body) is refused as unknown, not for its missing message.
                guard FleetEngineMethod.grpc(path: request.target) != nil else {
                    throw FleetEngineCallRefusal.unknownGRPCMethod(request.target)
                }
                call = try FleetEngineCall(grpcPath: request.target, message: GRPCUnaryFrame.message(in: request.body))
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
        return PreparedCall(call: call, key: key, deadline: .now() + timeLimit(request))
    }

    /// `first`, Fleet Engine's answer to the call sent with `token`, unless it rejected the token:
    /// then the answer to the call sent once more with a token fetched after the rejection.
    private func retryIfRejected(_ request: ProxyRequest, _ prepared: PreparedCall, first: ProxyResponse, token: StoredToken,
                                 on loop: any EventLoop, outcome: inout Outcome) async throws(ProxyRefusal) -> ProxyResponse {
        guard TokenRejection.rejectsToken(first, wire: request.wire) else { return first }
        let key = prepared.key
        // Rejected: a token fetched after the rejection, once. The per-key limit of
        // POST /v1/invalidate holds; when another call invalidated the key meanwhile, the token
        // it fetched is the new one.
        if api.invalidationRefusal(key) == nil, case .allowed = api.limiter.admit(key, now: .now) { await api.engine.invalidate(key) }
        let fresh = try await self.token(for: key)
        guard fresh.fingerprint != token.fingerprint else { return first }
        logger.notice("Fleet Engine rejected the token; sending the call once more with a new one", metadata: [
            "method": "\(prepared.call.method.name)", "subject": "\(key)", "fingerprint_old": "\(token.fingerprint)",
            "fingerprint_new": "\(fresh.fingerprint)", "status": "\(request.wire == .grpc ? "\(first.effectiveGRPCStatus)" : "\(first.status)")",
        ])
        Counter(label: FleetTokenMetric.proxyRetries.name,
                dimensions: [("protocol", request.wire.rawValue), ("method", prepared.call.method.name)], factory: metrics).increment()
        outcome.retried = true
        outcome.fingerprint = fresh.fingerprint.description
        return try await send(request, token: fresh, before: prepared.deadline, on: loop)
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

    private func send(_ request: ProxyRequest, token: StoredToken, before deadline: NIODeadline, on loop: any EventLoop) async throws(ProxyRefusal) -> ProxyResponse {
        do {
            return try await startSending(request, token: token, before: deadline, on: loop).get()
        } catch let refusal as ProxyRefusal {
            throw refusal
        } catch {
            throw .upstream(error)
        }
    }

    /// Fleet Engine's answer to `request` sent with `token` on `loop`'s connection, its headers
    /// as the caller may see them; an upstream failure as the refusal the caller gets. Nothing is
    /// sent once `deadline` has passed (a wait for the token took the caller's time): the caller
    /// has stopped waiting, and a call it gave up on (an older position) must not be applied
    /// after it.
    private func startSending(_ request: ProxyRequest, token: StoredToken, before deadline: NIODeadline, on loop: any EventLoop) -> EventLoopFuture<ProxyResponse> {
        let remaining = deadline - .now()
        guard remaining > .zero else {
            return loop.makeFailedFuture(ProxyRefusal(grpcStatus: 4, httpStatus: 504, message:
                "token-agent's Fleet Engine proxy: the call's deadline passed before it could be sent (waiting for the token of its subject); nothing was sent to Fleet Engine"))
        }
        let started = ContinuousClock.now
        let (metrics, wire) = (metrics, request.wire)
        return upstream.start(request, token: token.value, timeout: remaining, on: loop).always { _ in
            Timer(label: FleetTokenMetric.proxyUpstreamDuration.name, dimensions: [("protocol", wire.rawValue)], factory: metrics)
                .recordNanoseconds(Int64((ContinuousClock.now - started) / .nanoseconds(1)))
        }.flatMapThrowing { response in
            var response = response
            response.headers = ProxyRequestRules.callerHeaders(response.headers)
            return response
        }.flatMapErrorThrowing { error in
            throw ProxyRefusal.upstream(error)
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

extension ProxyRefusal {
    /// What the caller gets when Fleet Engine gave no answer: `DEADLINE_EXCEEDED` / 504 after the
    /// call's time, else `UNAVAILABLE` / 502 (which Google's clients retry).
    static func upstream(_ error: any Error) -> ProxyRefusal {
        if case UpstreamFailure.timeout? = error as? UpstreamFailure {
            return ProxyRefusal(grpcStatus: 4, httpStatus: 504, message: "token-agent's Fleet Engine proxy: \(UpstreamFailure.timeout)")
        }
        return ProxyRefusal(grpcStatus: 14, httpStatus: 502, message: "token-agent's Fleet Engine proxy: \(error)")
    }
}
