// Token service, HTTP layer: the routes of the local token API and the rules every request
// meets (request header, no forwarding headers, access log). Runs on Hummingbird.

public import FleetTokenStore
public import Foundation
public import HTTPTypes
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
///   ``Configuration/invalidateInterval`` of the key's last one.
/// - `GET /v1/subjects`: what the engine holds, without token values.
/// - `GET /healthz`, `GET /readyz`, `GET /metrics`.
///
/// Every request to `/v1/` must carry `Fleet-Token-Request: true` (so that a local proxy or a
/// server-side request forgery cannot fetch tokens), and none may carry `X-Forwarded-For` or
/// `Forwarded`.
public struct TokenAPI: Sendable {
    /// What the API serves and how.
    public struct Configuration: Sendable {
        /// The subjects and patterns clients may ask for.
        public var allowList: SubjectAllowList
        /// The subjects `/readyz` requires a usable token for.
        public var readinessSubjects: [TokenKey]
        /// Shortest time between two forced fetches of one key. Default 10 s.
        public var invalidateInterval: TimeInterval = 10
        /// Prometheus text for `GET /metrics`; nil answers `404`.
        public var metricsText: (@Sendable () -> String)?

        /// A configuration allowing `allowList`, ready when `readinessSubjects` have tokens.
        public init(allowList: SubjectAllowList, readinessSubjects: [TokenKey]) {
            self.allowList = allowList
            self.readinessSubjects = readinessSubjects
        }
    }

    /// The header every token request carries, with the value `true`.
    public static let requestHeader = HTTPField.Name("Fleet-Token-Request")!
    /// The response header naming the served token's fingerprint (also in the access log).
    public static let fingerprintHeader = HTTPField.Name("Fleet-Token-Fingerprint")!

    let engine: TokenSyncEngine
    let configuration: Configuration
    /// The allow list and readiness subjects in force (replaced by ``replaceSubjects(_:)``).
    let subjectsInForce: SubjectsInForce
    let limiter: InvalidationLimiter
    let storeHealth: StoreHealth
    let logger: Logger

    /// An API over `engine`. `storeHealth` is what ``TokenAPIService`` keeps from the engine's events.
    public init(engine: TokenSyncEngine, configuration: Configuration, storeHealth: StoreHealth = StoreHealth(), logger: Logger) {
        self.engine = engine
        self.configuration = configuration
        self.subjectsInForce = SubjectsInForce(allowList: configuration.allowList, readiness: configuration.readinessSubjects)
        self.limiter = InvalidationLimiter(interval: configuration.invalidateInterval)
        self.storeHealth = storeHealth
        self.logger = logger
    }

    /// Replaces the configured subjects (a reloaded subject list): `/readyz` requires these from
    /// now on, and they are allowed without a pattern. Subjects no longer listed stay allowed
    /// until the process restarts, so that a client still using one keeps getting it (the engine
    /// keeps it fresh while it is used); the allow patterns stay.
    public func replaceSubjects(_ subjects: [TokenKey]) {
        subjectsInForce.state.withLock { state in
            state.allowList.subjects.formUnion(subjects)
            state.readiness = subjects
        }
    }

    /// Replaces the allow patterns (a reloaded configuration). Unlike removed subjects, a
    /// removed pattern stops matching at once: patterns are an operator's access rule, and
    /// narrowing one must take effect without a restart.
    public func replaceAllowPatterns(_ patterns: [SubjectAllowList.Pattern]) {
        subjectsInForce.state.withLock { $0.allowList.patterns = patterns }
    }

    /// The router with every route and rule.
    public func router() -> Router<BasicRequestContext> {
        let router = Router(context: BasicRequestContext.self)
        router.add(middleware: AccessRules(logger: logger))
        router.get("/v1/token/:kind/:id") { request, context in try await self.token(request, context) }
        router.post("/v1/invalidate/:kind/:id") { _, context in try await self.invalidate(context) }
        router.get("/v1/subjects") { _, _ in await self.subjects() }
        router.get("/healthz") { _, _ in Self.json(.ok, ["status": "ok"]) }
        router.get("/readyz") { _, _ in await self.readiness() }
        router.get("/metrics") { _, _ in self.metrics() }
        return router
    }

    // MARK: routes

