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
        let scratch = Scratch(), logger = Logger(label: "subject-replacement-test")
        let (engine, store) = try Self.engine(scratch, logger)
        defer { store.close() }
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

    // The agent's way (allowsTrackedSubjects): its configured subjects are the engine's tracked
    // keys, which the API allows without a copy of them; the allow list keeps only removed
    // subjects still held. A reload tracks the added keys, replaces, then untracks.
    @Test("with tracked subjects allowed: tracked keys are configured without being listed; removed subjects stay allowed only while held, and are all the list keeps")
    func trackedSubjectsAllowed() async throws {
        let scratch = Scratch(), logger = Logger(label: "subject-replacement-test")
        let (engine, store) = try Self.engine(scratch, logger)
        defer { store.close() }
        let (used, stranger) = (try TokenKey.vehicle("used"), try TokenKey.vehicle("stranger"))
        let asked = try TokenKey.trip("asked-once")
        var configuration = TokenAPI.Configuration(allowList: .init(), readinessSubjects: [used])
        configuration.allowsTrackedSubjects = true
        let api = TokenAPI(engine: engine, configuration: configuration, logger: logger)
        func allowed() -> Set<TokenKey> { api.subjectsInForce.state.withLock { $0.allowList.subjects } }
        var listed = [used]
        var everListed: Set<TokenKey> = [used]
        func reload(_ next: [TokenKey]) async {
            await engine.track(next.filter { !listed.contains($0) })
            api.replaceSubjects(next)
            await engine.untrack(listed.filter { !next.contains($0) })
            listed = next
            everListed.formUnion(next)
        }

        await engine.track(listed)
        #expect(api.accessRefusal(used, peer: nil) == nil)
        #expect(api.accessRefusal(stranger, peer: nil)?.contains("is not a configured subject") == true)
        #expect(allowed().isEmpty, "the configured subjects were copied into the allow list")
        _ = try await engine.token(for: used)

        // Removed: still held, so still allowed, and the only key the list holds.
        let first = try TokenKey.trip("t-0")
        await reload([first])
        #expect(api.accessRefusal(first, peer: nil) == nil)
        #expect(api.accessRefusal(used, peer: nil) == nil)
        #expect(allowed() == [used])
        #expect(api.subjectsInForce.state.withLock { $0.readiness } == [first])

        // A subject listed by one reload and not the next, never held (it was never tracked:
        // listed and removed between two reloads of this test's own making) is refused.
        api.replaceSubjects([first, asked])
        api.replaceSubjects([first])
        #expect(!engine.holds(asked))
        #expect(api.accessRefusal(asked, peer: nil) != nil)

        // A hundred reloads, each listing one new trip: the list holds the removed subjects
        // memory still holds (every trip tracked once keeps its empty entry until the idle rule
        // drops it, which needs the engine's loop), never a listed one.
        for index in 1...100 { await reload([try TokenKey.trip("t-\(index)")]) }
        let removed = try (0..<100).map { try TokenKey.trip("t-\($0)") }
        #expect(removed.allSatisfy { engine.holds($0) })
        #expect(allowed() == Set(removed + [used]))
        #expect(everListed.subtracting(listed) == Set(removed + [used]))
        #expect(!allowed().contains(listed[0]))
        #expect(api.accessRefusal(listed[0], peer: nil) == nil)
        for key in allowed() { #expect(api.accessRefusal(key, peer: nil) == nil) }
        await engine.shutdown()
    }

    /// An engine minting hour-long tokens, on a real SQLite store in `scratch`.
    private static func engine(_ scratch: Scratch, _ logger: Logger) throws -> (TokenSyncEngine, SQLiteTokenRepository) {
        let fetcher = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
        let store = try SQLiteTokenRepository(path: scratch.file("tokens.sqlite"), logger: logger)
        return (TokenSyncEngine(repository: store, fetcher: fetcher, logger: logger), store)
    }
}
