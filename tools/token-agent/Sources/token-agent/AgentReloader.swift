// One reload of the agent: read the config file and the subjects file again, check everything
// (a refusal changes nothing), then apply the live options in an order that never lets a new
// subject be fetched with the old credentials.

import FleetTokenHTTP
import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Foundation
import Logging

/// The settings in force and how to change them. Used by one loop, so plain state.
struct AgentReloader: Sendable {
    let engine: TokenSyncEngine
    /// Flags and environment (fixed for the process) and the config file as last loaded.
    var sources: SettingSources
    let environment: [String: String]
    /// The provider URL template in force (the demo issuer's in demo mode).
    let template: String
    let demo: Bool
    /// Subjects kept when the options name none (demo mode's demo subjects).
    let defaultKeys: [TokenKey]
    let client: ProviderClient
    let logLevel: LogLevelSetting
    let serviceManager: ServiceManagerState
    let subjects: ConfiguredSubjects
    let output: AgentOutput
    let logger: Logger
    /// The local token API, whose allowed and readiness subjects follow the reloaded list.
    var api: TokenAPI?
    var settings: AgentSettings
    /// What the sources said at the last reload (or start), restart-only options included: a
    /// file change that says the same again (SIGHUP and the file watch both see one edit) is
    /// not applied twice.
    var lastProposed: AgentSettings
    /// The CA bundles' contents the provider client in force was built with.
    var trust: TrustFiles
    /// The bytes the configuration in force was read from (at start, or by the last reload applied).
    var inputs: ReloadInputs

    /// Keys named in one log line at most; the counts are always complete.
    static let keysLogged = 100

    /// What a reload would change, prepared in full before anything is applied.
    private struct Plan {
        var proposed: AgentSettings
        var settings: AgentSettings
        var file: AgentConfigFile?
        /// The subjects file's bytes parsed for ``keys``.
        var subjectsBytes: Data?
        var keys: [TokenKey]
        var patterns: [SubjectAllowList.Pattern]
        var clients: ClientAccessPolicy
        var fetcher: HTTPTokenFetcher?
        var trust: TrustFiles
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
        if trigger == .hangup && sources.file == nil && settings.subjectsFile == nil && settings.caFiles.isEmpty && settings.extraCAFiles.isEmpty {
            logger.notice("SIGHUP received: there is nothing to reload (no --config or --subjects-file given; header and client certificate files are re-read when they change); the agent goes on")
            return
        }
        let plan: Plan
        do {
            plan = try await prepare(trigger)
        } catch {
            let told = serviceManager.reloading()
            report(error)
            if told { serviceManager.reloaded(status: "reload failed: the configuration in force stays") }
            return
        }
        // Saving the config file and then `systemctl reload` sets off two reloads, the file
        // watch's and SIGHUP's, whichever comes first: the second reads what is in force already.
        // The bytes parsed, not a read of the files now: a file that changed since (a save
        // caught half way, then finished) must differ from what is in force, and be applied
        // at the next reload, rather than be taken for it.
        let read = ReloadInputs(configFile: plan.file, subjectsBytes: plan.subjectsBytes, settings: plan.settings)
        if read == inputs && plan.fetcher == nil {
            logger.debug("\(trigger == .hangup ? "SIGHUP" : "config file changed"): the configuration is the one in force (same config file, subjects file and CA bundles); nothing to reload")
            if trigger == .hangup, serviceManager.reloading() {
                serviceManager.reloaded(status: SubjectCounts(of: subjects.current, in: engine).description)
            }
            return
        }
        if trigger == .fileChanged && plan.proposed == lastProposed && plan.changed.isEmpty && plan.fetcher == nil
            && plan.keys == subjects.current {
            logger.debug("the config file changed on disk but no option did")
            sources.file = plan.file
            inputs = read
            return
        }
        let told = serviceManager.reloading()
        await apply(plan, trigger: trigger)
        inputs = read
        if told { serviceManager.reloaded(status: SubjectCounts(of: subjects.current, in: engine).description) }
    }

    /// Reads and checks everything a reload needs; throws ``Refusal`` and changes nothing.
    private func prepare(_ trigger: ReloadTrigger) async throws(Refusal) -> Plan {
        var file: AgentConfigFile?
        if let path = sources.file?.path {
            do { file = try await AgentConfigFile.load(path) } catch {
                throw Refusal(path: path, message: error.description, lines: error.line.map(String.init) ?? "")
            }
        }
        let place = file?.path ?? ""
        var next = sources
        next.file = file
        let proposed: AgentSettings
        let applied: AgentSettings
        do {
            proposed = try AgentSettings.resolve(next)
            try proposed.check(environment: environment)
            applied = settings.takingLiveOptions(from: proposed)
            try applied.check(environment: environment)
        } catch {
            throw Refusal(path: place, message: error.description)
        }
        let differing = proposed.differingOptions(from: settings)
        let restartNeeded = differing.filter { !$0.live }.map(\.key)
        let changed = differing.filter(\.live).map(\.key)

        // A file another user could have written refuses the reload, changed or not.
        do { try applied.checkSteeringFiles() } catch {
            throw Refusal(path: error.file.path, message: error.description, subjectsFile: error.file.key == "subjects-file")
        }
        var fileSubjects: [TokenKey] = []
        var subjectsBytes: Data?
        if let path = applied.subjectsFile {
            do {
                let list = try SubjectListFile(contentsOfFile: path)
                (fileSubjects, subjectsBytes) = (list.subjects, list.bytes)
            } catch {
                throw Refusal(path: path, message: error.description, lines: error.lines.map(String.init).joined(separator: ","), subjectsFile: true)
            }
        }
        var keys: [TokenKey]
        let patterns: [SubjectAllowList.Pattern]
        do {
            keys = SubjectSet.merged(try applied.subjectKeys(), fileSubjects)
            patterns = try applied.allowPatterns()
        } catch {
            throw Refusal(path: place, message: "\(error)")
        }
        // Names are resolved anew on every reload: a user added since start can be named now.
        let clients: ClientAccessPolicy
        do { clients = try applied.clientPolicy() } catch { throw Refusal(path: place, message: error.description) }
        if keys.isEmpty { keys = defaultKeys }
        if keys.isEmpty && applied.subjectsFile == nil {
            throw Refusal(path: place, message: "the reloaded configuration names no subject to keep tokens for (give vehicle, trip, delivery-vehicle, task or subjects-file)")
        }
        // A new provider client when its options changed, or when SIGHUP finds a CA bundle
        // rotated in place. (Header and client certificate files are re-read by the client
        // itself whenever they change.)
        let transport = ["header", "header-file", "ca-file", "extra-ca-file", "client-cert", "client-key"]
        let newTrust = TrustFiles(applied)
        var fetcher: HTTPTokenFetcher?
        if !demo && (changed.contains(where: transport.contains) || trigger == .hangup && newTrust != trust) {
            do {
                let configuration = try applied.fetcherConfiguration(template: template, demo: demo, environment: environment)
                fetcher = try HTTPTokenFetcher(configuration: configuration, logger: logger)
            } catch {
                throw Refusal(path: place, message: OperatorHints.describe(error))
            }
        }
        return Plan(proposed: proposed, settings: applied, file: file, subjectsBytes: subjectsBytes, keys: keys, patterns: patterns, clients: clients, fetcher: fetcher,
                    trust: newTrust, restartNeeded: restartNeeded, changed: changed)
    }

