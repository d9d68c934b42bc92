// A reloaded subject list (TokenAPI.replaceSubjects): subjects no longer listed stay allowed
// while a program still uses them (memory holds them), not for the rest of the process. Each
// reload used to add its subjects to the allowed set for good: an automation adding and removing
// trips through the subjects file grew it with every trip ever listed, and kept every finished
// trip allowed. In-process engine on a real SQLite store; no listener needed.

@testable import FleetTokenService
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Logging
import TestSupportKit
import Testing

@Suite("token API: a reloaded subject list", .paced)
struct SubjectReplacementTests {
    @Test("removed subjects stay allowed while memory holds them; those it does not are dropped at the next reload, so the set does not grow")
    func allowedFollowsUse() async throws {
        let scratch = Scratch()
        let logger = Logger(label: "subject-replacement-test")
        let fetcher = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
        let store = try SQLiteTokenRepository(path: scratch.file("tokens.sqlite"), logger: logger)
        defer { store.close() }
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger)
        let (used, unused) = (try TokenKey.vehicle("used"), try TokenKey.vehicle("unused"))
        let api = TokenAPI(engine: engine, configuration: .init(allowList: .init(subjects: [used, unused]), readinessSubjects: [used, unused]),
                           logger: logger)
        _ = try await engine.token(for: used)
        func allowed() -> Set<TokenKey> { api.subjectsInForce.state.withLock { $0.allowList.subjects } }

        // Both removed: the one in use stays allowed, the other is not.
        let first = try TokenKey.trip("t-0")
        api.replaceSubjects([first])
        #expect(allowed() == [first, used])
        #expect(api.subjectsInForce.state.withLock { $0.readiness } == [first])

        // A thousand reloads, each listing one new trip nobody asked for: no growth.
        for index in 1...1_000 { api.replaceSubjects([try TokenKey.trip("t-\(index)")]) }
        #expect(allowed() == [try TokenKey.trip("t-1000"), used])
        await engine.shutdown()
    }
}
