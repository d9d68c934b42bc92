// One run of token-agent from checked settings: logging and metrics, the demo issuer when no
// provider is given, the fetcher, store and engine, then --once or the long-lived services.

import DevTokenIssuer
import FleetEngineProxy
import FleetTokenHTTP
import FleetTokenPostgres
import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Foundation
import Logging
import Metrics
import Prometheus
import ArgumentParser

struct AgentRun {
    let settings: AgentSettings
    let sources: SettingSources
    let environment: [String: String]

    func run() async throws {
        let logLevel = LogLevelSetting(settings.logLevel)
        let format = settings.logFormat
        LoggingSystem.bootstrap { label in AgentLogHandler(label: label, format: format, level: logLevel) }
        let logger = Logger(label: "token-agent")
        // Before the engine and fetcher make their counters: they bind to the factory then.
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(DescribedPrometheusFactory(registry: registry))
        BuildInfo.register(in: registry)
        let path = storePath

        var (keys, subjectsBytes) = try configuredSubjects()
        let configuredKeys = keys
        var issuer: DevTokenIssuer?
        var template = settings.providerURL
        if template == nil {
            var configuration = DevTokenIssuer.Configuration()
            configuration.lifetime = TimeInterval(settings.demoLifetime)
            var issuerLogger = logger
            issuerLogger.logLevel = .warning
            let started = try await DevTokenIssuer.start(configuration, logger: issuerLogger)
            issuer = started
            template = started.urlTemplate
            if keys.isEmpty { keys = try Self.demoSubjects() }
            let socket = try usage { try settings.listenAddresses(demo: true) }
                .compactMap { if case .unix(let path) = $0 { path } else { nil } }.first
            DemoBanner.print(url: started.urlTemplate, lifetime: settings.demoLifetime, socket: socket, example: keys.first)
        }
        do { try requireSubjects(keys) } catch {
            await issuer?.stop()
            throw error
        }

        let fetcherConfiguration: HTTPTokenFetcherConfiguration
        do {
            fetcherConfiguration = try self.fetcherConfiguration(template: template!, demo: issuer != nil)
        } catch {
            await issuer?.stop()
            throw error
        }
        ProxyReport.log(fetcherConfiguration, template: template!, logger: logger)
        // Before the store opens, as the provider's files: a Fleet Engine CA file that cannot be
        // used stops the start as a usage error.
        do { _ = try checkFleetEngineProxy() } catch {
            await issuer?.stop()
            throw error
        }

        // Before the store opens: a refused key file stops the start without touching the store.
        let keyring: TokenKeyring?
        do {
            keyring = try loadKeyring(exitCode: 1)
        } catch {
            await issuer?.stop()
            throw error
        }
        if let keyring {
            logger.notice("token values are sealed at rest", metadata: [
                "key_id": .string(keyring.primary.id), "opening_also": .string(keyring.ids.dropFirst().joined(separator: ",")),
            ])
        }

        let client: ProviderClient
        do {
            client = ProviderClient(try makeFetcher(fetcherConfiguration, logger: logger))
        } catch {
            await issuer?.stop()
            throw error
        }
        if PostgresStoreLocation.isPostgresURL(path) {
            let configuration: PostgresStoreConfiguration
            do { configuration = try postgresConfiguration(path) } catch {
                await client.shutdown()
                await issuer?.stop()
                throw error
            }
            do {
                try await PostgresTokenRepository.withRepository(configuration, mode: .agent, logger: logger) { store in
                    logger.notice("token store on PostgreSQL", metadata: ["store": .string(store.storeDescription)])
                    try await TokenValueResealer(store: store, logger: logger).prepare(keyring: keyring)
                    try await serve(store: store, releaseStoreMemory: {}, closeStore: {})
                }
            } catch let error as TokenStoreError {
                await client.shutdown()
                await issuer?.stop()
                throw printed(error, exitCode: 1)
            }
            return
        }
        let store: SQLiteTokenRepository
        do {
            store = try SQLiteTokenRepository(path: path, mode: .agent, logger: logger)
        } catch {
            await client.shutdown()
            await issuer?.stop()
            throw printed(error, exitCode: 1)
        }
        if let moved = store.openReport.quarantinedTo {
            FileHandle.standardError.write(Data("token-agent: the token store was corrupt; moved it to \(moved) and started a fresh one\n".utf8))
        }
        do {
            try await TokenValueResealer(store: store, logger: logger).prepare(keyring: keyring)
        } catch {
            store.close()
            await client.shutdown()
            await issuer?.stop()
            throw printed(error, exitCode: 1)
        }
        try await serve(store: store, releaseStoreMemory: { store.releaseMemory() }, closeStore: { store.close() })

        /// The engine on `store`, then --once or the long-lived services; every way out
        /// releases what was opened (`closeStore` closes the store when the run owns it).
        func serve(store: any TokenRepository & RefreshLeaseStore & TokenSealingStore, releaseStoreMemory: @escaping @Sendable () -> Void,
                   closeStore: () -> Void) async throws {
            // Values are sealed on their way to the store, and opened on their way back (lease
            // requests read the key's entry too).
            let repository: any TokenRepository & RefreshLeaseStore = keyring.map { EncryptedTokenRepository(base: store, keyring: $0, logger: logger) } ?? store
            let engine = TokenSyncEngine(repository: repository, leases: repository, fetcher: client, policy: settings.policy, logger: logger)
            let output = AgentOutput(json: settings.json, maxEventLines: settings.maxEventLines, eventLineWindow: settings.eventLineWindow)
            /// Releases what was opened, for every way out of the run.
            func close() async {
                await client.shutdown()
                closeStore()
                await issuer?.stop()
            }

            if settings.once {
                // A database URL may hold a password: it is not printed back.
                let storeArgument = PostgresStoreLocation.isPostgresURL(path) ? "'<the database URL>'" : OnceFailureReport.shellQuoted(path)
                let failed = await OnceRun(engine: engine, keys: keys, output: output, storeArgument: storeArgument).run()
                await engine.shutdown()
                await close()
                if failed { throw ExitCode(1) }
                return
            }
            let subjects = ConfiguredSubjects(keys)
            var services = LongLivedServices()
            do {
                services.api = try prepareAPI(engine: engine, keys: keys, demo: issuer != nil, registry: registry, logger: logger)
                services.sink = try prepareSink(engine: engine, logger: logger)
            } catch {
                await close()
                throw printed(error, exitCode: 1)
            }
            let serviceManager = ServiceManagerState(notifier: SystemdNotifier(environment: environment, logger: logger))
            services.reports = ServiceManagerReports(engine: engine, state: serviceManager, subjects: subjects, logger: logger)
            if settings.exitOnPermanentError {
                services.permanentErrors = PermanentErrorWatch(engine: engine, subjects: subjects, attempts: settings.permanentErrorAttempts, logger: logger)
            }
            let reloader = AgentReloader(
                engine: engine, sources: sources, environment: environment, template: template!, demo: issuer != nil,
                defaultKeys: issuer != nil && configuredKeys.isEmpty ? keys : [], client: client, logLevel: logLevel,
                serviceManager: serviceManager, subjects: subjects, output: output, logger: logger,
                api: services.api?.api, settings: settings, lastProposed: settings, trust: TrustFiles(settings),
                inputs: ReloadInputs(configFile: sources.file, subjectsBytes: subjectsBytes, settings: settings))
            do {
                try await LongLivedRun(engine: engine, keys: keys, output: output, logger: logger, services: services, reloader: reloader,
                                       releaseStoreMemory: releaseStoreMemory).run()
            } catch let refusal as ProviderRefusesEverySubject {
                await close()
                FileHandle.standardError.write(Data("token-agent: \(refusal)\n".utf8))
                throw ExitCode(ProviderRefusesEverySubject.exitCode)
            }
            await close()
        }
    }