    private mutating func apply(_ plan: Plan, trigger: ReloadTrigger) async {
        // The new provider client first, so that a subject added by this reload is fetched with
        // the credentials and trust the reload configured; the log level next, so that what the
        // reload sets off is logged at the new level.
        let replaced = plan.fetcher.map { client.install($0) }
        logLevel.level = plan.settings.logLevel
        api?.replaceAccess(patterns: plan.patterns, clients: plan.clients)
        let change = SubjectListChange(from: subjects.current, to: plan.keys)
        subjects.current = plan.keys
        // In this order: the API allows the tracked keys as configured subjects (an added
        // subject is allowed once tracked, a removed one still used stays allowed).
        await engine.track(change.added)
        api?.replaceSubjects(plan.keys)
        await engine.untrack(change.removed)
        settings = plan.settings
        lastProposed = plan.proposed
        sources.file = plan.file
        if plan.fetcher != nil { trust = plan.trust }
        report(change, plan, trigger: trigger)
        // The new client may fix what made refreshes fail (credentials, trust): failing subjects
        // are tried again now rather than at the end of a backoff of up to five minutes (a
        // provider's Retry-After is kept). Last, the old client is shut down once its requests
        // are answered, which may take a while.
        if let replaced {
            let retried = await engine.retryFailedNow()
            if retried > 0 {
                logger.notice("the provider client changed: failing subjects are tried again now", metadata: ["subjects": "\(retried)"])
            }
            await replaced.retire()
        }
    }

    /// Logs and prints what a reload applied.
    private func report(_ change: SubjectListChange, _ plan: Plan, trigger: ReloadTrigger) {
        let reason = trigger == .hangup ? "SIGHUP" : "config file changed"
        if let path = settings.subjectsFile {
            logger.notice("\(reason): subjects file reloaded", metadata: [
                "path": "\(path)", "added": "\(change.added.count)", "removed": "\(change.removed.count)",
                "subjects": "\(plan.keys.count)",
                "added_keys": "\(Self.summary(change.added))", "removed_keys": "\(Self.summary(change.removed))",
            ])
        }
        output.printReload(change, subjects: plan.keys.count, subjectsFile: settings.subjectsFile != nil)
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
        output.printReused(change.added, engine: engine)
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

extension AgentReloader: CustomStringConvertible {
    /// ServiceLifecycle logs services by description; this one holds settings and the environment.
    var description: String { "AgentReloader" }
}

/// The contents of the CA bundles (`ca-file`, `extra-ca-file`): SIGHUP rebuilds the provider
/// client when they changed on disk, and only then.
struct TrustFiles: Equatable, Sendable {
    let contents: [String: Data?]

    init(_ settings: AgentSettings) {
        contents = Dictionary((settings.caFiles + settings.extraCAFiles).map { ($0, FileManager.default.contents(atPath: $0)) },
                              uniquingKeysWith: { first, _ in first })
    }
}

/// The bytes of the configuration in force: the config file's and the subjects file's as they
/// were parsed, and the CA bundles' (header and client certificate files are followed by the
/// provider client itself). A reload that reads the same bytes as the configuration in force
/// applies nothing.
struct ReloadInputs: Equatable, Sendable {
    /// Each file's contents by path; nil for a file that cannot be read, or whose parsed bytes
    /// are not known (it then differs from whatever a reload reads, which applies it).
    let contents: [String: Data?]

    /// `configFile` and `subjectsBytes` are what was parsed (a subjects file of `settings` given
    /// without them counts as not known); the CA bundles are read now.
    init(configFile: AgentConfigFile?, subjectsBytes: Data?, settings: AgentSettings) {
        var contents: [String: Data?] = [:]
        for path in settings.caFiles + settings.extraCAFiles { contents[path] = .some(FileManager.default.contents(atPath: path)) }
        if let subjectsFile = settings.subjectsFile { contents[subjectsFile] = .some(subjectsBytes) }
        if let configFile { contents[configFile.path] = configFile.bytes }
        self.contents = contents
    }
}
