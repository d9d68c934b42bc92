// Memory given back after a wave of subjects has gone: the engine drops an untracked subject
// nobody asked for within the idle window (a finished trip, an id asked for once), but what
// it freed stays with the process: glibc keeps freed chunks in its arenas (tens of MiB after
// 30,000 subjects came and went, scattered among live ones, so its own trimming of each
// heap's top rarely applies), and SQLite keeps the pages those subjects' reads and writes
// brought into each connection's cache. After a large drop, both are released.

import FleetTokenStore
import ServiceLifecycle

/// The rule, on plain values: release when the engine holds at least ``minimumDrop`` fewer
/// subjects than at its peak since the last release, and at most three quarters of that peak.
struct HeldSubjectsWatermark: Equatable {
    /// Fewest subjects dropped worth a release (each held subject costs a few KiB).
    static let minimumDrop = 100
    /// The most subjects held at one check since the last release.
    private(set) var peak: Int

    init(held: Int) { peak = held }

    /// Records `held`; true when memory should be released now (the peak then starts again from `held`).
    mutating func observe(_ held: Int) -> Bool {
        peak = max(peak, held)
        guard peak - held >= Self.minimumDrop, held * 4 <= peak * 3 else { return false }
        peak = held
        return true
    }
}

/// Checks the engine's held count every ``interval`` and, when ``HeldSubjectsWatermark`` says
/// so, frees the store's caches and calls `malloc_trim(0)`. Costs a counter read per check
/// otherwise; a release takes a few milliseconds (trimming walks the arenas' free chunks).
struct IdleMemoryRelease: Service {
    let engine: TokenSyncEngine
    /// Frees the store's caches (SQLite's page caches and idle readers; nothing for PostgreSQL).
    let releaseStoreMemory: @Sendable () -> Void
    var interval: Duration = .seconds(5)

    func run() async {
        await withTaskGroup(of: Void.self) { group in
            group.addTask { await watch() }
            try? await gracefulShutdown()
            group.cancelAll()
        }
    }

    private func watch() async {
        var watermark = HeldSubjectsWatermark(held: engine.heldCount)
        while !Task.isCancelled {
            do { try await Task.sleep(for: interval) } catch { return }
            guard watermark.observe(engine.heldCount) else { continue }
            releaseStoreMemory()
            #if canImport(Glibc)
            _ = releaseFreedMemory(0)
            #endif
        }
    }
}

extension IdleMemoryRelease {
    /// Keeps glibc's mmap threshold at its 128 KiB default. glibc raises it (up to 32 MiB) each
    /// time a mapped block is freed, so once the engine's tables had doubled a few times, their
    /// next storages (and the API's per-key tables) came from the arenas instead, where a freed
    /// one leaves a hole that live chunks allocated after it pin. Fixed, every block of 128 KiB
    /// or more is mapped and unmapped whole: after 30,000 subjects came and went, the resident
    /// size settled 5.7 MiB lower (tools/benchmarks, the bounded-state figure). The cost, an
    /// mmap and a munmap per such block, falls on table growth and large answers, not on hits.
    static func fixMallocMapThreshold() {
        #if canImport(Glibc)
        _ = setMallocOption(mallocMapThresholdOption, 128 * 1024)
        #endif
    }
}

#if canImport(Glibc)
/// glibc's `mallopt` (malloc.h, which the Glibc module does not import).
@_silgen_name("mallopt")
private func setMallocOption(_ option: Int32, _ value: Int32) -> Int32
/// `M_MMAP_THRESHOLD` of malloc.h.
private let mallocMapThresholdOption: Int32 = -3
#endif

extension IdleMemoryRelease: CustomStringConvertible {
    /// ServiceLifecycle's log lines name services by their description.
    var description: String { "IdleMemoryRelease" }
}
