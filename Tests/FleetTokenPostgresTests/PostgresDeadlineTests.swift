// Issue 30 item 2 (failover freeze): a call's deadline must end the call even when its statement
// does not answer cancellation. postgres-nio's query waits for the server's answer whatever the
// task's cancellation; a deadline that waited for it held a refresh flight, and the fetch slot
// it had, past the deadline, until every slot was held and the agent stopped refreshing.
@testable import FleetTokenPostgres
import Foundation
import Synchronization
import Testing

@Suite("PostgreSQL call deadlines", .paced)
struct PostgresDeadlineTests {
    @Test("withDeadline ends the call when its limit passes, though the operation ignores cancellation")
    func deadlineDoesNotWaitForAnOperationIgnoringCancellation() async throws {
        let statement = UnansweredStatement()
        let call = Task { try await PostgresFailure.withDeadline(.milliseconds(200)) { await statement.wait(); return 1 } }
        // A wide bound, not a timing goal: in the whole suite, tests blocking the cooperative
        // pool's threads (synchronous psql and process waits) delayed the timer by over 10 s once.
        let ended = await Self.ends(call, within: .seconds(60))
        // Answered at last: the operation ends, as a statement does once its connection closes.
        statement.answer()
        #expect(ended, "the call was still waiting 60 s after its 0.2 s deadline")
        await #expect(throws: PostgresFailure.DeadlinePassed.self) { try await call.value }
    }

    @Test("withDeadline returns the operation's value, and its error, when they come first")
    func deadlinePassesThroughWhatComesFirst() async throws {
        #expect(try await PostgresFailure.withDeadline(.seconds(10)) { 7 } == 7)
        struct Refused: Error {}
        await #expect(throws: Refused.self) { try await PostgresFailure.withDeadline(.seconds(10)) { throw Refused() } }
    }

    @Test("a call ended by its deadline is reported as unanswered; one ended by its caller's cancellation as cancelled, never as a timeout")
    func cancellationIsNotATimeout() {
        let timeout = PostgresFailure.storeError(PostgresFailure.DeadlinePassed(), store: "db", statementTimeout: .seconds(30))
        #expect(timeout.code == .databaseUnavailable && timeout.reason == "no answer within 30.0 seconds", "\(timeout)")
        let cancelled = PostgresFailure.storeError(CancellationError(), store: "db", statementTimeout: .seconds(30))
        #expect(cancelled.code == .databaseUnavailable, "\(cancelled)")
        #expect(cancelled.reason == "the call was cancelled before the database answered", "\(cancelled)")
    }

    /// Whether `task` ends within `limit` (polled; the task is not waited for beyond it).
    private static func ends(_ task: Task<Int, any Error>, within limit: Duration) async -> Bool {
        let done = Atomic<Bool>(false)
        let watcher = Task { _ = await task.result; done.store(true, ordering: .relaxed) }
        let until = ContinuousClock.now + limit
        while ContinuousClock.now < until {
            if done.load(ordering: .relaxed) { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        _ = watcher
        return done.load(ordering: .relaxed)
    }
}

/// A statement the server does not answer: its wait ignores cancellation, as a query's does.
private final class UnansweredStatement: Sendable {
    private let state = Mutex<(answered: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    func wait() async {
        await withCheckedContinuation { continuation in
            let answered = state.withLock { state -> Bool in
                if state.answered { return true }
                state.waiter = continuation
                return false
            }
            if answered { continuation.resume() }
        }
    }

    func answer() {
        let waiter = state.withLock { state in
            state.answered = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}
