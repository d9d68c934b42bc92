// Service layer: the local token API's routes, on Hummingbird. How it answers is in
// TokenAPI+Responses.swift; the rules every request meets (request header, no forwarding
// headers, access log) are TokenAPIAccessRules.

public import FleetTokenStore
public import Foundation
package import HTTPTypes
public import Hummingbird
public import Logging
import NIOCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The local token API that hands the engine's tokens to other programs on the host.
///
/// - `GET /v1/token/{kind}/{id}`: `200` `{"kind","id","token","expires_at","fingerprint","source"}`,
///   or the bare token with `Accept: text/plain`; `400` bad id, `403` not allowed, `404` unknown
///   kind, `503` unavailable (with `Retry-After` and the last provider error's kind).
/// - `POST /v1/invalidate/{kind}/{id}`: `204`; `429` with `Retry-After` within
///   ``Configuration/invalidateInterval`` of the key's last one; `503` for a subject neither held
///   nor tracked while ``Configuration/maxDynamicSubjects`` such removals wait for the store.
/// - `GET /v1/subjects`: what the engine holds, without token values.
/// - `GET /healthz`, `GET /readyz`, `GET /metrics`.
///
/// Every route but `/healthz`, `/readyz` and `/metrics` requires `Fleet-Token-Request: true` (so
/// that a local proxy, a server-side request forgery or an HTML form cannot reach tokens),
/// decided on the route that matched; a request target not in normal form (empty, `.` or `..`
/// segments, needless escapes) is `400` before routing; no request may carry `X-Forwarded-For`
/// or `Forwarded`. On TCP, the `Host` must be `localhost` or a loopback address (`421`
/// otherwise: DNS rebinding) and a request with an `Origin` header is `403`.
public struct TokenAPI: Sendable {
    /// What the API serves and how.
    public struct Configuration: Sendable {
        /// The subjects and patterns clients may ask for.
        public var allowList: SubjectAllowList
        /// Whether the keys the engine tracks are allowed as configured subjects too, without
        /// being listed in ``allowList``. The agent tracks exactly its configured subjects, so it
        /// sets this and lists none: one set of them in memory instead of two (6 MiB at 100,000
        /// subjects). Default false: an embedder's allow list alone decides.
        public var allowsTrackedSubjects = false
        /// The subjects `/readyz` requires a usable token for.
        public var readinessSubjects: [TokenKey]
        /// Which Unix-socket callers may have which subjects (`--allow-client`); empty: callers
        /// are not told apart and ``allowList`` decides.
        public var clientPolicy: ClientAccessPolicy = try! ClientAccessPolicy(rules: [])
        /// Shortest time between two forced fetches of one key. Default 10 s.
        public var invalidateInterval: TimeInterval = 10
        /// The most subjects asked for through allow patterns (not configured) that memory may
        /// hold; a request for one more is `503` with `Retry-After`. Default 10,000.
        public var maxDynamicSubjects = 10_000
        /// The most subjects one `GET /v1/subjects` lists when the request names no `limit`.
        package var subjectsPageSize = 1_000
        /// Prometheus text for `GET /metrics`; nil answers `404`.
        public var metricsText: (@Sendable () -> String)?

        /// A configuration allowing `allowList`, ready when `readinessSubjects` have tokens.
        public init(allowList: SubjectAllowList, readinessSubjects: [TokenKey]) {
            self.allowList = allowList
            self.readinessSubjects = readinessSubjects
        }
    }

    /// The header every token request carries, with the value `true`.
    package static let requestHeader = HTTPField.Name("Fleet-Token-Request")!
    /// The response header naming the served token's fingerprint (also in the access log).
    package static let fingerprintHeader = HTTPField.Name("Fleet-Token-Fingerprint")!

    package let engine: TokenSyncEngine
    let configuration: Configuration
    /// The allow list and readiness subjects in force (replaced by ``replaceSubjects(_:)``).
    let subjectsInForce: SubjectsInForce
    package let limiter: InvalidationLimiter
    /// The store's last write problem, for `/readyz`: ``TokenAPIService`` keeps it from the
    /// engine's events.
    let storeWrites: StoreWriteState
    let audit: HandoutAudit
    let logger: Logger

    /// An API over `engine`, serving what `configuration` allows.
    public init(engine: TokenSyncEngine, configuration: Configuration, logger: Logger) {
        self.engine = engine
        self.configuration = configuration
        self.subjectsInForce = SubjectsInForce(allowList: configuration.allowList, readiness: configuration.readinessSubjects,
                                               clients: configuration.clientPolicy)
        self.limiter = InvalidationLimiter(interval: configuration.invalidateInterval)
        self.storeWrites = StoreWriteState()
        self.audit = HandoutAudit(logger: logger)
        self.logger = logger
    }

