// Shared by the test targets: traits that keep the suite's load within what a 2-core machine
// can carry. Swift Testing starts every test at once; on 2 cores a few hundred tests starting
// together (processes, servers, stores) delayed a loopback answer by over 15 s in fresh-clone CI
// runs, which says nothing about the code under test.

import Foundation
import Testing

/// One test case at a time among those marked `.exclusive` (on the test or its suite), across
/// all test targets of the process.
public struct ExclusiveTrait: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        try await TestGate.enter(test, function)
    }
}

extension Trait where Self == ExclusiveTrait {
    /// Runs each test case alone among other `.exclusive` ones.
    public static var exclusive: ExclusiveTrait { ExclusiveTrait() }
}

/// At most ``TestGate/pacedWidth`` test cases of `.paced` suites run at once, across all test
/// targets of the process; the others wait their turn before they start (their own time bounds
/// start with them). Every suite carries it.
public struct PacedTrait: SuiteTrait, TestTrait, TestScoping {
    public var isRecursive: Bool { true }

    /// Each test case on its own: a suite's scope would hold a slot for all of its tests.
    public func scopeProvider(for test: Test, testCase: Test.Case?) -> PacedTrait? {
        testCase == nil ? nil : self
    }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        try await TestGate.enter(test, function)
    }
}

extension Trait where Self == PacedTrait {
    /// Waits for one of the suite's shared slots before each test case starts.
    public static var paced: PacedTrait { PacedTrait() }
}

extension TestGate {
    /// Runs `function` holding what `test`'s traits ask for, whichever trait's scope comes first,
    /// always in one order: the exclusive turn, then a paced slot. So a test case waiting for its
    /// exclusive turn holds no paced slot (which would leave the others idle), and no two test
    /// cases can wait on each other.
    static func enter(_ test: Test, _ function: @Sendable () async throws -> Void) async throws {
        if !exclusiveHeld && test.traits.contains(where: { $0 is ExclusiveTrait }) {
            return try await exclusive.run { try await $exclusiveHeld.withValue(true) { try await enter(test, function) } }
        }
        if !pacedHeld && test.traits.contains(where: { $0 is PacedTrait }) {
            return try await paced.run { try await $pacedHeld.withValue(true) { try await function() } }
        }
        try await function()
    }
}

/// A FIFO async counting gate.
actor TestGate {
    static let exclusive = TestGate(slots: 1)
    static let paced = TestGate(slots: pacedWidth)
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
