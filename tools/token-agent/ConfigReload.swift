// Reloading while running: SIGHUP, or a change of the config file (noticed by
// swift-configuration's ReloadingFileProvider), re-reads the config file and the subjects file
// and applies what can change live: subjects, allow patterns, headers and header files, TLS
// files, the log level. Other options keep their old value until a restart, and say so. A
// reload that fails a check changes nothing and says why.

import Configuration
import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging
import ServiceLifecycle
import SystemPackage
import UnixSignals

/// Runs in the service group after the engine, so it is stopped first on graceful shutdown
/// (it ends by itself then) and never tracks into a stopped engine.
struct ConfigReloadService: Service {
    /// Trapped before the engine starts, so that an early SIGHUP never kills the agent.
    let hangups: UnixSignalsSequence
    var reloader: AgentReloader
    /// How often the config file is checked for changes.
    static let pollInterval: Duration = .seconds(5)

    /// Traps SIGHUP now (from here on it no longer ends the process) for a service run later.
    static func trappingHangups(_ reloader: AgentReloader) async -> ConfigReloadService {
        ConfigReloadService(hangups: await UnixSignalsSequence(trapping: .sighup), reloader: reloader)
    }

    func run() async {
        let (start, hangups) = (reloader, self.hangups)
        let (triggers, trigger) = AsyncStream.makeStream(of: ReloadTrigger.self)
        let watched = await watchedFile()
        await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await _ in hangups { trigger.yield(.hangup) }
                }
                if let watched {
                    group.addTask { try? await watched.run() }
                    group.addTask {
                        // The first snapshot is the file as loaded; each later one is a change.
                        try? await watched.watchSnapshot { updates in
                            for try await _ in updates.dropFirst() { trigger.yield(.fileChanged) }
                        }
                    }
                }
                var reloader = start
                for await reason in triggers { await reloader.reload(reason) }
                group.cancelAll()
            }
        }
        trigger.finish()
    }

    /// The config file as swift-configuration's reloading provider follows it; nil without a
    /// file, or when it cannot be followed (SIGHUP still reloads it).
    private func watchedFile() async -> ReloadingFileProvider<YAMLSnapshot>? {
        guard let path = reloader.sources.file?.path else { return nil }
        do {
            return try await ReloadingFileProvider<YAMLSnapshot>(
                filePath: FilePath(path), allowMissing: true, pollInterval: Self.pollInterval, logger: reloader.logger)
        } catch {
            reloader.logger.warning("the config file cannot be followed for changes; SIGHUP still reloads it",
                                    metadata: ["path": "\(path)", "error": "\(error)"])
            return nil
        }
    }
}

// ServiceLifecycle logs each service with `String(describing:)` at debug level: these hold the
// settings (header values) and the whole environment, so they describe themselves by name only.
extension ConfigReloadService: CustomStringConvertible {
    var description: String { "ConfigReloadService(config file: \(reloader.sources.file?.path ?? "none"))" }
}

extension AgentReloader: CustomStringConvertible {
    var description: String { "AgentReloader" }
}

/// Why a reload runs.
enum ReloadTrigger: Sendable {
    /// SIGHUP: everything is read again, TLS files included.
    case hangup
    /// The config file changed on disk.
    case fileChanged
}

/// The settings in force and how to change them. Used by one loop, so plain state.
struct AgentReloader: Sendable {
    let engine: TokenSyncEngine
    /// Flags and environment (fixed for the process) and the config file as last loaded.
    var sources: SettingSources
    let environment: [String: String]
    /// The provider URL template in force (the demo issuer's in demo mode).
    let template: String
    let demo: Bool
    let client: ProviderClient
    let logLevel: LogLevelSetting
    let notifier: SystemdNotifier
    let subjects: ConfiguredSubjects
    let output: AgentOutput
    let logger: Logger
    /// The local token API, whose allowed and readiness subjects follow the reloaded list.
    var api: TokenAPI?
    var settings: AgentSettings
    /// The subjects file's subjects in force.
    var fileSubjects: [TokenKey]
    /// What the sources said at the last reload (or start), restart-only options included: a
    /// file change that says the same again (SIGHUP and the file watch both see one edit) is
    /// not applied twice.
    var lastProposed: AgentSettings

    /// Keys named in one log line at most; the counts are always complete.
    static let keysLogged = 100