    /// Replaces the configured subjects (a reloaded subject list): `/readyz` requires these from
    /// now on, and they are allowed without a pattern. A subject no longer listed stays allowed
    /// while the engine holds it (it was used within the idle window), so that a client still
    /// using it keeps getting it; the first reload after the idle rule let it go drops it. (It
    /// stayed allowed until the process restarted: every subject ever listed, and with trips
    /// listed and unlisted by an automation, a set that only grew.) The allow patterns stay.
    ///
    /// With ``Configuration/allowsTrackedSubjects``, the listed subjects are allowed as the
    /// engine's tracked keys, and the allow list keeps only those no longer listed that are
    /// still in use: track the added keys before this call, untrack the removed ones after it.
    package func replaceSubjects(_ subjects: [TokenKey]) {
        subjectsInForce.state.withLock { state in
            if configuration.allowsTrackedSubjects {
                let listed = Set(subjects)
                state.allowList.subjects = state.allowList.subjects.union(state.readiness)
                    .filter { !listed.contains($0) && engine.holds($0) }
            } else {
                let stillUsed = state.allowList.subjects.filter { engine.holds($0) }
                state.allowList.subjects = stillUsed.union(subjects)
            }
            state.readiness = subjects
        }
    }

    /// Replaces the allow patterns (a reloaded configuration). Unlike removed subjects, a
    /// removed pattern stops matching at once: patterns are an operator's access rule, and
    /// narrowing one must take effect without a restart.
    package func replaceAllowPatterns(_ patterns: [SubjectAllowList.Pattern]) {
        subjectsInForce.state.withLock { $0.allowList.patterns = patterns }
    }

    /// Replaces the client rules (a reloaded configuration): in force for the next request.
    package func replaceClientPolicy(_ policy: ClientAccessPolicy) {
        subjectsInForce.state.withLock { $0.clients = policy }
    }

    /// Replaces the allow patterns and the client rules at once (a reloaded configuration), so
    /// that no request is decided on the new patterns with the old rules, or the reverse.
    package func replaceAccess(patterns: [SubjectAllowList.Pattern], clients: ClientAccessPolicy) {
        subjectsInForce.state.withLock { state in
            state.allowList.patterns = patterns
            state.clients = clients
        }
    }

    /// The router with every route and rule, for requests arriving over a Unix socket. Callers
    /// are not identified through it: with client rules, use ``TokenAPIService``.
    public func router() -> Router<TokenAPIRequestContext> { router(for: .unix) }

    /// The router for requests arriving over a TCP listener bound to `host` (which adds the
    /// Host and Origin rules).
    public func router(forTCPHost host: String) -> Router<TokenAPIRequestContext> { router(for: .tcp(host: host)) }

    /// Every route requires the request header, decided on the route that matched, except the
    /// ones listed in ``publicPaths``, which carry no token.
    func router(for transport: APITransport, peers: @escaping PeerLookup = { _ in nil }) -> Router<TokenAPIRequestContext> {
        let router = Router(context: TokenAPIRequestContext.self)
        router.add(middleware: accessRules(transport, peers: peers))
        router.get("/healthz") { _, _ in Self.json(.ok, ["status": "ok"]) }
        router.get("/readyz") { _, _ in await self.readiness() }
        router.get("/metrics") { _, _ in self.metrics() }
        let guarded = router.group().add(middleware: TokenRequestHeaderRule())
        guarded.get(RouterPath(HeldTokenRoute.prefix + ":kind/:id")) { request, context in try await self.token(request, context) }
        guarded.post("/v1/invalidate/:kind/:id") { _, context in try await self.invalidate(context) }
        guarded.get("/v1/subjects") { request, context in await self.subjects(request, context) }
        return router
    }

    /// The rules every request on `transport` meets before routing, with the access log.
    func accessRules(_ transport: APITransport, peers: @escaping PeerLookup = { _ in nil }) -> TokenAPIAccessRules {
        TokenAPIAccessRules(logger: logger, transport: transport, peers: peers)
    }

    /// The token route for held tokens on `transport`, answered on the event loop: see ``HeldTokenRoute``.
    func heldTokenRoute(_ transport: APITransport) -> HeldTokenRoute {
        HeldTokenRoute(api: self, rules: accessRules(transport))
    }

