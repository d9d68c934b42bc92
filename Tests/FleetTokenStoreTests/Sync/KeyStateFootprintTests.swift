import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

/// A key's state is held once per subject, a hundred thousand times on a dispatch host: its
/// inline size is memory per subject (tools/benchmarks measures the agent's whole).
@Suite("Key state: small inline, failures out of line", .paced)
struct KeyStateFootprintTests {
    let key = try! TokenKey.vehicle("truck-7")
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    @Test("a key's whole state fits in 200 bytes inline (it took 650 with its failure fields and a flight's entry inline)")
    func inlineSize() {
        #expect(MemoryLayout<KeyRefreshState>.size <= 200, "KeyRefreshState is \(MemoryLayout<KeyRefreshState>.size) bytes")
        #expect(MemoryLayout<RefreshDecision.State?>.size <= 16, "a flight's state is \(MemoryLayout<RefreshDecision.State?>.size) bytes")
    }

    @Test("a failure kept out of line is a value: a copy changed later leaves the original as it was")
    func outOfLineIsAValue() {
        let failure = RefreshFailureState(consecutiveFailures: 2, nextAttemptAt: t0, lastErrorKind: "timeout",
                                          lastErrorMessage: nil, lastFailureAt: t0, configurationDigest: "d1")
        var original = MemoryEntry(token: nil, source: .store, softPoint: .distantPast, usableUntil: .distantPast,
                                   failure: failure, lastError: nil, lastUsed: t0, refreshRequested: false)
        var copy = original
        copy.failure?.consecutiveFailures = 3
        copy.lastError = .timeout(seconds: 5)
        #expect(original.failure?.consecutiveFailures == 2)
        #expect(original.lastError == nil)
        #expect(copy.failure?.consecutiveFailures == 3)
        #expect(copy.lastError?.code == .timeout)
        original.failure = nil
        #expect(original.failure == nil && copy.failure?.configurationDigest == "d1")
    }
}