    /// What a reload would change, prepared in full before anything is applied.
    private struct Plan {
        var proposed: AgentSettings
        var settings: AgentSettings
        var file: AgentConfigFile?
        var fileSubjects: [TokenKey]
        var keys: [TokenKey]
        var patterns: [SubjectAllowList.Pattern]
        var fetcher: HTTPTokenFetcher?
        /// Options that changed but apply only after a restart.
        var restartNeeded: [String]
        /// Live options that changed.
        var changed: [String]
    }

    /// A reload that cannot be applied: which file, what, and where.
    private struct Refusal: Error {
        let path: String
        let message: String
        var lines = ""
        var subjectsFile = false
    }

    mutating func reload(_ trigger: ReloadTrigger) async {
        if trigger == .hangup && sources.file == nil && settings.subjectsFile == nil && !settings.hasReloadableFiles {
            logger.notice("SIGHUP received: there is nothing to reload (no --config or --subjects-file given); the agent goes on")
            return
        }
        let plan: Plan
        do {
            plan = try await prepare(trigger)
        } catch {
            notifier.reloading(status: "reloading")
            report(error)
            notifier.ready(status: "reload failed: the configuration in force stays")
            return
        }
        if trigger == .fileChanged && plan.proposed == lastProposed && plan.changed.isEmpty && plan.fetcher == nil {
            logger.debug("the config file changed on disk but no option did")
            sources.file = plan.file
            return
        }
        notifier.reloading(status: "reloading")
        await apply(plan, trigger: trigger)
        notifier.ready(status: SubjectCounts(subjects.current.map { engine.status(of: $0) }).description)
    }

    /// Reads and checks everything a reload needs; throws ``Refusal`` and changes nothing.
    private func prepare(_ trigger: ReloadTrigger) async throws(Refusal) -> Plan {
        var file: AgentConfigFile?
        if let path = sources.file?.path {
            do { file = try await AgentConfigFile.load(path) } catch {
                throw Refusal(path: path, message: error.description, lines: error.line.map(String.init) ?? "")
            }
        }
        var next = sources
        next.file = file
        let proposed: AgentSettings
        do {
            proposed = try AgentSettings.resolve(next)
            try proposed.check(environment: environment)
        } catch {
            throw Refusal(path: file?.path ?? "", message: error.description)
        }
        let restartNeeded = AgentOption.all.filter { !$0.live && settings.values[$0.key] != proposed.values[$0.key] }.map(\.key)
        let changed = AgentOption.all.filter { $0.live && settings.values[$0.key] != proposed.values[$0.key] }.map(\.key)
        let applied = settings.takingLiveOptions(from: proposed)
        do { try applied.check(environment: environment) } catch { throw Refusal(path: file?.path ?? "", message: error.description) }

        var fileSubjects: [TokenKey] = []
        if let path = applied.subjectsFile {
            do { fileSubjects = try SubjectListFile(contentsOfFile: path).subjects } catch {
                throw Refusal(path: path, message: error.description, lines: error.lines.map(String.init).joined(separator: ","), subjectsFile: true)
            }
        }
        let keys: [TokenKey]
        let patterns: [SubjectAllowList.Pattern]
        do {
            keys = SubjectSet.merged(try applied.subjectKeys(), fileSubjects)
            patterns = try applied.allowPatterns()
        } catch {
            throw Refusal(path: file?.path ?? "", message: "\(error)")
        }
        // A new provider client when its options changed, and on SIGHUP whenever TLS or header
        // files are in use (so that a rotated CA bundle is read again).
        var fetcher: HTTPTokenFetcher?
        let transport = ["header", "header-file", "ca-file", "extra-ca-file", "client-cert", "client-key"]
        if !demo && (changed.contains(where: transport.contains) || trigger == .hangup && applied.hasReloadableFiles) {
            do {
                let configuration = try applied.fetcherConfiguration(template: template, demo: demo, environment: environment)
                fetcher = try HTTPTokenFetcher(configuration: configuration, logger: logger)
            } catch {
                throw Refusal(path: file?.path ?? "", message: "\(error)")
            }
        }
        return Plan(proposed: proposed, settings: applied, file: file, fileSubjects: fileSubjects, keys: keys, patterns: patterns, fetcher: fetcher,
                    restartNeeded: restartNeeded, changed: changed)
    }