    /// The local token API (its sockets checked now, so that a taken one fails the start), and
    /// the Fleet Engine proxy, which decides access by the API's rules. The API without a
    /// service when only the proxy listens.
    private func prepareAPI(engine: TokenSyncEngine, keys: [TokenKey], demo: Bool, registry: PrometheusCollectorRegistry,
                            logger: Logger) throws -> (service: TokenAPIService?, api: TokenAPI, proxy: FleetEngineProxyService?)? {
        let addresses = try usage { try settings.listenAddresses(demo: demo) }
        let proxySettings = try usage { try settings.fleetEngineProxySettings(environment: environment) }
        guard !addresses.isEmpty || proxySettings != nil else { return nil }
        // The configured subjects are the engine's tracked keys, allowed as such: no copy of them.
        var configuration = TokenAPI.Configuration(allowList: try usage { try settings.allowList() }, readinessSubjects: keys)
        configuration.allowsTrackedSubjects = true
        configuration.invalidateInterval = settings.invalidateInterval.seconds
        configuration.maxDynamicSubjects = settings.maxDynamicSubjects
        configuration.clientPolicy = try usage { try settings.clientPolicy() }
        // The earliest-expiry gauge is computed per scrape: swift-metrics has no collect callback.
        configuration.metricsText = {
            engine.recordEarliestTrackedExpiry()
            return registry.emitToString()
        }
        let api = TokenAPI(engine: engine, configuration: configuration, logger: logger)
        let limits = APIConnectionLimits(maxConnections: settings.maxAPIConnections, maxConnectionsPerPeer: settings.maxAPIConnectionsPerPeer)
        // Both listeners draw on one budget: each counting the free descriptors as its own
        // would let them take the store's reserve between them.
        let shared = !addresses.isEmpty && proxySettings != nil ? SharedConnectionCaps(limits: limits, logger: logger) : nil
        var service: TokenAPIService?
        if !addresses.isEmpty {
            service = TokenAPIService(
                api: api, engine: engine, addresses: addresses, socketMode: settings.socketModeValue ?? 0o660,
                connectionLimits: limits, sharedCaps: shared, logger: logger,
                onListening: { address in logger.notice("token API listening", metadata: ["address": "\(address)"]) })
            try service?.prepare()
        }
        var proxyService: FleetEngineProxyService?
        if let proxySettings {
            let proxy: FleetEngineProxy
            do { proxy = try FleetEngineProxy(api: api, configuration: proxySettings.configuration, logger: logger) } catch {
                throw fleetEngineCAFileRefused(error)
            }
            proxyService = FleetEngineProxyService(proxy: proxy, addresses: proxySettings.addresses, socketMode: settings.socketModeValue ?? 0o660,
                                                   connectionLimits: limits, sharedCaps: shared, logger: logger)
            try proxyService?.prepare()
        }
        FileDescriptorLimit.raise()
        return (service, api, proxyService)
    }

