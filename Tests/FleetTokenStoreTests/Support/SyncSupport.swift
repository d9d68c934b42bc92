import Clocks
import Foundation
import TestSupportKit
import Logging
import Synchronization
@testable import FleetTokenStore

/// Builds Fleet-Engine-shaped JWTs (unsigned: the signature part is random bytes, as the client
/// never checks it), about 900 bytes like real ones.
enum TestJWT {
    static func make(for key: TokenKey, issuedAt: Date, lifetime: TimeInterval = 3600,
                     authorizationSubject: String? = nil, includeAuthorization: Bool = true,
                     extraClaims: String = "") -> String {
        let header = #"{"alg":"RS256","typ":"JWT","kid":"0123456789abcdef0123456789abcdef01234567"}"#
        let iat = Int(issuedAt.timeIntervalSince1970)
        let exp = Int(issuedAt.addingTimeInterval(lifetime).timeIntervalSince1970)
        let subject = authorizationSubject ?? key.subjectID
        let authorization = includeAuthorization ? #","authorization":{"\#(key.kind.authorizationClaim)":"\#(subject)"}"# : ""
        let payload = """
            {"iss":"fleet-engine-sa@test-project.iam.gserviceaccount.com","sub":"fleet-engine-sa@test-project.iam.gserviceaccount.com",\
            "aud":"https://fleetengine.googleapis.com/","iat":\(iat),"exp":\(exp)\(authorization)\(extraClaims)}
            """
        let signature = Data((0..<256).map { _ in UInt8.random(in: 0...255) })
        return [Data(header.utf8), Data(payload.utf8), signature].map(base64URL).joined(separator: ".")
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }

    /// A token with arbitrary header and payload JSON text.
    static func raw(header: String = #"{"alg":"RS256"}"#, payload: String, signature: String = "c2lnbmF0dXJl") -> String {
        base64URL(Data(header.utf8)) + "." + base64URL(Data(payload.utf8)) + "." + signature
    }
}

/// Scheduling time (a TestClock) and wall time moving together, plus optional wall-clock jumps.
final class TestTime: Sendable {
    let clock = TestClock()
    let start: Date
    private let jump = Mutex<TimeInterval>(0)

    init(start: Date = referenceNow) {
        self.start = start
    }

    /// The wall clock: start + time the test clock advanced + jumps.
    var now: Date {
        let elapsed = TestClock<Duration>.Instant().duration(to: clock.now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        return start.addingTimeInterval(seconds + jump.withLock { $0 })
    }

    var wall: @Sendable () -> Date { { [self] in self.now } }

    func advance(by seconds: TimeInterval) async {
        await clock.advance(by: .milliseconds(Int64(seconds * 1000)))
    }

    /// Moves only the wall clock (NTP step, manual change); scheduling time is unaffected.
    func jumpWallClock(by seconds: TimeInterval) {
        jump.withLock { $0 += seconds }
    }
}

/// A fetcher whose answers a test scripts, counting calls.
final class ScriptedFetcher: TokenFetcher, Sendable {
    typealias Answer = @Sendable (TokenKey, Int) async throws(TokenProviderError) -> FetchedToken

    private let calls = Mutex<[TokenKey: Int]>([:])
    private let answer: Mutex<Answer>
    private let gate = Mutex<[(UUID, CheckedContinuation<Void, Never>)]?>(nil)

    init(_ answer: @escaping Answer) {
        self.answer = Mutex(answer)
    }

    /// Mints valid JWTs of `lifetime` issued at `time.now`.
    static func minting(_ time: TestTime, lifetime: TimeInterval = 3600) -> ScriptedFetcher {
        ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now, lifetime: lifetime)) }
    }

    func setAnswer(_ answer: @escaping Answer) { self.answer.withLock { $0 = answer } }

    /// Holds every fetch until ``open()``.
    func close() { gate.withLock { $0 = $0 ?? [] } }

    func open() {
        let waiters = gate.withLock { state -> [(UUID, CheckedContinuation<Void, Never>)] in
            defer { state = nil }
            return state ?? []
        }
        waiters.forEach { $0.1.resume() }
    }

    var waitingAtGate: Int { gate.withLock { $0?.count ?? 0 } }

    func count(_ key: TokenKey) -> Int { calls.withLock { $0[key] ?? 0 } }
    var total: Int { calls.withLock { $0.values.reduce(0, +) } }

    func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        let n = calls.withLock { calls in
            calls[key, default: 0] += 1
            return calls[key]!
        }
        // Like a real client, a held fetch gives up when its task is cancelled.
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let held = gate.withLock { state -> Bool in
                    guard state != nil, !Task.isCancelled else { return false }
                    state!.append((id, continuation))
                    return true
                }
                if !held { continuation.resume() }
            }
        } onCancel: {
            let waiter = gate.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let index = state?.firstIndex(where: { $0.0 == id }) else { return nil }
                return state?.remove(at: index).1
            }
            waiter?.resume()
        }
        if Task.isCancelled { throw .other(detail: "cancelled") }
        let answer = self.answer.withLock { $0 }
        return try await answer(key, n)
    }
}

