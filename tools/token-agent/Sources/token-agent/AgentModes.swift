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
            throw error
        }
        await printer.value
    }
}

/// What the agent prints on stdout: a readable line per event, or JSON.
struct AgentOutput: Sendable {
    let json: Bool

    func print(_ event: TokenSyncEvent) {
        var stamps = TimestampCache()
        emit(line(for: event, now: Date(), stamps: &stamps))
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
    /// store, as ``print(_:)`` writes it, written in blocks rather than line by line: at start-up
    /// this is a line per subject, and the API listens only after it (a 100,000-subject start
    /// spent 0.75 s here, a write and a formatter per line).
    func printReused(_ keys: [TokenKey], engine: TokenSyncEngine) {
        var block = ""
        var lines = 0
        var stamps = TimestampCache()
        for key in keys {
            guard let held = engine.heldToken(for: key), held.source == .store else { continue }
            let event = TokenSyncEvent.refreshed(key: key, fingerprint: held.token.fingerprint, expiresAt: held.token.expiresAt, source: .store)
            block += line(for: event, now: Date(), stamps: &stamps)
            block += "\n"
            lines += 1
            if lines == 1024 {
                write(block)
                (block, lines) = ("", 0)
            }
        }
        if !block.isEmpty { write(block) }
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
        write(line + "\n")
    }

    private func write(_ text: String) {
        FileHandle.standardOutput.write(Data(text.utf8))
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

#if canImport(Glibc)
/// glibc's `malloc_trim` (malloc.h, which the Glibc module does not import).
@_silgen_name("malloc_trim")
func releaseFreedMemory(_ pad: Int) -> Int32
#endif
