// Shared by the test targets: a trait that keeps timing-sensitive and process-heavy tests from
// running at the same time as each other. Swift Testing runs everything in parallel; on a
// 2-core machine a dozen processes starting at once can delay a "seen within 1 s" check past
// its bound, which says nothing about the code under test.

import Testing

/// One test (or suite) at a time among those marked `.exclusive`, across all test targets of
/// the process. Reentrant: test cases inside an exclusive test or suite share its turn.
public struct ExclusiveTrait: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        if ExclusiveGate.held {
            try await function()
            return
        }
        await ExclusiveGate.shared.acquire()
        do {
            try await ExclusiveGate.$held.withValue(true) { try await function() }
        } catch {
            await ExclusiveGate.shared.release()
            throw error
        }
        await ExclusiveGate.shared.release()
    }
}

extension Trait where Self == ExclusiveTrait {
    /// Runs the test or suite alone among other `.exclusive` ones.
    public static var exclusive: ExclusiveTrait { ExclusiveTrait() }
}

/// A FIFO async lock.
actor ExclusiveGate {
    static let shared = ExclusiveGate()
    @TaskLocal static var held = false

    private var busy = false
    private var waiters: [CheckedContinuation<Void, Never>] = []

    func acquire() async {
        if !busy {
            busy = true
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    func release() {
        if waiters.isEmpty {
            busy = false
        } else {
            waiters.removeFirst().resume()
        }
    }
}
