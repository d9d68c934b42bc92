import FleetEngineProxy
import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Foundation
import Logging
import ServiceLifecycle
import UnixSignals
#if canImport(Glibc)
import Glibc
#endif

/// `--once`: each subject gets a token before its soft point when possible (stored, or one
/// fetch attempt; none while backing off), printed as a line or a JSON array.
struct OnceRun {
    let engine: TokenSyncEngine
    let keys: [TokenKey]
    let output: AgentOutput
    /// The store as `tokenctl --db` takes it, quoted for a shell (for the "retry now" command).
    let storeArgument: String

    /// Returns true when some subject has no usable token.
    func run() async -> Bool {
        let engine = self.engine
        // The engine's own clock: a failure recorded before this was an earlier attempt's.
        let started = TokenSyncEngine.coarseWallClock()
        let results = await withTaskGroup(of: (Int, Result<(StoredToken, TokenSource), TokenUnavailable>).self) { group in
            for (index, key) in keys.enumerated() {
                group.addTask {
                    do throws(TokenUnavailable) {
                        let result = try await engine.freshToken(for: key)
                        return (index, .success((result.token, result.source)))
                    } catch {
                        return (index, .failure(error))
                    }
                }
            }
            return await group.reduce(into: [Int: Result<(StoredToken, TokenSource), TokenUnavailable>]()) { $0[$1.0] = $1.1 }
        }
        var served: [(StoredToken, TokenSource)] = []
        var failures: [OnceFailureReport] = []
        let now = Date()
        for index in keys.indices {
            switch results[index]! {
            case .success(let result): served.append(result)
            case .failure(let error):
                let report = OnceFailureReport(error, failure: engine.status(of: error.key).failure, started: started,
                                               storeArgument: storeArgument)
                failures.append(report)
                FileHandle.standardError.write(Data("token-agent: \(report.text(now: now))\n".utf8))
            }
        }
        output.printOnce(served, failures: failures)
        return !failures.isEmpty
    }
}

/// The services the long-lived mode runs beside the engine, each optional.
struct LongLivedServices {
    /// The local token API (its service when listening) and the Fleet Engine proxy (when
    /// listening), which shares the API's access rules.
    var api: (service: TokenAPIService?, api: TokenAPI, proxy: FleetEngineProxyService?)?
    /// The file sink (`--sink`), when writing token files.
    var sink: TokenFileSink?
    /// What systemd is told (a no-op without `NOTIFY_SOCKET`).
    var reports: ServiceManagerReports?
    /// `--exit-on-permanent-error`.
    var permanentErrors: PermanentErrorWatch?
}

/// The default mode: track every subject, print refresh events, stop cleanly on SIGTERM/SIGINT.
struct LongLivedRun {
    let engine: TokenSyncEngine
    let keys: [TokenKey]
    let output: AgentOutput
    let logger: Logger
    let services: LongLivedServices
    /// What SIGHUP and a changed config file do.
    let reloader: AgentReloader
    /// Frees the store's caches after the start-up load, and after many idle subjects were dropped.
    var releaseStoreMemory: @Sendable () -> Void = {}

