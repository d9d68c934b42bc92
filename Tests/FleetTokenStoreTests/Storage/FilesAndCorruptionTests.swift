import FleetTokenStoreTesting
import Foundation
import TestSupportKit
import GRDB
import Logging
import Testing
@testable import FleetTokenStore

@Suite("Store files: paths, modes and corruption", .paced)
struct FilesAndCorruptionTests {
    @Test("looser modes on an existing store are tightened with a warning; read-only opens only warn")
    func modesTightened() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        try openStore(path).close()
        chmod(path, 0o644)

        let readOnlyLog = LogRecorder()
        let reader = try openStore(path, mode: .readOnly, logger: readOnlyLog.logger)
        reader.close()
        #expect(fileMode(path) == 0o644)
        #expect(readOnlyLog.messages(at: .warning).contains { $0.contains("too open") })

        let log = LogRecorder()
        let store = try openStore(path, logger: log.logger)
        #expect(fileMode(path) == 0o600)
        #expect(store.openReport.tightenedFiles.contains(path))
        #expect(log.messages(at: .warning).contains { $0.contains("set to 0600") })
        store.close()
    }

    @Test("a missing directory is an error when creation is off; a file in the way is 'not writable'")
    func directoryErrors() throws {
        let dir = Scratch()
        let missing = dir.file("absent/tokens.sqlite")
        let error = #expect(throws: TokenStoreError.self) {
            try openStore(missing) { $0.createParentDirectories = false }
        }
        #expect(error == .directoryMissing(path: missing))
        #expect(error?.description.contains("does not exist") == true)

        #expect(FileManager.default.createFile(atPath: dir.file("plain-file"), contents: Data("x".utf8)))
        let blocked = dir.file("plain-file/tokens.sqlite")
        let notWritable = #expect(throws: TokenStoreError.self) { try openStore(blocked) }
        guard notWritable?.code == .directoryNotWritable else {
            Issue.record("expected directoryNotWritable, got \(String(describing: notWritable))")
            return
        }
    }

    @Test("a directory at the store path is refused")
    func directoryAtStorePath() throws {
        let dir = Scratch()
        try FileManager.default.createDirectory(atPath: dir.file("tokens.sqlite"), withIntermediateDirectories: false)
        #expect(throws: TokenStoreError.notAFile(path: dir.file("tokens.sqlite"))) { try openStore(dir.file("tokens.sqlite")) }
    }

    @Test("read-only and admin opens never create a store")
    func readOnlyDoesNotCreate() throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        for mode in [StoreOpenMode.readOnly, .adminReadWrite] {
            let error = #expect(throws: TokenStoreError.self) { try openStore(path, mode: mode) }
            #expect(error == .storeMissing(path: path))
            #expect(error?.description.contains("no token store at \(path)") == true)
        }
        #expect(dir.contents.isEmpty)
    }

    /// Ways a store file goes bad, each applied to a store holding real entries.
    enum Damage: String, CaseIterable, Sendable {
        case randomBytes, truncated, zeroedHeader, corruptPage

        func apply(to path: String) throws {
            let handle = try FileHandle(forUpdating: URL(fileURLWithPath: path))
            defer { try? handle.close() }
            let size = try handle.seekToEnd()
            switch self {
            case .randomBytes:
                try handle.truncate(atOffset: 0)
                try handle.write(contentsOf: Data((0..<8192).map { _ in UInt8.random(in: 0...255) }))
            case .truncated:
                try handle.truncate(atOffset: size / 3)
            case .zeroedHeader:
                try handle.seek(toOffset: 0)
                try handle.write(contentsOf: Data(count: 100))
            case .corruptPage:
                // Garbage over the middle pages (the third to the fifth, whatever the page
                // size the header states): the header is intact, the b-trees are not.
                try handle.seek(toOffset: 16)
                let sizeBytes = try handle.read(upToCount: 2) ?? Data([0x10, 0])
                let pageSize = UInt64(sizeBytes[sizeBytes.startIndex]) << 8 | UInt64(sizeBytes[sizeBytes.startIndex + 1])
                try handle.seek(toOffset: pageSize * 2)
                try handle.write(contentsOf: Data(repeating: 0xA5, count: Int(pageSize) * 3))
            }
        }
    }

    static func makeDamagedStore(_ damage: Damage, in dir: Scratch) async throws -> String {
        let path = dir.file("tokens.sqlite")
        let store = try openStore(path)
        try await store.upsert((0..<300).map { token(try! .vehicle("v\($0)"), expiresIn: 600, value: fakeToken("v\($0)", length: 600)) })
        store.close()
        try damage.apply(to: path)
        return path
    }

    @Test("the agent quarantines a corrupt store, keeps its bytes, logs an error and starts fresh",
          arguments: Damage.allCases)
    func quarantine(_ damage: Damage) async throws {
        let dir = Scratch()
        let path = try await Self.makeDamagedStore(damage, in: dir)
        var damagedHash = sha256(ofFile: path)
        let log = LogRecorder()

        if damage == .corruptPage {
            // Damage inside the b-trees needs the full scan, which a cleanly closed store gets
            // in the background after opening: it reports and marks, and the next open moves
            // the store aside.
            let first = try openStore(path, logger: log.logger)
            #expect(first.openReport.quarantinedTo == nil)
            #expect(!first.openReport.checkedBeforeOpening)
            let finding = await first.deferredCheckFinding()
            #expect(finding != nil, "the background check did not find the damage")
            // The admin check reports it beside its own scan's findings.
            let report = await first.check()
            #expect(report.backgroundIntegrityFinding == finding)
            #expect(report.problems.contains { $0.contains("background integrity check found damage") }, "\(report.problems)")
            #expect(FileManager.default.fileExists(atPath: path + ".needs-check"))
            #expect(log.messages(at: .error).contains { $0.contains("background integrity check") })
            first.close()
            // That session opened the store for writing (and checkpointed on close), so the
            // evidence kept is the file as it was when moved aside.
            damagedHash = sha256(ofFile: path)
        }
        let store = try openStore(path, logger: log.logger)
        let moved = try #require(store.openReport.quarantinedTo, "\(damage) was not detected")
        #expect(!FileManager.default.fileExists(atPath: path + ".needs-check"))
        #expect(moved.hasPrefix(path + ".corrupt-"))
        #expect(sha256(ofFile: moved) == damagedHash)
        #expect(log.messages(at: .error).contains { $0.contains("corrupt") })
        #expect(store.openReport.created)
        #expect(try await store.list(.all).isEmpty)
        try await store.upsert(token(try .trip("after"), expiresIn: 600))
        #expect(try await store.entry(for: try .trip("after")) != nil)
        store.close()
        #expect(try await sqlite3(path, "PRAGMA integrity_check") == "ok")
    }

    @Test("read-only and admin opens report corruption and change nothing", arguments: Damage.allCases)
    func readOnlyReportsCorruption(_ damage: Damage) async throws {
        let dir = Scratch()
        let path = try await Self.makeDamagedStore(damage, in: dir)
        let hash = sha256(ofFile: path)
        for mode in [StoreOpenMode.readOnly, .adminReadWrite, .migrate] {
            // Header damage and truncation are caught by every open at constant cost; damage
            // inside the b-trees only by the full check, asked for here as `tokenctl check` does.
            let error = #expect(throws: TokenStoreError.self) {
                try openStore(path, mode: mode) { if damage == .corruptPage { $0.integrityCheck = .beforeOpening } }
            }
            guard error?.code == .corrupt else {
                Issue.record("\(damage) with \(mode): expected corrupt, got \(String(describing: error))")
                continue
            }
            #expect(error?.description.contains("corrupt") == true)
        }
        #expect(sha256(ofFile: path) == hash)
        #expect(!dir.contents.contains { $0.contains(".corrupt-") })
    }

    // Issue 12 item 8: `tokenctl purge` and `migrate` took 2.3 s because close() waited out the
    // background check's start delay. Here the delay runs on a clock that never moves, with the
    // store's background work running, so a close() that waited for the pending check would never
    // return; the 30 s bound is a safety net, not a goal (close()'s time is the benchmarks'
    // `lifecycle.close_with_pending_check_ms`).
    @Test("close() does not wait for a background check that has not started yet")
    func closeDoesNotWaitForPendingCheck() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let seed = try openStore(path)
        try await seed.upsert(token(try .vehicle("v"), expiresIn: 600))
        seed.close()

        for mode in [StoreOpenMode.agent, .adminReadWrite, .migrate] {
            let store = try openStore(path, mode: mode, pollClock: ManualClock())
            #expect(!store.openReport.checkedBeforeOpening, "the check ran at start-up, so none is pending")
            let work = Task { await store.runBackgroundWork() }
            #expect(await store.closeReturns(within: 30), "close() with mode \(mode) waited for the pending check")
            #expect(!store.backgroundCheckHasRun)
            work.cancel()
            await work.value
        }

        // Left open past the delay, the check still runs to its end.
        let kept = try openStore(path)
        #expect(await kept.deferredCheckFinding() == nil)
        #expect(kept.backgroundCheckHasRun)
        kept.close()
        #expect(try await sqlite3(path, "PRAGMA integrity_check") == "ok")
    }

    // Cancelling the store's work is not closing the store: a check cut short by a cancelled
    // run (an engine's run() ended, a short wait that drove the work) stays to be done, and
    // the next run does it whole. It used to end for good, never having checked anything.
    @Test("a deferred check cut short by cancellation is done whole by the next run of the store's work")
    func cancelledCheckRunsAgain() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let seed = try openStore(path)
        try await seed.upsert(token(try .vehicle("v"), expiresIn: 600))
        seed.close()

        // The start delay passes at once, so the cancellation reaches the check itself.
        let store = try openStore(path, pollClock: UnwaitingClock())
        defer { store.close() }
        #expect(!store.openReport.checkedBeforeOpening)
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            await store.runBackgroundWork()
        }
        await cancelled.value
        #expect(!store.backgroundCheckHasRun)
        #expect(await store.deferredCheckFinding() == nil)
        #expect(store.backgroundCheckHasRun, "the next run of the store's work did the check")
    }

    @Test("a sound store opened after a clean close is not scanned at start-up; after a crash it is")
    func fullCheckOnlyWhenNeeded() async throws {
        let dir = Scratch()
        let path = dir.file("tokens.sqlite")
        let store = try openStore(path)
        try await store.upsert(token(try .vehicle("v"), expiresIn: 600))
        store.close()

        let clean = try openStore(path)
        #expect(!clean.openReport.checkedBeforeOpening)
        #expect(await clean.deferredCheckFinding() == nil)
        try await clean.upsert(token(try .vehicle("w"), expiresIn: 600))
        // Still open: its write-ahead log holds frames, as after a crash.
        let afterCrash = try openStore(path, mode: .readOnly)
        #expect(afterCrash.openReport.checkedBeforeOpening)
        afterCrash.close()
        clean.close()
    }
}

/// A clock whose sleeps end at once, cancelled or not: the deferred check's start delay passes
/// before a cancellation can skip it.
private struct UnwaitingClock: Clock {
    var now: ContinuousClock.Instant { .now }
    var minimumResolution: Duration { .zero }
    func sleep(until deadline: ContinuousClock.Instant, tolerance: Duration?) async throws {}
}