    private mutating func apply(_ plan: Plan, trigger: ReloadTrigger) async {
        // The new provider client first: a subject added by this reload is fetched with the
        // credentials and trust the reload configured.
        let replaced = plan.fetcher.map { client.install($0) }
        let change = SubjectListChange(from: subjects.current, to: plan.keys)
        await engine.track(change.added)
        await engine.untrack(change.removed)
        subjects.current = plan.keys
        api?.replaceSubjects(plan.keys)
        api?.replaceAllowPatterns(plan.patterns)
        logLevel.level = plan.settings.logLevel
        settings = plan.settings
        lastProposed = plan.proposed
        sources.file = plan.file
        fileSubjects = plan.fileSubjects
        let reason = trigger == .hangup ? "SIGHUP" : "config file changed"
        if let path = settings.subjectsFile {
            logger.notice("\(reason): subjects file reloaded", metadata: [
                "path": "\(path)", "added": "\(change.added.count)", "removed": "\(change.removed.count)",
                "subjects": "\(plan.keys.count)",
                "added_keys": "\(Self.summary(change.added))", "removed_keys": "\(Self.summary(change.removed))",
            ])
        }
        if settings.subjectsFile != nil || !change.isEmpty { output.printReload(change, subjects: plan.keys.count) }
        if let path = sources.file?.path {
            logger.notice("\(reason): configuration reloaded", metadata: [
                "path": "\(path)", "changed": "\(plan.changed.joined(separator: ","))",
                "subjects": "\(plan.keys.count)", "added": "\(change.added.count)", "removed": "\(change.removed.count)",
            ])
            output.printConfigReload(changed: plan.changed, restartNeeded: plan.restartNeeded)
        }
        if !plan.restartNeeded.isEmpty {
            logger.warning("changed options take effect only after a restart; they keep their old values until then",
                           metadata: ["options": "\(plan.restartNeeded.joined(separator: ","))"])
        }
        // As at start: what the store already held for a new subject is reported here (no fetch
        // was needed); fetched tokens are reported by refresh events.
        for key in change.added {
            if let held = engine.heldToken(for: key), held.source == .store {
                output.print(.refreshed(key: key, fingerprint: held.token.fingerprint, expiresAt: held.token.expiresAt, source: .store))
            }
        }
        // The new client may fix what made refreshes fail (credentials, trust): failing subjects
        // are tried again now rather than at the end of a backoff of up to five minutes. Last,
        // the old client is shut down once its requests are answered, which may take a while.
        if let replaced {
            let retried = await engine.retryFailedNow()
            if retried > 0 {
                logger.notice("the provider client changed: failing subjects are tried again now", metadata: ["subjects": "\(retried)"])
            }
            await replaced.retire()
        }
    }

    private func report(_ refusal: Refusal) {
        let inForce = refusal.subjectsFile ? "the previous subject list stays in force" : "the configuration in force stays"
        logger.error("reload refused: \(inForce)", metadata: [
            "path": "\(refusal.path)", "lines": "\(refusal.lines)", "error": "\(refusal.message)",
        ])
        output.printReloadFailed(path: refusal.path, message: refusal.message, lines: refusal.lines, inForce: inForce)
    }

    /// `vehicle/a,trip/b`, the first ``keysLogged`` keys and how many more.
    static func summary(_ keys: [TokenKey]) -> String {
        let shown = keys.prefix(keysLogged).map(\.description).joined(separator: ",")
        return keys.count > keysLogged ? "\(shown) and \(keys.count - keysLogged) more" : shown
    }
}

extension AgentSettings {
    /// Files a SIGHUP reads again even when no option changed: header files and TLS files.
    var hasReloadableFiles: Bool {
        !headerFiles.isEmpty || !caFiles.isEmpty || !extraCAFiles.isEmpty || clientCertificate != nil
    }

    /// These settings with the live options (and their origins) taken from `proposed`.
    func takingLiveOptions(from proposed: AgentSettings) -> AgentSettings {
        var applied = self
        applied.vehicles = proposed.vehicles
        applied.trips = proposed.trips
        applied.deliveryVehicles = proposed.deliveryVehicles
        applied.tasks = proposed.tasks
        applied.subjectsFile = proposed.subjectsFile
        applied.headers = proposed.headers
        applied.headerFiles = proposed.headerFiles
        applied.caFiles = proposed.caFiles
        applied.extraCAFiles = proposed.extraCAFiles
        applied.clientCertificate = proposed.clientCertificate
        applied.clientKey = proposed.clientKey
        applied.logLevel = proposed.logLevel
        applied.allow = proposed.allow
        for option in AgentOption.all where option.live { applied.origins.byKey[option.key] = proposed.origins.byKey[option.key] }
        return applied
    }
}