    func run() async throws {
        IdleMemoryRelease.fixMallocMapThreshold()
        let events = engine.events()
        let printer = Task { for await event in events { output.print(event) } }
        let reload = await ConfigReloadService.trappingHangups(reloader)
        await engine.track(keys)
        releaseStoreMemory()
        #if canImport(Glibc)
        // Loading thousands of stored tokens leaves freed decoding buffers in malloc's arenas:
        // give them back, so the resident size is what the agent holds.
        _ = releaseFreedMemory(0)
        #endif
        // Report what the store already held (no fetching here: signals are not handled until the
        // service group runs); fetched tokens are reported by refresh events.
        output.printReused(keys, engine: engine)
        // Graceful shutdown goes from the last service to the first: what systemd is told and the
        // sink stop before the engine; a failure of the permanent-error watch shuts the group
        // down gracefully, so fetched tokens are still committed.
        var list: [ServiceGroupConfiguration.ServiceConfiguration] = [.init(service: engine)]
        if let service = services.api?.service { list.append(.init(service: service)) }
        if let proxy = services.api?.proxy { list.append(.init(service: proxy)) }
        list.append(.init(service: reload))
        // Memory back after many idle subjects were dropped (IdleMemoryRelease.swift).
        list.append(.init(service: IdleMemoryRelease(engine: engine, releaseStoreMemory: releaseStoreMemory)))
        // A window's withheld event lines are reported when it ends, also when no event follows.
        list.append(.init(service: EventLineReports(output: output)))
        if let sink = services.sink { list.append(.init(service: sink)) }
        if let watch = services.permanentErrors { list.append(.init(service: watch, failureTerminationBehavior: .gracefullyShutdownGroup)) }
        if let reports = services.reports { list.append(.init(service: reports)) }
        let group = ServiceGroup(configuration: .init(services: list, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        logger.notice("token-agent running; stop with SIGTERM or Ctrl-C", metadata: ["subjects": .stringConvertible(keys.count)])
        defer { logger.notice("token-agent stopped") }
        do {
            try await group.run()
        } catch {
            await printer.value
            output.reportWithheldLines(at: Date(), stopping: true)
            throw error
        }
        await printer.value
        output.reportWithheldLines(at: Date(), stopping: true)
    }
}

/// What the agent prints on stdout: a readable line per event, or JSON.
///
/// Per-subject lines (`reused`, `refreshed`, `failed`, `removed`, `tracked`, `untracked`) are
/// within `--max-event-lines` per window (``EventLineBudget``); the store's state and reload
/// summaries always print.
struct AgentOutput: Sendable {
    let json: Bool
    /// The per-subject lines' budget, shared by every copy of this output.
    let gate: EventLineGate

    /// An output of `maxEventLines` per-subject lines (0: no limit) per `eventLineWindow` seconds.
    init(json: Bool, maxEventLines: Int = 0, eventLineWindow: TimeInterval = 30) {
        self.json = json
        gate = EventLineGate(limit: maxEventLines, window: eventLineWindow)
    }

    func print(_ event: TokenSyncEvent) {
        let now = Date()
        var stamps = TimestampCache()
        guard let name = Self.subjectEventName(event) else {
            emit(line(for: event, now: now, stamps: &stamps))
            return
        }
        writeSubjectLines(name, count: 1, at: now) { _, block in block.append(line(for: event, now: now, stamps: &stamps)) }
    }

    /// The budget's name of a per-subject event; nil for the store's state, always printed.
    static func subjectEventName(_ event: TokenSyncEvent) -> String? {
        switch event {
        case .refreshed(_, _, _, let source): source == .store ? "reused" : "refreshed"
        case .refreshFailed: "failed"
        case .removedExternally: "removed"
        case .storeDegraded, .storeRecovered: nil
        }
    }

    /// Writes as many of `count` lines of event `name` as the budget allows at `now` (`lines`
    /// appends the first `allowed` of them), after the report of a window that ended and before
    /// the notice that the next are counted, in one write under the budget's lock.
    func writeSubjectLines(_ name: String, count: Int, at now: Date, _ lines: (_ allowed: Int, inout StdoutBlock) -> Void) {
        gate.withBudget { budget in
            let admission = budget.admit(count, of: name, at: now)
            var block = StdoutBlock()
            if let ended = admission.ended { block.append(withheldLine(ended, limit: budget.limit, at: now)) }
            if admission.allowed > 0 { lines(admission.allowed, &block) }
            if let until = admission.withholdingUntil {
                block.append(json
                    ? Self.encode(["event": "withholding", "limit": String(budget.limit), "until": Self.timestamp(until)])
                    : "\(Self.timestamp(now)) withheld  more than \(budget.limit) event lines in \(Self.seconds(budget.window)): the next are counted, not printed, until \(Self.timestamp(until)) (--max-event-lines)")
            }
            block.flush()
        }
    }

    /// Prints the report of a window that has ended with lines withheld (``EventLineReports``),
    /// or, when `stopping`, what the current window has withheld so far.
    func reportWithheldLines(at now: Date, stopping: Bool) {
        gate.withBudget { budget in
            guard let withheld = stopping ? budget.remaining(at: now) : budget.due(at: now) else { return }
            StdoutBlock.write([withheldLine(withheld, limit: budget.limit, at: now)])
        }
    }

    /// `withheld  1500 event lines from … to … past --max-event-lines 1000: refreshed 500, reused 1000`,
    /// or `{"event":"withheld","count":"1500","reused":"1000",…}`.
    private func withheldLine(_ withheld: EventLineBudget.Withheld, limit: Int, at now: Date) -> String {
        let names = withheld.counts.keys.sorted()
        if json {
            var object = ["event": "withheld", "count": String(withheld.total), "limit": String(limit),
                          "since": Self.timestamp(withheld.since), "until": Self.timestamp(withheld.until)]
            for name in names { object[name] = String(withheld.counts[name] ?? 0) }
            return Self.encode(object)
        }
        let counts = names.map { "\($0) \(withheld.counts[$0] ?? 0)" }.joined(separator: ", ")
        return "\(Self.timestamp(now)) withheld  \(withheld.total) event lines from \(Self.timestamp(withheld.since)) to \(Self.timestamp(withheld.until)) past --max-event-lines \(limit): \(counts); tokenctl list shows every subject"
    }

    /// `30 s`, `1.5 s`.
    private static func seconds(_ interval: TimeInterval) -> String {
        interval == interval.rounded() ? "\(Int(interval)) s" : "\(interval) s"
    }

    /// The line of `event` at `now`, without its newline.
    private func line(for event: TokenSyncEvent, now: Date, stamps: inout TimestampCache) -> String {
        if json { return Self.encode(Self.object(for: event, now: now)) }
        let stamp = stamps.line.text(now)
        switch event {
        case .refreshed(let key, let fingerprint, let expiresAt, let source):
            return "\(stamp) \(source == .store ? "reused   " : "refreshed") \(key) fp=\(fingerprint) expires=\(stamps.expiry.text(expiresAt)) (\(Self.relative(expiresAt, now: now))) source=\(source.rawValue)"
        case .refreshFailed(let key, let error, let failures, let next):
            return "\(stamp) failed    \(key) failures=\(failures) next=\(Self.timestamp(next)) (\(Self.relative(next, now: now))): \(OperatorHints.describe(error))"
        case .removedExternally(let key):
            return "\(stamp) removed   \(key) by another process; fetching again"
        case .storeDegraded(let error):
            return "\(stamp) store-degraded serving from memory: \(OperatorHints.describe(error))"
        case .storeRecovered:
            return "\(stamp) store-recovered"
        }
    }

    /// The last whole second written in each of the two times of a line (its own, a token's
    /// expiry) with its text: lines written together mostly repeat both, so each is formatted
    /// about once per second.
    struct TimestampCache {
        struct Last {
            private var seconds = Int.min
            private var text = ""

            mutating func text(_ date: Date) -> String {
                let time = WallTime(date)
                if time.seconds != seconds { (seconds, text) = (time.seconds, time.utcWholeSeconds) }
                return text
            }
        }

        var line = Last()
        var expiry = Last()
    }

    /// A `reused` line (or JSON object) for each of `keys` whose token `engine` took from the
    /// store, as ``print(_:)`` writes it, within the budget, written in blocks rather than line by
    /// line: at start-up this is a line per subject, and the API listens only after it (a
    /// 100,000-subject start spent 0.75 s here, a write and a formatter per line).
    func printReused(_ keys: [TokenKey], engine: TokenSyncEngine) {
        let reused = keys.compactMap { key in engine.heldToken(for: key).flatMap { $0.source == .store ? (key, $0.token) : nil } }
        let now = Date()
        writeSubjectLines("reused", count: reused.count, at: now) { allowed, block in
            var stamps = TimestampCache()
            for (key, token) in reused.prefix(allowed) {
                let event = TokenSyncEvent.refreshed(key: key, fingerprint: token.fingerprint, expiresAt: token.expiresAt, source: .store)
                block.append(line(for: event, now: now, stamps: &stamps))
            }
        }
    }

    /// `--once`'s result: a line per served subject (failures went to stderr as they came), or
    /// one JSON array of served subjects, then failed ones (with `error`).
    func printOnce(_ served: [(StoredToken, TokenSource)], failures: [OnceFailureReport] = []) {
        if json {
            let objects = served.map { token, source in
                [
                    "kind": token.key.kind.rawValue, "id": token.key.subjectID,
                    "expires_at": Self.timestamp(token.expiresAt), "source": source.rawValue,
                    "fingerprint": token.fingerprint.description,
                ]
            } + failures.map(\.object)
            let data = (try? JSONSerialization.data(withJSONObject: objects, options: [.sortedKeys])) ?? Data("[]".utf8)
            emit(String(decoding: data, as: UTF8.self))
            return
        }
        let now = Date()
        for (token, source) in served {
            emit("\(token.key) fp=\(token.fingerprint) expires=\(Self.timestamp(token.expiresAt)) (\(Self.relative(token.expiresAt, now: now))) source=\(source.rawValue)")
        }
    }

    private func emit(_ line: String) {
        writeLines([line])
    }

    /// Writes `lines` in one block under the event lines' lock, so they never land inside
    /// another writer's block (a block of 1,024 lines is more than a pipe writes at once).
    func writeLines(_ lines: [String]) {
        gate.withBudget { _ in StdoutBlock.write(lines) }
    }

    static func object(for event: TokenSyncEvent, now: Date) -> [String: String] {
        switch event {
        case .refreshed(let key, let fingerprint, let expiresAt, let source):
            ["event": source == .store ? "reused" : "refreshed", "kind": key.kind.rawValue, "id": key.subjectID,
             "fingerprint": fingerprint.description, "expires_at": Self.timestamp(expiresAt), "source": source.rawValue]
        case .refreshFailed(let key, let error, let failures, let next):
            ["event": "failed", "kind": key.kind.rawValue, "id": key.subjectID, "error": OperatorHints.describe(error),
             "error_kind": error.kind, "failures": String(failures), "next_attempt_at": Self.timestamp(next)]
        case .removedExternally(let key):
            ["event": "removed", "kind": key.kind.rawValue, "id": key.subjectID]
        case .storeDegraded(let error):
            ["event": "store_degraded", "error": OperatorHints.describe(error)]
        case .storeRecovered:
            ["event": "store_recovered"]
        }
    }

    static func encode(_ object: [String: String]) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data("{}".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    /// `2026-11-23T16:04:05Z`, as Foundation's `.iso8601` style writes it, without a formatter
    /// per call: a 100,000-subject start prints a line per subject.
    static func timestamp(_ date: Date) -> String {
        WallTime(date).utcWholeSeconds
    }

    static func relative(_ date: Date, now: Date) -> String {
        RelativeTime.describe(date, now: now)
    }
}

/// Lines gathered for stdout and written 1,024 at a time: a write per line cost a
/// 100,000-subject start half a second.
struct StdoutBlock {
    private var text = ""
    private var lines = 0

    mutating func append(_ line: String) {
        text += line
        text += "\n"
        lines += 1
        if lines == 1024 { flush() }
    }

    /// Writes what was gathered.
    mutating func flush() {
        guard !text.isEmpty else { return }
        FileHandle.standardOutput.write(Data(text.utf8))
        (text, lines) = ("", 0)
    }

    /// Writes `lines` in blocks, for a caller that already holds the event lines' lock.
    static func write(_ lines: some Sequence<String>) {
        var block = StdoutBlock()
        for line in lines { block.append(line) }
        block.flush()
    }
}

#if canImport(Glibc)
/// glibc's `malloc_trim` (malloc.h, which the Glibc module does not import).
@_silgen_name("malloc_trim")
func releaseFreedMemory(_ pad: Int) -> Int32
#endif