    /// The file sink, its directory checked now.
    private func prepareSink(engine: TokenSyncEngine, logger: Logger) throws -> TokenFileSink? {
        guard let sink = settings.sink else { return nil }
        let service = TokenFileSink(engine: engine, directory: sink, fileMode: settings.sinkModeValue ?? 0o640, logger: logger)
        try service.prepare()
        return service
    }

    /// `--check-config`: the start-up checks of ``run()`` that touch neither the store nor the
    /// provider (no issuer is started, no address bound, no request sent), through the same
    /// functions and with the same messages; a key file refused exits 64 here, not 1.
    func checkOnly() async throws {
        var keys = try configuredSubjects().keys
        let demo = settings.providerURL == nil
        if demo && keys.isEmpty { keys = try Self.demoSubjects() }
        try requireSubjects(keys)
        if let template = settings.providerURL {
            // Made and shut down at once: it has sent nothing yet.
            let fetcher = try makeFetcher(try fetcherConfiguration(template: template, demo: false), logger: Logger(label: "token-agent"))
            await fetcher.shutdown()
        }
        // In the order of a start: the proxy's files, the key file and the store's address
        // before the store opens, the edges' directories after.
        let proxyAddresses = try checkFleetEngineProxy()
        _ = try loadKeyring(exitCode: 64)
        if PostgresStoreLocation.isPostgresURL(storePath) { _ = try postgresConfiguration(storePath) }
        try checkEdgeDirectories(demo: demo, proxyAddresses: proxyAddresses)
    }

    /// The Fleet Engine proxy's settings and its CA file, read and judged as the proxy will read
    /// them; nothing is connected. Returns the proxy's listen addresses (none without a proxy).
    private func checkFleetEngineProxy() throws -> [ListenAddress] {
        guard let proxySettings = try usage({ try settings.fleetEngineProxySettings(environment: environment) }) else { return [] }
        do { try proxySettings.configuration.check() } catch { throw fleetEngineCAFileRefused(error) }
        return proxySettings.addresses
    }

    /// The directories of the Unix sockets (`--listen`, `--fleet-engine-listen`) and of the
    /// sink, judged as the start judges them, with its message, but nothing created, bound or
    /// held (exit 64). A socket something answers on passes: the agent being checked may be
    /// running there. So does a socket directory that does not exist yet, with a note: the
    /// service manager makes it for the start (systemd's `RuntimeDirectory=`, the packaged unit's
    /// /run/token-agent, exists only while the service runs).
    private func checkEdgeDirectories(demo: Bool, proxyAddresses: [ListenAddress]) throws {
        let addresses = try usage { try settings.listenAddresses(demo: demo) } + proxyAddresses
        do {
            for case .unix(let path) in addresses {
                do { try SocketPath.check(path, refusingALiveSocket: false) } catch {
                    guard error.code == .socketDirectoryMissing else { throw error }
                    let directory = (path as NSString).deletingLastPathComponent
                    FileHandle.standardError.write(Data("token-agent: note: the socket's directory \(directory) does not exist yet; a start needs it (systemd's RuntimeDirectory= makes it for the service)\n".utf8))
                }
            }
            if let sink = settings.sink { try TokenFileSink.inspect(directory: sink) }
        } catch {
            throw printed(error, exitCode: 64)
        }
    }

    /// `error` printed as the start prints it, for an exit with `exitCode`.
    private func printed(_ error: any Error, exitCode: Int32) -> ExitCode {
        FileHandle.standardError.write(Data("token-agent: \(OperatorHints.describe(error))\n".utf8))
        return ExitCode(exitCode)
    }

