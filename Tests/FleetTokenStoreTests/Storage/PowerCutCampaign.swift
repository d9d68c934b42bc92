// Power cuts through any workload (issue 30 item 1): a workload starts each round from a
// template store made outside the VFS (on disk, durable), works through the VFS until the cut
// or its end, and says what it promised; the files the cut left are then checked without the
// VFS: integrity_check ok, the store opens without quarantine at the latest schema, and the
// workload's own promise holds. The engine's workload keeps its own round (PowerLossTests).

import FleetTokenStoreTesting
import Foundation
import GRDB
import Logging
import PowerLossVFS
import TestSupportKit
@testable import FleetTokenStore

/// A workload whose store the power is cut under.
protocol PowerCutWorkload: Sendable {
    /// What the workload promised by the time of the cut (or its end).
    associatedtype Promise: Sendable

    /// The store file every round starts from: made outside the VFS and closed cleanly, so
    /// every byte of it is durable.
    var template: String { get }

    /// Works on the store at `path` until the work is done or the power is cut (every store
    /// call fails from then on), and returns what it promised and any stall it saw (a workload
    /// that stops making progress before its cut tests nothing).
    /// - Throws: what failed before a cut (after one, failures are the point).
    func run(path: String) async throws -> (Promise, stalls: [String])

    /// Checks the file as SQLite alone sees it, before this build opens (and migrates) it.
    func checkRaw(_ db: Database, promise: Promise) throws -> [String]

    /// Checks the store this build reopened against the promise.
    func check(_ store: SQLiteTokenRepository, promise: Promise) async throws -> [String]
}

extension PowerCutWorkload {
    func checkRaw(_ db: Database, promise: Promise) throws -> [String] { [] }
}

/// Every log of a power-cut round goes nowhere: the cut makes stores log their I/O errors.
let powerCutLogger = Logger(label: "power-loss") { _ in SwiftLogNoOpLogHandler() }

/// True once the power is cut: a failure then is the cut's, not the workload's.
var powerIsCut: Bool { powerloss_has_cut() != 0 }

/// How many power cuts a CI run makes in all (`FTS_POWER_LOSS_CUTS`, default 100; the soak
/// sets 1,000), and each test's share of them.
enum PowerCutBudget {
    static var total: Int {
        ProcessInfo.processInfo.environment["FTS_POWER_LOSS_CUTS"].flatMap { Int($0) }.map { max(1, $0) } ?? 100
    }

    /// `percent` of ``total``, at least one.
    static func share(_ percent: Int) -> Int { max(1, total * percent / 100) }
}

/// A workload's rounds: one uncut (it must keep its whole promise too, and counts the watched
/// operations), then `cuts` rounds cut at seeded random operations.
struct PowerCutCampaign<Workload: PowerCutWorkload> {
    let name: String
    let workload: Workload
    let baseSeed: UInt64

    /// What the rounds saw.
    struct Summary {
        var operations: Int64 = 0
        var cuts = 0
        var outcome = powerloss_outcome()
        var findings: [String] = []

        /// The line the soak collects.
        func line(name: String, seed: UInt64, rounds: Int) -> String {
            "power loss \(name): seed \(seed), \(operations) operations uncut, \(cuts) cuts of \(rounds); unsynced writes at the cuts \(outcome.unsynced): kept \(outcome.kept), dropped \(outcome.dropped), torn \(outcome.torn); findings \(findings.count)"
        }
    }

    func run(cuts rounds: Int) async throws -> Summary {
        var summary = Summary()
        let calibration = try await round(seed: baseSeed, cutAt: 0)
        summary.operations = calibration.operations
        summary.findings += calibration.findings.map { "uncut: \($0)" }
        var random = SeededGenerator(seed: baseSeed)
        for index in 0..<rounds {
            let seed = baseSeed &+ UInt64(index)
            var result = try await round(seed: seed, cutAt: Int64.random(in: 1...max(1, calibration.operations), using: &random))
            // A run of fewer operations than the calibration's (a concurrent engine batches
            // differently) ended before its cut: cut again within what this run did.
            if !result.cut { result = try await round(seed: seed, cutAt: Int64.random(in: 1...max(1, result.operations), using: &random)) }
            if result.cut { summary.cuts += 1 }
            let outcome = powerloss_last_outcome()
            summary.outcome.unsynced += outcome.unsynced
            summary.outcome.kept += outcome.kept
            summary.outcome.dropped += outcome.dropped
            summary.outcome.torn += outcome.torn
            summary.findings += result.findings
        }
        print(summary.line(name: name, seed: baseSeed, rounds: rounds))
        return summary
    }

    private struct RoundResult {
        var operations: Int64
        var cut: Bool
        var findings: [String]
    }

