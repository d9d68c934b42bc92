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
    /// Whether each test case takes every slot (``alone``) rather than one.
    let takesEverySlot: Bool

    /// Each test case on its own: a suite's scope would hold a slot for all of its tests.
    public func scopeProvider(for test: Test, testCase: Test.Case?) -> PacedTrait? {
        testCase == nil ? nil : self
    }

    public func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        if TestGate.pacedHeld {
            try await function()
            return
        }
        let slots = takesEverySlot ? TestGate.paced.width : 1
        try await TestGate.paced.run(slots: slots) { try await TestGate.$pacedHeld.withValue(true) { try await function() } }
    }
}

extension Trait where Self == PacedTrait {
    /// Waits for one of the suite's shared slots before each test case starts.
    public static var paced: PacedTrait { PacedTrait(takesEverySlot: false) }

    /// Waits for every shared slot before each test case starts: no other test of a `.paced`
    /// suite (every suite of this package) runs beside it; it waits for those running to end,
    /// and those after it wait for it. For a test that measures the whole process, such as its
    /// live heap.
    public static var alone: PacedTrait { PacedTrait(takesEverySlot: true) }
}

extension PacedTrait {
    /// Test cases of `.paced` and `.alone` suites running now (the caller's included): an
    /// `.alone` test checks with it that it is.
    public static var casesRunning: Int {
        get async { await TestGate.paced.holders }
    }
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

    /// The slots there are.
    nonisolated let width: Int
    private var free: Int
    /// Runs holding slots now.
    private(set) var holders = 0
    /// In arrival order; the first waits until enough slots are free, and those after it wait
    /// behind it (a test asking for every slot is not passed by ones asking for one).
    private var waiters: [(slots: Int, resume: CheckedContinuation<Void, Never>)] = []

    init(slots: Int) {
        width = slots
        free = slots
    }

    /// Runs `body` holding `slots` slots (more than the gate's width count as all of them: a
    /// request for more could never be granted, and every run after it would wait for ever).
    nonisolated func run(slots: Int = 1, _ body: @Sendable () async throws -> Void) async throws {
        let slots = min(slots, width)
        await acquire(slots)
        do {
            try await body()
        } catch {
            await release(slots)
            throw error
        }
        await release(slots)
    }

    private func acquire(_ slots: Int) async {
        if waiters.isEmpty, free >= slots {
            free -= slots
            holders += 1
            return
        }
        await withCheckedContinuation { waiters.append((slots, $0)) }
    }

    private func release(_ slots: Int) {
        free += slots
        holders -= 1
        while let first = waiters.first, free >= first.slots {
            free -= first.slots
            holders += 1
            waiters.removeFirst()
            first.resume.resume()
        }
    }
}