/// A repository that counts calls before forwarding them, to prove the hot path does no I/O.
final class CountingRepository: TokenRepository, Sendable {
    let base: SQLiteTokenRepository
    private let counter = Mutex(0)

    init(_ base: SQLiteTokenRepository) { self.base = base }

    var calls: Int { counter.withLock { $0 } }
    private func tick() { counter.withLock { $0 += 1 } }

    func entry(for key: TokenKey) async throws(TokenStoreError) -> TokenEntry? { tick(); return try await base.entry(for: key) }
    func entries(for keys: [TokenKey]) async throws(TokenStoreError) -> [TokenKey: TokenEntry] { tick(); return try await base.entries(for: keys) }
    func acquireRefreshLease(for key: TokenKey, holder: String, now: Date, duration: TimeInterval) async throws(TokenStoreError) -> RefreshLease {
        tick(); return try await base.acquireRefreshLease(for: key, holder: holder, now: now, duration: duration)
    }
    func removeToken(for key: TokenKey) async throws(TokenStoreError) { tick(); try await base.removeToken(for: key) }
    func releaseRefreshLeases(for keys: [TokenKey], holder: String) async throws(TokenStoreError) { tick(); try await base.releaseRefreshLeases(for: keys, holder: holder) }
    func upsert(_ token: StoredToken, clearFailure: Bool) async throws(TokenStoreError) { tick(); try await base.upsert(token, clearFailure: clearFailure) }
    func upsert(_ tokens: [StoredToken], clearFailure: Bool) async throws(TokenStoreError) { tick(); try await base.upsert(tokens, clearFailure: clearFailure) }
    func list(_ filter: TokenFilter, page: TokenPage) async throws(TokenStoreError) -> [TokenEntry] { tick(); return try await base.list(filter, page: page) }
    func purge(_ filter: TokenFilter, scope: PurgeScope) async throws(TokenStoreError) -> Int { tick(); return try await base.purge(filter, scope: scope) }
    func retiredKeys(before cutoff: Date, after: TokenKey?, limit: Int) async throws(TokenStoreError) -> [TokenKey] {
        tick(); return try await base.retiredKeys(before: cutoff, after: after, limit: limit)
    }
    func deleteRetired(_ keys: [TokenKey], before cutoff: Date) async throws(TokenStoreError) -> Int { tick(); return try await base.deleteRetired(keys, before: cutoff) }
    func deleteExpired(before date: Date) async throws(TokenStoreError) -> Int { tick(); return try await base.deleteExpired(before: date) }
    func recordFailure(_ failure: RefreshFailureState, for key: TokenKey) async throws(TokenStoreError) { tick(); try await base.recordFailure(failure, for: key) }
    func clearFailure(for key: TokenKey) async throws(TokenStoreError) { tick(); try await base.clearFailure(for: key) }
    func stats(at now: Date, policy: RefreshPolicy) async throws(TokenStoreError) -> TokenStoreStats { tick(); return try await base.stats(at: now, policy: policy) }
    func changes() -> AsyncStream<TokenStoreChange> { base.changes() }
}

/// An engine on a fresh store in a temporary directory, with a test clock.
struct EngineHarness {
    let dir: TemporaryDirectory
    let time: TestTime
    let store: SQLiteTokenRepository
    let fetcher: ScriptedFetcher
    let engine: TokenSyncEngine
    let log: RecordingLogger

    init(dir: TemporaryDirectory = TemporaryDirectory(), time: TestTime = TestTime(), fetcher: ScriptedFetcher? = nil,
         policy: RefreshPolicy = RefreshPolicy(), random: Double = 0.5) throws {
        self.dir = dir
        self.time = time
        self.store = try openStore(dir.file("tokens.sqlite"))
        self.fetcher = fetcher ?? .minting(time)
        self.log = RecordingLogger()
        self.engine = TokenSyncEngine(repository: store, fetcher: self.fetcher, policy: policy, logger: log.logger,
                                      clock: time.clock, now: time.wall, random: { random })
    }

    /// A second engine on the same store file (its own repository), as another agent would be.
    func sibling(fetcher: ScriptedFetcher? = nil, policy: RefreshPolicy = RefreshPolicy()) throws -> (TokenSyncEngine, SQLiteTokenRepository) {
        let store = try openStore(dir.file("tokens.sqlite"))
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher ?? self.fetcher, policy: policy,
                                     logger: Logger(label: "sibling"), clock: time.clock, now: time.wall, random: { 0.5 })
        return (engine, store)
    }

    /// Starts `run()` in the background; cancel the returned task to stop it.
    func start() -> Task<Void, any Error> {
        let engine = self.engine
        return Task { try await engine.run() }
    }
}