    private func round(seed: UInt64, cutAt: Int64) async throws -> RoundResult {
        let dir = Scratch()
        defer { withExtendedLifetime(dir) {} }
        // SQLite names files by their resolved path: arm the same spelling.
        let directory = URL(fileURLWithPath: dir.path).resolvingSymlinksInPath().path + "/"
        let path = directory + "tokens.sqlite"
        try FileManager.default.copyItem(atPath: workload.template, toPath: path)
        powerloss_arm(directory, seed, cutAt)
        let promise: Workload.Promise, stalls: [String]
        do {
            (promise, stalls) = try await workload.run(path: path)
        } catch {
            powerloss_disarm()
            throw error
        }
        let result = RoundResult(operations: powerloss_operations(), cut: powerIsCut, findings: [])
        // The power is back: every connection is closed; the files are what the cut left.
        powerloss_disarm()
        let label = "\(name) seed \(seed) cut at \(cutAt)"
        // What a rebooted machine finds: the store and its log as the cut left them, under a new
        // name, so no connection this process failed to close after the cut (a store's close
        // can fail on I/O errors) lends the checks its pre-cut wal-index (-shm): SQLite builds a
        // new one from the log, as after a real power cut.
        let rebooted = Scratch()
        defer { withExtendedLifetime(rebooted) {} }
        let copy = rebooted.file("tokens.sqlite")
        for suffix in ["", "-wal"] where FileManager.default.fileExists(atPath: path + suffix) {
            try FileManager.default.copyItem(atPath: path + suffix, toPath: copy + suffix)
        }
        let findings = stalls + (await check(path: copy, promise: promise)).map { "\(label): \($0)" }
        return RoundResult(operations: result.operations, cut: result.cut, findings: findings)
    }

    /// The checks every workload shares, then the workload's own.
    private func check(path: String, promise: Workload.Promise) async -> [String] {
        guard FileManager.default.fileExists(atPath: path) else { return ["the store file is gone"] }
        var findings: [String] = []
        do {
            let queue = try DatabaseQueue(path: path)
            findings += try await queue.read { db in
                let lines = try String.fetchAll(db, sql: "PRAGMA integrity_check")
                return (lines == ["ok"] ? [] : ["integrity_check \(lines.prefix(3))"]) + (try workload.checkRaw(db, promise: promise))
            }
            try queue.close()
        } catch {
            findings.append("SQLite cannot read the file: \(error)")
        }
        do {
            let store = try openStore(path, configure: { $0.integrityCheck = .beforeOpening }, logger: powerCutLogger)
            defer { store.close() }
            if store.openReport.quarantinedTo != nil {
                findings.append("quarantined (\(store.openReport.corruptionDetail ?? "no detail"))")
            }
            if store.openReport.schemaVersion != SchemaMigrator().latestVersion {
                findings.append("schema version \(store.openReport.schemaVersion)")
            }
            findings += try await workload.check(store, promise: promise)
        } catch {
            findings.append("the store does not open: \(error)")
        }
        return findings
    }
}

/// Waits until every key of `keys` holds a token newer than in `before` (or the power is cut);
/// returns what is committed, and nil when that did not come within a wide bound.
func committedNewer(_ store: SQLiteTokenRepository, _ keys: [TokenKey], than before: [TokenKey: Date]) async -> [TokenKey: Date]? {
    var committed: [TokenKey: Date] = [:]
    let progressed = await eventually(within: 60) {
        if powerIsCut { return true }
        guard let entries = try? await store.entries(for: keys) else { return false }
        committed = entries.compactMapValues { $0.token?.expiresAt }
        return keys.allSatisfy { key in committed[key].map { $0 > before[key] ?? .distantPast } ?? false }
    }
    return progressed ? committed : nil
}

/// Findings for promised tokens the store lost: each key must hold its promised token or a
/// later one (a key's tokens only move forward).
func lostTokens(_ store: SQLiteTokenRepository, promised: [TokenKey: Date]) async throws -> [String] {
    let entries = try await store.entries(for: Array(promised.keys))
    return promised.sorted { "\($0.key)" < "\($1.key)" }.compactMap { key, expiry in
        guard let kept = entries[key]?.token?.expiresAt, kept >= expiry else {
            return "\(key) lost the token expiring \(expiry) (has \(entries[key]?.token?.expiresAt.description ?? "none"))"
        }
        return nil
    }
}

/// Waits until the engine sleeps with nothing to do, or the power is cut, before a test moves
/// its clock: moved while the scheduler is between reading the time and going to sleep, the
/// clock would leave the next refreshes a whole step late (the workload would stall).
func settledOrCut(_ engine: TokenSyncEngine) async {
    _ = await eventually(within: 60) { powerIsCut ? true : await engine.isSettled }
}