    func token(_ request: Request, _ context: BasicRequestContext) async throws -> Response {
        let key: TokenKey
        switch subject(context) {
        case .failure(let refusal): return refusal.response
        case .success(let found): key = found
        }
        do throws(TokenUnavailable) {
            let (token, source) = try await engine.tokenWithSource(for: key)
            let fingerprint = token.fingerprint.description
            var headers: HTTPFields = [Self.fingerprintHeader: fingerprint, .cacheControl: "no-store"]
            if request.headers[.accept].map(Self.prefersPlainText) == true {
                headers[.contentType] = "text/plain; charset=utf-8"
                return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: token.value)))
            }
            // The hot route writes its six fields itself: JSONSerialization (with sorted keys,
            // each a locale-aware comparison) was nine tenths of the route's cost.
            headers[.contentType] = "application/json"
            var body = "{\"expires_at\":\"" + Self.timestamp(token.expiresAt) + "\",\"fingerprint\":\"" + fingerprint
            body += "\",\"id\":" + JSONText.quoted(key.subjectID) + ",\"kind\":\"" + key.kind.rawValue
            body += "\",\"source\":\"" + source.rawValue + "\",\"token\":" + JSONText.quoted(token.value) + "}"
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: body)))
        } catch {
            return unavailable(error)
        }
    }

    func invalidate(_ context: BasicRequestContext) async throws -> Response {
        let key: TokenKey
        switch subject(context) {
        case .failure(let refusal): return refusal.response
        case .success(let found): key = found
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

    func subjects() async -> Response {
        let list = await engine.subjects().map { status -> [String: Any] in
            var object: [String: Any] = [
                "kind": status.key.kind.rawValue, "id": status.key.subjectID, "tracked": status.tracked,
                "status": status.state.rawValue,
            ]
            object["expires_at"] = status.expiresAt.map(Self.timestamp) ?? NSNull()
            object["fingerprint"] = status.fingerprint?.description ?? NSNull()
            object["source"] = status.source?.rawValue ?? NSNull()
            object["consecutive_failures"] = status.failure?.consecutiveFailures ?? 0
            object["next_attempt_at"] = status.failure.map { Self.timestamp($0.nextAttemptAt) } ?? NSNull()
            object["last_error_kind"] = status.failure?.lastErrorKind ?? NSNull()
            return object
        }
        return Self.json(.ok, list)
    }

    func readiness() async -> Response {
        var reasons: [String] = []
        if let problem = storeHealth.problem { reasons.append("the store cannot be written: \(problem)") }
        for key in subjectsInForce.state.withLock({ $0.readiness }) {
            let status = engine.status(of: key)
            if !status.isUsable {
                let cause = status.failure.map { ": last error \($0.lastErrorKind), next attempt at \(Self.timestamp($0.nextAttemptAt))" } ?? ""
                reasons.append("\(key) has no usable token\(cause)")
            }
        }
        return reasons.isEmpty ? Self.json(.ok, ["status": "ready"])
            : Self.json(.serviceUnavailable, ["status": "not ready", "reasons": reasons])
    }

    func metrics() -> Response {
        guard let text = configuration.metricsText?() else {
            return Self.json(.notFound, ["error": "no metrics backend"])
        }
        return Response(status: .ok, headers: [.contentType: "text/plain; version=0.0.4; charset=utf-8"],
                        body: .init(byteBuffer: ByteBuffer(string: text)))
    }

    // MARK: helpers

    /// The key named by the path, or the refusal: `404` unknown kind, `400` bad id, `403` not allowed.
    func subject(_ context: BasicRequestContext) -> Result<TokenKey, Refusal> {
        let kindText = context.parameters.get("kind") ?? ""
        guard let kind = TokenKind(rawValue: kindText) else {
            return .failure(Refusal(Self.json(.notFound, ["error": "unknown kind: use vehicle, trip, deliveryVehicle or task"])))
        }
        let raw = context.parameters.get("id") ?? ""
        guard let id = raw.contains("%") ? raw.removingPercentEncoding : raw else {
            return .failure(Refusal(Self.json(.badRequest, ["error": "the id is not valid percent-encoding"])))
        }
        let key: TokenKey
        do {
            key = try TokenKey(kind: kind, subjectID: id)
        } catch {
            return .failure(Refusal(Self.json(.badRequest, ["error": error.description])))
        }
        guard subjectsInForce.state.withLock({ $0.allowList.allows(key) }) else {
            return .failure(Refusal(Self.json(.forbidden, ["error": "\(key) is not a configured subject and matches no allow pattern"])))
        }
        return .success(key)
    }

    func unavailable(_ error: TokenUnavailable) -> Response {
        let lastError: String
        switch error.reason {
        // The kind only: a provider's message can quote what it was sent.
        case .provider(let providerError): lastError = providerError.kind
        case .store: lastError = "store"
        case .shuttingDown: lastError = "shutting_down"
        }
        var object: [String: Any] = ["error": "no usable token for \(error.key)", "last_error_kind": lastError]
        var headers: HTTPFields = [:]
        if let next = error.nextAttemptAt {
            object["next_attempt_at"] = Self.timestamp(next)
            headers[.retryAfter] = "\(max(1, Int(next.timeIntervalSinceNow.rounded(.up))))"
        }
        return Self.json(.serviceUnavailable, object, headers: headers)
    }

    static func prefersPlainText(_ accept: String) -> Bool {
        let types = accept.split(separator: ",").map { $0.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() } ?? "" }
        guard let plain = types.firstIndex(of: "text/plain") else { return false }
        return types.firstIndex(of: "application/json").map { plain < $0 } ?? true
    }

    /// `2026-11-23T12:53:27Z` (UTC, whole seconds), as `Date.ISO8601FormatStyle` writes it,
    /// without a formatter per call.
    static func timestamp(_ date: Date) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        guard gmtime_r(&seconds, &parts) != nil else { return date.formatted(.iso8601) }
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
    }

    static func json(_ status: HTTPResponse.Status, _ object: Any, headers: HTTPFields = [:]) -> Response {
        var headers = headers
        headers[.contentType] = "application/json"
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data("{}".utf8)
        return Response(status: status, headers: headers, body: .init(byteBuffer: ByteBuffer(bytes: data)))
    }

    /// A response refusing a request, as an error value.
    struct Refusal: Error {
        let response: Response
        init(_ response: Response) { self.response = response }
    }
}