    /// The routes served without the request header: they carry no token.
    package static let publicPaths: Set<String> = ["/healthz", "/readyz", "/metrics"]

    // MARK: routes

    func token(_ request: Request, _ context: TokenAPIRequestContext) async throws -> Response {
        let key: TokenKey
        switch subject(context) {
        case .failure(let refusal): return refusal.response
        case .success(let found): key = found
        }
        if let refusal = capRefusal(key) { return refusal }
        limiter.sweep(now: .now)
        do throws(TokenUnavailable) {
            let (token, source) = try await engine.tokenWithSource(for: key)
            let (headers, body) = handout(token, source: source, key: key, to: context.peer, accept: request.headers[.accept])
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: body))
        } catch {
            return unavailable(error)
        }
    }

    /// The `200` answer handing `token` out (its handout audited when `peer` is known): the
    /// bare token when `accept` prefers `text/plain`, else the JSON object. The router's token
    /// route and ``HeldTokenRoute`` both answer with it.
    func handout(_ token: StoredToken, source: TokenSource, key: TokenKey, to peer: PeerIdentity?,
                 accept: String?) -> (HTTPFields, ByteBuffer) {
        let fingerprint = token.fingerprint.description
        if let peer { audit.record(peer, key: key, fingerprint: fingerprint) }
        // Appended, not set: setting a field looks for one of its name first. Room for the
        // length and date the held route adds.
        var headers = HTTPFields()
        headers.reserveCapacity(6)
        headers.append(HTTPField(name: Self.fingerprintHeader, value: fingerprint))
        headers.append(HTTPField(name: .cacheControl, value: "no-store"))
        if accept.map(Self.prefersPlainText) == true {
            headers.append(HTTPField(name: .contentType, value: "text/plain; charset=utf-8"))
            return (headers, ByteBuffer(string: token.value))
        }
        // The hot route writes its six fields itself: JSONSerialization (with sorted keys,
        // each a locale-aware comparison) was nine tenths of the route's cost. Straight into
        // the answer's buffer: the token is copied once, and no string is built on the way.
        headers.append(HTTPField(name: .contentType, value: "application/json"))
        var body = ByteBuffer()
        body.reserveCapacity(token.value.utf8.count + key.subjectID.utf8.count + 128)
        body.writeStaticString("{\"expires_at\":\"")
        Self.writeTimestamp(token.expiresAt, to: &body)
        body.writeStaticString("\",\"fingerprint\":\"")
        body.writeString(fingerprint)
        body.writeStaticString("\",\"id\":")
        JSONText.writeQuoted(key.subjectID, to: &body)
        body.writeStaticString(",\"kind\":\"")
        body.writeString(key.kind.rawValue)
        body.writeStaticString("\",\"source\":\"")
        body.writeString(source.rawValue)
        body.writeStaticString("\",\"token\":")
        JSONText.writeQuoted(token.value, to: &body)
        body.writeStaticString("}")
        return (headers, body)
    }

    func invalidate(_ context: TokenAPIRequestContext) async throws -> Response {
        let key: TokenKey
        switch subject(context) {
        case .failure(let refusal): return refusal.response
        case .success(let found): key = found
        }
        if let refusal = invalidationRefusal(key) {
            return Self.json(.serviceUnavailable, ["error": refusal], headers: [.retryAfter: "10"])
        }
        switch limiter.admit(key, now: .now) {
        case .allowed:
            await engine.invalidate(key)
            logger.info("token invalidated by a local client", metadata: ["key": "\(key)"])
            return Response(status: .noContent)
        case .limited(let retryAfter):
            return Self.json(.tooManyRequests, [
                "error": "\(key) was invalidated less than \(Int(configuration.invalidateInterval)) s ago; the token served now is the one fetched since",
            ], headers: [.retryAfter: "\(max(1, Int(retryAfter.rounded(.up))))"])
        }
    }

    /// Why an invalidation of `key` is not taken now, or nil. The invalidation of a subject the
    /// agent neither holds nor tracks keeps a slot in memory until its removal reaches the store;
    /// while the store takes no writes (a full disk, a failover) those slots stay, so they are
    /// capped as the subjects asked for through patterns are (``Configuration/maxDynamicSubjects``):
    /// a caller allowed `trip:*` cannot grow memory by invalidating made-up ids meanwhile.
    package func invalidationRefusal(_ key: TokenKey) -> String? {
        let waiting = engine.removalsWaitingForUnheldSubjects
        guard waiting >= configuration.maxDynamicSubjects, !engine.holds(key), !engine.isTracked(key) else { return nil }
        return "\(waiting) invalidated subjects the agent does not hold are waiting for the store to take their removal (it may not be taking writes: see /readyz); retry later"
    }

    /// `503` when `key` would be one more pattern-allowed subject than
    /// ``Configuration/maxDynamicSubjects``; nil when it may be served.
    func capRefusal(_ key: TokenKey) -> Response? {
        guard let refusal = dynamicCapRefusal(key) else { return nil }
        return Self.json(.serviceUnavailable, ["error": refusal], headers: [.retryAfter: "60"])
    }

    /// Why `key` may not be served now, or nil: it would be one more subject asked for through
    /// allow patterns than ``Configuration/maxDynamicSubjects`` (retry in a minute).
    package func dynamicCapRefusal(_ key: TokenKey) -> String? {
        // Held but not tracked: what requests brought in. (Concurrent requests for new ids
        // may pass together, so the cap can be exceeded by at most the requests in flight.)
        guard !engine.holds(key), !engine.isTracked(key),
              engine.heldCount - engine.tracked.keys.count >= configuration.maxDynamicSubjects,
              !subjectsInForce.state.withLock({ $0.allowList.subjects.contains(key) }) else { return nil }
        return "the agent already holds \(configuration.maxDynamicSubjects) subjects asked for through allow patterns (--max-dynamic-subjects); unused ones are dropped after the idle window: retry later, or raise the cap"
    }

    func subjects(_ request: Request, _ context: TokenAPIRequestContext) async -> Response {
        let clients = subjectsInForce.state.withLock { $0.clients }
        if !clients.isEmpty && context.peer == nil {
            return Self.json(.forbidden, ["error": "the caller could not be identified: with client rules (--allow-client), subjects are listed on Unix sockets only"])
        }
        limiter.sweep(now: .now, budget: 4096)
        let query = request.uri.queryParameters
        var limit = configuration.subjectsPageSize
        if let text = query["limit"] {
            guard let value = Int(text), value > 0, value <= 100_000 else {
                return Self.json(.badRequest, ["error": "limit must be a whole number from 1 to 100000"])
            }
            limit = value
        }
        var after: TokenKey?
        if let text = query["after"] {
            let decoded = String(text)  // query values arrive percent-decoded
            guard let slash = decoded.firstIndex(of: "/"), let kind = TokenKind(rawValue: String(decoded[..<slash])),
                  let key = try? TokenKey(kind: kind, subjectID: String(decoded[decoded.index(after: slash)...])) else {
                return Self.json(.badRequest, ["error": "after must be KIND/ID, as the last subject of the previous page"])
            }
            after = key
        }
        // With client rules, a caller sees only the subjects granted to it, filtered before
        // paging: a page and its next link name nothing else.
        let peer = context.peer
        let page = await engine.subjects(after: after, limit: limit) { key in
            clients.isEmpty || peer.map { clients.allows(key, for: $0) } == true
        }
        var headers: HTTPFields = [:]
        if page.count == limit, let last = page.last {
            let id = last.key.subjectID.addingPercentEncoding(withAllowedCharacters: Self.unreservedASCII) ?? last.key.subjectID
            headers[HTTPField.Name("Link")!] = "</v1/subjects?limit=\(limit)&after=\(last.key.kind.rawValue)/\(id)>; rel=\"next\""
        }
        headers[.contentType] = "application/json"
        return Response(status: .ok, headers: headers, body: .init(byteBuffer: Self.subjectsPage(page)))
    }

    /// RFC 3986's unreserved characters, ASCII only (a header carries no raw UTF-8).
    static let unreservedASCII = CharacterSet(charactersIn: "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")

    func readiness() async -> Response {
        let (readiness, clients) = subjectsInForce.state.withLock { ($0.readiness, $0.clients) }
        var report = ReadinessReport(storeProblem: storeWrites.problem, namesSubjects: clients.isEmpty)
        engine.forEachStanding(among: readiness) { key, standing in
            guard !standing.isUsable else { return }
            report.addUnusable(key) {
                standing.failure.map { ": last error \($0.lastErrorKind), next attempt at \(Self.timestamp($0.nextAttemptAt))" } ?? ""
            }
        }
        return report.isReady ? Self.json(.ok, ["status": "ready"])
            : Self.json(.serviceUnavailable, ["status": "not ready", "reasons": report.reasons])
    }

    func metrics() -> Response {
        guard let text = configuration.metricsText?() else {
            return Self.json(.notFound, ["error": "no metrics backend"])
        }
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                        body: .init(byteBuffer: ByteBuffer(string: text)))
    }
}
