// Shared by the test targets: traits that keep the suite's load within what a 2-core machine
// can carry. Swift Testing starts every test at once; on 2 cores a few hundred tests starting
// together (processes, servers, stores) delayed a loopback answer by over 15 s in fresh-clone CI
// runs, which says nothing about the code under test.

import Foundation
import Testing

/// One test (or suite) at a time among those marked `.exclusive`, across all test targets of
/// the process. Reentrant: test cases inside an exclusive test or suite share its turn.
public struct ExclusiveTrait: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        if TestGate.exclusiveHeld {
            try await function()
            return
        }
        try await TestGate.exclusive.run { try await TestGate.$exclusiveHeld.withValue(true) { try await function() } }
    }
}

extension Trait where Self == ExclusiveTrait {
    /// Runs the test or suite alone among other `.exclusive` ones.
    public static var exclusive: ExclusiveTrait { ExclusiveTrait() }
}

/// At most ``TestGate/pacedWidth`` test cases of `.paced` suites run at once, across all test
/// targets of the process; the others wait their turn before they start (their own time bounds
/// start with them). Every suite carries it. An `.exclusive` suite waits for its turn before any
/// of its test cases takes a paced slot, so a waiting suite holds none.
public struct PacedTrait: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    /// Each test case on its own: a suite's scope would hold a slot for all of its tests.
    public func scopeProvider(for test: Test, testCase: Test.Case?) -> PacedTrait? {
        testCase == nil ? nil : self
    }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        if TestGate.pacedHeld {
            try await function()
            return
        }
        try await TestGate.paced.run { try await TestGate.$pacedHeld.withValue(true) { try await function() } }
    }
}

extension Trait where Self == PacedTrait {
    /// Waits for one of the suite's shared slots before each test case starts.
    public static var paced: PacedTrait { PacedTrait() }
}

/// A FIFO async counting gate.
actor TestGate {
    static let exclusive = TestGate(slots: 1)
    static let paced: TestGate = {
        CooperativePoolWatchdog.start()
        return TestGate(slots: pacedWidth)
    }()
    @TaskLocal static var exclusiveHeld = false
    @TaskLocal static var pacedHeld = false

    /// Test cases of `.paced` suites running at once: `FTS_TEST_WIDTH`, else 8 per core. Most
    /// tests wait on timers, processes and sockets, so a slot is rarely a busy core.
    static var pacedWidth: Int {
        if let text = ProcessInfo.processInfo.environment["FTS_TEST_WIDTH"], let width = Int(text), width > 0 { return width }
        return 8 * max(1, ProcessInfo.processInfo.activeProcessorCount)
    }

    private var free: Int
    private var waiters: [CheckedContinuation<Void, Never>] = []

    init(slots: Int) {
        free = slots
    }

    /// Runs `body` holding one slot.
    nonisolated func run(_ body: @Sendable () async throws -> Void) async throws {
        await acquire()
        do {
            try await body()
        } catch {
            await release()
            throw error
        }
        await release()
    }

    private func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    private func release() {
        if waiters.isEmpty {
            free += 1
        } else {
            waiters.removeFirst().resume()
        }
    }
}