/// The allow list and readiness subjects in force, shared by every copy of a ``TokenAPI`` (the
/// router's closures hold copies) so that a reload reaches them all.
final class SubjectsInForce: Sendable {
    let state: Mutex<(allowList: SubjectAllowList, readiness: [TokenKey])>

    init(allowList: SubjectAllowList, readiness: [TokenKey]) {
        state = Mutex((allowList, readiness))
    }
}

/// Whether the store can be written, as the engine's events last said. Shared by the API's
/// readiness check and the service that follows the events.
public final class StoreHealth: Sendable {
    private let state = Mutex<String?>(nil)

    /// A healthy store.
    public init() {}

    /// The last write failure, or nil when writes work.
    public var problem: String? { state.withLock { $0 } }

    /// Records the engine's store events.
    public func record(_ event: TokenSyncEvent) {
        switch event {
        case .storeDegraded(let error): state.withLock { $0 = error.description }
        case .storeRecovered: state.withLock { $0 = nil }
        default: break
        }
    }
}

/// The rules every request meets, and the access log (kind, id, status, fingerprint, latency;
/// never a token).
struct AccessRules: RouterMiddleware {
    typealias Context = BasicRequestContext
    let logger: Logger

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        let started = ContinuousClock.now
        let response: Response
        if request.headers[.init("X-Forwarded-For")!] != nil || request.headers[.init("Forwarded")!] != nil {
            response = TokenAPI.json(.forbidden, ["error": "requests through a proxy are refused (X-Forwarded-For or Forwarded present)"])
        } else if request.uri.path.hasPrefix("/v1/"), request.headers[TokenAPI.requestHeader]?.lowercased() != "true" {
            response = TokenAPI.json(.forbidden, ["error": "add the header Fleet-Token-Request: true"])
        } else {
            do {
                response = try await next(request, context)
            } catch let error as HTTPError {
                response = TokenAPI.json(error.status, ["error": error.body ?? error.status.reasonPhrase])
            }
        }
        // Built only when the log level lets it through (the metadata is an autoclosure).
        logger.info("token API request", metadata: Self.metadata(request, response, since: started))
        return response
    }

    static func metadata(_ request: Request, _ response: Response, since started: ContinuousClock.Instant) -> Logger.Metadata {
        var metadata: Logger.Metadata = [
            "method": "\(request.method)", "path": "\(request.uri.path)", "status": "\(response.status.code)",
            "latency_ms": "\(milliseconds(ContinuousClock.now - started))",
        ]
        if let fingerprint = response.headers[TokenAPI.fingerprintHeader] { metadata["fingerprint"] = "\(fingerprint)" }
        return metadata
    }

    static func milliseconds(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        return String(format: "%.2f", Double(seconds) * 1000 + Double(attoseconds) / 1e15)
    }
}