    /// A `--fleet-engine-ca-file` that cannot be used, as a usage error (exit 64).
    private func fleetEngineCAFileRefused(_ error: FleetEngineProxyError) -> ValidationError {
        ValidationError("\(settings.origins.name("fleet-engine-ca-file")): \(error.description)")
    }

    // The start-up checks, each a step of run() and of checkOnly().

    /// The store: `--db`, `TOKEN_AGENT_DB`, `TOKEN_STORE_DB` or the file's `db:` (the `db`
    /// option's sources, in that order), else ./tokens.sqlite.
    var storePath: String { settings.db ?? "./tokens.sqlite" }

    /// The subjects of the options, then those of --subjects-file; and the bytes of the subjects
    /// file parsed (what a reload compares it with).
    private func configuredSubjects() throws -> (keys: [TokenKey], subjectsBytes: Data?) {
        let keys = try usage { try settings.subjectKeys() }
        guard let subjectsFile = settings.subjectsFile else { return (keys, nil) }
        do {
            let list = try SubjectListFile(contentsOfFile: subjectsFile)
            return (SubjectSet.merged(keys, list.subjects), list.bytes)
        } catch {
            throw ValidationError("\(settings.origins.name("subjects-file")): \(error)")
        }
    }

    /// The subjects demo mode keeps fresh when none is given.
    private static func demoSubjects() throws -> [TokenKey] {
        try ["demo-vehicle-1", "demo-vehicle-2", "demo-vehicle-3"].map { try TokenKey(kind: .vehicle, subjectID: $0) }
            + ["demo-trip-1", "demo-trip-2"].map { try TokenKey(kind: .trip, subjectID: $0) }
    }

    /// Some subject to keep tokens for (a subjects file may fill up later, but not for --once).
    private func requireSubjects(_ keys: [TokenKey]) throws {
        guard !keys.isEmpty || settings.subjectsFile != nil && !settings.once else {
            throw ValidationError("give at least one --vehicle, --trip, --delivery-vehicle, --task or --subjects-file subject to keep tokens for")
        }
    }

    private func fetcherConfiguration(template: String, demo: Bool) throws -> HTTPTokenFetcherConfiguration {
        do { return try settings.fetcherConfiguration(template: template, demo: demo, environment: environment) } catch {
            throw ValidationError(error.description)
        }
    }

    /// The encryption keys; a refused key file is reported and exits with `exitCode`.
    private func loadKeyring(exitCode: Int32) throws -> TokenKeyring? {
        do { return try TokenKeyring.load(files: settings.encryptionKeyFiles, environment: environment) } catch {
            throw printed(error, exitCode: exitCode)
        }
    }

    /// The fetcher: the URL template's checks (`{id}`, plain http:// to another host) and the TLS files.
    private func makeFetcher(_ configuration: HTTPTokenFetcherConfiguration, logger: Logger) throws -> HTTPTokenFetcher {
        do { return try HTTPTokenFetcher(configuration: configuration, logger: logger) } catch {
            throw ValidationError(OperatorHints.describe(error))
        }
    }

    private func postgresConfiguration(_ path: String) throws -> PostgresStoreConfiguration {
        do { return try PostgresStoreConfiguration(url: path) } catch {
            // Named as the operator gave it; the error names a parameter, never a value.
            throw ValidationError("\(settings.origins.name("db")): \(error)")
        }
    }

    /// A usage error as ArgumentParser reports it (exit 64).
    private func usage<Value>(_ body: () throws -> Value) throws -> Value {
        do { return try body() } catch let error as UsageError { throw ValidationError(error.description) }
    }
}

/// Subject lists merged in order without repeats.
enum SubjectSet {
    static func merged(_ first: [TokenKey], _ second: [TokenKey]) -> [TokenKey] {
        var seen = Set(first)
        return first + second.filter { seen.insert($0).inserted }
    }
}

/// Says which proxy provider requests go through, and which NO_PROXY entries can never match.
enum ProxyReport {
    static func log(_ configuration: HTTPTokenFetcherConfiguration, template: String, logger: Logger) {
        let probe = template.replacingOccurrences(of: "{kind}", with: "vehicle").replacingOccurrences(of: "{id}", with: "x")
        if let chosen = URL(string: probe).flatMap(configuration.proxy.proxy(for:)) {
            logger.info("token provider requests go through a proxy", metadata: ["proxy": "\(chosen)"])
        }
        if !configuration.proxy.noProxy.ignoredEntries.isEmpty {
            logger.warning("NO_PROXY entries that can never match (not a host name, address or CIDR block, or a bad port)",
                           metadata: ["entries": "\(configuration.proxy.noProxy.ignoredEntries.joined(separator: ","))"])
        }
    }
}
