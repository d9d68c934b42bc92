// Shared by the test targets: seeded randomness (SplitMix64), so jitter and fault schedules vary
// between cases but a run repeats, and a failing run can be replayed from its seed.

import Synchronization

/// SplitMix64: a tiny seeded generator.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Deterministic uniform values in 0...1 from a ``SeededGenerator``, shareable between tasks
/// (an engine's `random:` closure).
public final class SeededRandom: Sendable {
    private let generator: Mutex<SeededGenerator>

    public init(seed: UInt64) { generator = Mutex(SeededGenerator(seed: seed)) }

    /// The next value in 0...1.
    public func next() -> Double {
        let value = generator.withLock { $0.next() }
        return Double(value >> 11) / Double(1 << 53)
    }
}
