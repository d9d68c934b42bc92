// token-agent: the reference long-lived agent. Keeps every given subject's token fresh in the
// store until SIGTERM/SIGINT, or (--once) makes sure each has a usable token and exits.

import ArgumentParser
import DevTokenIssuer
import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging
import Metrics
import Prometheus
import ServiceLifecycle
#if canImport(Glibc)
import Glibc
#endif

@main
struct TokenAgent: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "token-agent",
        abstract: "Keep Fleet Engine tokens for vehicles, trips, delivery vehicles and tasks fresh in a local store.",
        discussion: """
            Without --provider-url the agent runs in DEMO MODE on an embedded development issuer \
            (not for production) and tracks a few demo subjects.

            Exit codes: 0 ok (every subject has a usable token with --once; clean stop on SIGTERM/SIGINT), \
            1 operational error (a subject without a usable token, a store or provider problem), 64 usage error.
            """)

    @Option(help: "The token store (default: $TOKEN_STORE_DB, else ./tokens.sqlite).")
    var db: String?

    @Option(name: .customLong("provider-url"),
            help: "Token provider URL with {kind} and {id} placeholders, e.g. https://auth.example.com/fleet/{kind}/{id}.")
    var providerURL: String?

    @Option(name: .customLong("vehicle"), help: "A vehicle ID to keep a token for (repeatable).")
    var vehicles: [String] = []

    @Option(name: .customLong("trip"), help: "A trip ID to keep a token for (repeatable).")
    var trips: [String] = []

    @Option(name: .customLong("delivery-vehicle"), help: "A delivery vehicle ID (Fleet Engine Deliveries) to keep a token for (repeatable).")
    var deliveryVehicles: [String] = []

    @Option(name: .customLong("task"), help: "A task ID (Fleet Engine Deliveries) to keep a token for (repeatable).")
    var tasks: [String] = []

    @Option(name: .customLong("subjects-file"),
            help: "A file of subjects, one KIND:ID a line (# comments), added to the flags'; SIGHUP re-reads it.")
    var subjectsFile: String?

    @Option(name: .customLong("header"), help: "A header sent to the provider, 'Name: value' (repeatable).")
    var headers: [String] = []

    @Option(name: .customLong("header-file"),
            help: "A header whose value is read from a file and re-read when it changes, 'Name:PATH' (repeatable).")
    var headerFiles: [String] = []

    @Option(name: .customLong("method"), help: "HTTP method of requests to the provider: GET or POST.")
    var method: ProviderRequestMethod = .get

    @Option(name: .customLong("body-template"),
            help: "POST body with {id} and {kind} placeholders, e.g. '{\"vehicleId\":\"{id}\"}' (needs --method POST).")
    var bodyTemplate: String?

    @Option(name: .customLong("content-type"),
            help: "Content type of the body: application/json (default), application/x-www-form-urlencoded or text/plain.")
    var contentType: String?

    @Option(name: .customLong("ca-file"), help: "PEM bundle of the CAs to trust for the provider, instead of the system's (repeatable).")
    var caFiles: [String] = []

    @Option(name: .customLong("extra-ca-file"), help: "PEM bundle of CAs to trust besides the system's (repeatable).")
    var extraCAFiles: [String] = []

    @Option(name: .customLong("client-cert"), help: "PEM client certificate (chain allowed) for mutual TLS; re-read when it changes.")
    var clientCertificate: String?

    @Option(name: .customLong("client-key"), help: "PEM private key of --client-cert; re-read when it changes.")
    var clientKey: String?

    @Option(name: .customLong("proxy"),
            help: "Forward proxy for provider requests, http://[USER:PASSWORD@]HOST:PORT, instead of HTTPS_PROXY/HTTP_PROXY.")
    var proxy: String?

    @Flag(name: .customLong("no-proxy"), help: "Reach the provider directly, whatever HTTPS_PROXY/HTTP_PROXY say.")
    var noProxy = false

    @Option(name: .customLong("token-key"),
            help: "JSON field (or JSON pointer such as /data/token) of the token for every kind (default VEHICLE_TOKEN_KEY, TRIP_TOKEN_KEY, DELIVERY_VEHICLE_TOKEN_KEY, TASK_TOKEN_KEY).")
    var tokenKey: String?

    @Option(name: .customLong("expiration-key"), help: "JSON field (or JSON pointer) of the expiration (default TOKEN_EXPIRATION).")
    var expirationKey: String = "TOKEN_EXPIRATION"

    @Option(name: .customLong("expiration-format"),
            help: "How the expiration is written: auto, epoch-seconds, epoch-millis, relative-seconds.")
    var expirationFormat: HTTPTokenFetcherConfiguration.ExpirationFormat = .auto

    @Flag(name: .customLong("allow-insecure-http"), help: "Allow plain http:// to a non-loopback provider.")
    var allowInsecureHTTP = false

    @Flag(help: "Make sure each subject has a usable token, print it, and exit.")
    var once = false

    @Flag(help: "Print JSON: with --once an array, otherwise one object per event.")
    var json = false

    @Option(name: .customLong("log-level"), help: "Log level on stderr: trace, debug, info, notice, warning, error, critical.")
    var logLevel: Logger.Level = .info

    @Option(name: .customLong("connect-timeout"), help: "Seconds to wait for a connection to the provider.")
    var connectTimeout: Double = 5

    @Option(name: .customLong("request-timeout"), help: "Seconds to wait for the provider's whole answer.")
    var requestTimeout: Double = 15

    @Option(name: .customLong("demo-lifetime"), help: ArgumentHelp("Token lifetime of the demo issuer, in seconds.", visibility: .hidden))
    var demoLifetime: Int = 120

    @Option(help: "Delete rows of subjects nobody here tracks or uses once expired this long: 90s, 30m, 24h, 7d; 0 keeps everything.")
    var retention: DurationArgument = DurationArgument(seconds: 86_400)

    @Flag(name: .customLong("allow-opaque-tokens"),
          help: "Accept tokens that are not JWTs (with a stated expiry), and JWTs without iat or the authorization claim.")
    var allowOpaqueTokens = false

    @Option(name: .customLong("listen"),
            help: "Serve the local token API on unix:PATH or 127.0.0.1:PORT (repeatable; demo mode: unix:./token-agent.sock).")
    var listen: [String] = []

    @Flag(name: .customLong("allow-non-loopback-listen"), help: "Allow --listen on an address other than loopback.")
    var allowNonLoopbackListen = false

    @Option(name: .customLong("socket-mode"), help: "Mode of the API's Unix socket files, in octal (default 0660).")
    var socketMode: String = "0660"

    @Option(name: .customLong("sink"), help: "Keep each subject's current token in DIR/{kind}/{id}.jwt, replaced atomically on every refresh.")
    var sink: String?

    @Option(name: .customLong("sink-mode"), help: "Mode of the --sink token files, in octal (default 0640).")
    var sinkMode: String = "0640"

    @Option(name: .customLong("allow"),
            help: "Also hand out subjects matching KIND:GLOB over the API, e.g. 'trip:*' or 'vehicle:truck-*' (repeatable).")
    var allowPatterns: [String] = []

    @Option(name: .customLong("invalidate-interval"), help: "Shortest time between two forced refetches of one key through the API: 10s, 1m.")
    var invalidateInterval = DurationArgument(seconds: 10)

    @Option(name: .customLong("lease-duration"),
            help: ArgumentHelp("Seconds a cross-process refresh lease lasts between renewals.", visibility: .hidden))
    var leaseDuration: Double = 30

    func validate() throws {
        // Header arguments hold credentials: errors name the flag (and a valid header name),
        // never the argument.
        for (index, header) in headers.enumerated() {
            let flag = HeaderArgument.flag("--header", index, of: headers.count)
            guard let (name, value) = HeaderArgument.parseHeader(header) else {
                throw ValidationError("\(flag) is not 'Name: value' (the argument is not shown: it may hold a credential)")
            }
            try HeaderArgument.check(flag, name: name, value: value)
        }
        for (index, file) in headerFiles.enumerated() {
            let flag = HeaderArgument.flag("--header-file", index, of: headerFiles.count)
            guard let (name, _) = HeaderArgument.parseHeaderFile(file) else {
                throw ValidationError("\(flag) is not 'Name:PATH' (the argument is not shown: it may hold a credential)")
            }
            try HeaderArgument.check(flag, name: name, value: "")
        }
        _ = try subjectKeys()
        for (flag, value) in [("--connect-timeout", connectTimeout), ("--request-timeout", requestTimeout)] where !(0.001...3600).contains(value) {
            throw ValidationError("\(flag) must be between 0.001 and 3600 seconds")
        }
        guard (10...3600).contains(demoLifetime) else { throw ValidationError("--demo-lifetime must be between 10 and 3600") }
        guard (0.1...3600).contains(leaseDuration) else { throw ValidationError("--lease-duration must be between 0.1 and 3600 seconds") }
        if providerURL == nil && !headers.isEmpty || providerURL == nil && !headerFiles.isEmpty {
            throw ValidationError("--header and --header-file need --provider-url")
        }
        try validateTransport()
        _ = try listenAddresses(demo: false)
        _ = try allowList(keys: [])
        if once && !listen.isEmpty { throw ValidationError("--listen serves tokens while the agent runs: it does not go with --once") }
        guard socketModeValue != nil else { throw ValidationError("--socket-mode \(socketMode): give an octal mode such as 0660 or 0600") }
        if once && sink != nil { throw ValidationError("--sink keeps files fresh while the agent runs: it does not go with --once") }
        guard sinkModeValue != nil else { throw ValidationError("--sink-mode \(sinkMode): give an octal mode such as 0640 or 0600 (no execute bits; only the owner may write)") }
    }

    /// The API's listen addresses; demo mode listens on ./token-agent.sock unless told otherwise.
    private func listenAddresses(demo: Bool) throws -> [ListenAddress] {
        do {
            if listen.isEmpty && demo && !once { return [.unix(path: "./token-agent.sock")] }
            return try listen.map { try ListenAddress(parsing: $0, allowNonLoopback: allowNonLoopbackListen) }
        } catch {
            throw ValidationError("\(error)")
        }
    }

    private func allowList(keys: [TokenKey]) throws -> SubjectAllowList {
        do {
            return SubjectAllowList(subjects: Set(keys), patterns: try allowPatterns.map { try SubjectAllowList.Pattern(parsing: $0) })
        } catch {
            throw ValidationError("--allow \(error)")
        }
    }

    private var socketModeValue: mode_t? {
        mode_t(socketMode, radix: 8).flatMap { $0 <= 0o777 ? $0 : nil }
    }

    private var sinkModeValue: mode_t? {
        mode_t(sinkMode, radix: 8).flatMap { $0 <= 0o777 && $0 & 0o133 == 0 ? $0 : nil }
    }

    /// The request-shape, TLS and proxy flags (the files themselves are checked when the fetcher is made).
    private func validateTransport() throws {
        let transportFlags = [(!caFiles.isEmpty, "--ca-file"), (!extraCAFiles.isEmpty, "--extra-ca-file"),
                              (clientCertificate != nil, "--client-cert"), (clientKey != nil, "--client-key"),
                              (proxy != nil, "--proxy"), (method != .get, "--method"), (bodyTemplate != nil, "--body-template")]
        if providerURL == nil, let (_, flag) = transportFlags.first(where: \.0) {
            throw ValidationError("\(flag) needs --provider-url (the demo issuer is plain HTTP on loopback)")
        }
        if (clientCertificate == nil) != (clientKey == nil) {
            throw ValidationError("--client-cert and --client-key go together: give both PEM files, or neither")
        }
        if proxy != nil && noProxy { throw ValidationError("--proxy and --no-proxy exclude each other") }
        if contentType != nil && bodyTemplate == nil { throw ValidationError("--content-type needs --body-template") }
        if bodyTemplate != nil && method != .post { throw ValidationError("--body-template needs --method POST") }
        _ = try requestBody()
        _ = try proxySettings()
    }

    /// The POST body, or a usage error naming the flag.
    private func requestBody() throws -> RequestBodyTemplate? {
        guard let bodyTemplate else { return nil }
        do {
            return try RequestBodyTemplate(bodyTemplate, contentType: contentType ?? "application/json")
        } catch {
            throw ValidationError("--body-template: \(error)")
        }
    }

    /// `--proxy` / `--no-proxy` over the environment's proxy variables; a bad proxy URL is a
    /// usage error naming its variable or flag, with any password as `***`.
    private func proxySettings() throws -> ProxySettings {
        let override: ProxySettings.Override? = noProxy ? .direct : proxy.map { .proxy($0) }
        do {
            return try ProxySettings.fromEnvironment(ProcessInfo.processInfo.environment, override: override)
        } catch {
            throw ValidationError(error.description)
        }
    }

    /// Every subject given on the command line, in flag order.
    private func subjectKeys() throws -> [TokenKey] {
        try vehicles.map { try key(.vehicle, $0) } + trips.map { try key(.trip, $0) }
            + deliveryVehicles.map { try key(.deliveryVehicle, $0) } + tasks.map { try key(.task, $0) }
    }

    private func key(_ kind: TokenKind, _ id: String) throws -> TokenKey {
        do {
            return try TokenKey(kind: kind, subjectID: id)
        } catch {
            throw ValidationError("--\(Self.flagName(kind)) '\(id)': \(error)")
        }
    }

    /// The flag that names a subject of `kind`.
    static func flagName(_ kind: TokenKind) -> String {
        switch kind {
        case .vehicle: "vehicle"
        case .trip: "trip"
        case .deliveryVehicle: "delivery-vehicle"
        case .task: "task"
        }
    }

    func run() async throws {
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = .trace
            return handler
        }
        var logger = Logger(label: "token-agent")
        logger.logLevel = logLevel
        // Before the engine and fetcher make their counters: they bind to the factory then.
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        let path = db ?? ProcessInfo.processInfo.environment["TOKEN_STORE_DB"] ?? "./tokens.sqlite"

        var issuer: DevTokenIssuer?
        var template = providerURL
        var keys = try subjectKeys()
        // Subjects from --subjects-file come after the flags'; a reload never touches the others.
        var fileKeys: [TokenKey] = []
        var fileOnly: Set<TokenKey> = []
        if let subjectsFile {
            do { fileKeys = try SubjectListFile(contentsOfFile: subjectsFile).subjects } catch { throw ValidationError("--subjects-file: \(error)") }
            fileOnly = Set(fileKeys).subtracting(keys)
            keys += fileKeys.filter { fileOnly.contains($0) }
        }
        if template == nil {
            var configuration = DevTokenIssuer.Configuration()
            configuration.lifetime = TimeInterval(demoLifetime)
            var issuerLogger = logger
            issuerLogger.logLevel = max(logger.logLevel, .warning)
            let started = try await DevTokenIssuer.start(configuration, logger: issuerLogger)
            issuer = started
            template = started.urlTemplate
            if keys.isEmpty {
                keys = try ["demo-vehicle-1", "demo-vehicle-2", "demo-vehicle-3"].map { try key(.vehicle, $0) }
                    + ["demo-trip-1", "demo-trip-2"].map { try key(.trip, $0) }
            }
            DemoBanner.print(url: started.urlTemplate, lifetime: demoLifetime,
                             socket: try listenAddresses(demo: true).compactMap { if case .unix(let path) = $0 { path } else { nil } }.first,
                             example: keys.first)
        }
        guard !keys.isEmpty || subjectsFile != nil && !once else {
            throw ValidationError("give at least one --vehicle, --trip, --delivery-vehicle, --task or --subjects-file subject to keep tokens for")
        }

        var fetcherConfiguration = HTTPTokenFetcherConfiguration(urlTemplate: template!)
        fetcherConfiguration.headers = headers.compactMap(HeaderArgument.parseHeader)
        fetcherConfiguration.headerFiles = headerFiles.compactMap(HeaderArgument.parseHeaderFile)
        fetcherConfiguration.tokenKey = tokenKey
        fetcherConfiguration.expirationKey = expirationKey.isEmpty ? nil : expirationKey
        fetcherConfiguration.expirationFormat = expirationFormat
        fetcherConfiguration.allowInsecureHTTP = allowInsecureHTTP
        fetcherConfiguration.connectTimeout = connectTimeout
        fetcherConfiguration.totalTimeout = requestTimeout
        fetcherConfiguration.method = method
        fetcherConfiguration.body = try requestBody()
        fetcherConfiguration.tls.caFiles = caFiles
        fetcherConfiguration.tls.extraCAFiles = extraCAFiles
        fetcherConfiguration.tls.clientCertificateFile = clientCertificate
        fetcherConfiguration.tls.clientKeyFile = clientKey
        // The demo issuer is on loopback: no proxy, whatever the environment says.
        fetcherConfiguration.proxy = issuer == nil ? try proxySettings() : .direct
        if let chosen = URL(string: template!.replacingOccurrences(of: "{kind}", with: "vehicle").replacingOccurrences(of: "{id}", with: "x"))
            .flatMap(fetcherConfiguration.proxy.proxy(for:)) {
            logger.info("token provider requests go through a proxy", metadata: ["proxy": "\(chosen)"])
        }
        if !fetcherConfiguration.proxy.noProxy.ignoredEntries.isEmpty {
            logger.warning("NO_PROXY entries that can never match (not a host name, address or CIDR block, or a bad port)",
                           metadata: ["entries": "\(fetcherConfiguration.proxy.noProxy.ignoredEntries.joined(separator: ","))"])
        }

        let fetcher: HTTPTokenFetcher
        let store: SQLiteTokenRepository
        do {
            fetcher = try HTTPTokenFetcher(configuration: fetcherConfiguration, logger: logger)
        } catch {
            await issuer?.stop()
            throw ValidationError(error.description)
        }
        do {
            store = try SQLiteTokenRepository(path: path, mode: .agent, logger: logger)
        } catch {
            await fetcher.shutdown()
            await issuer?.stop()
            FileHandle.standardError.write(Data("token-agent: \(error)\n".utf8))
            throw ExitCode(1)
        }
        if let moved = store.openReport.quarantinedTo {
            FileHandle.standardError.write(Data("token-agent: the token store was corrupt; moved it to \(moved) and started a fresh one\n".utf8))
        }
        var policy = RefreshPolicy()
        policy.retention = retention.seconds
        policy.allowOpaqueTokens = allowOpaqueTokens
        policy.leaseDuration = leaseDuration
        let engine = TokenSyncEngine(repository: store, fetcher: fetcher, policy: policy, logger: logger)
        let output = AgentOutput(json: json)

        var failed = false
        if once {
            failed = await OnceRun(engine: engine, keys: keys, output: output).run()
            await engine.shutdown()
        } else {
            let addresses = try listenAddresses(demo: issuer != nil)
            var api: TokenAPIService?
            var tokenAPI: TokenAPI?
            if !addresses.isEmpty {
                var apiConfiguration = TokenAPI.Configuration(allowList: try allowList(keys: keys), readinessSubjects: keys)
                apiConfiguration.invalidateInterval = invalidateInterval.seconds
                apiConfiguration.metricsText = { registry.emitToString() }
                let apiLogger = logger
                tokenAPI = TokenAPI(engine: engine, configuration: apiConfiguration, logger: logger)
                let service = TokenAPIService(
                    api: tokenAPI!, engine: engine,
                    addresses: addresses, socketMode: socketModeValue ?? 0o660, logger: logger,
                    onListening: { address in apiLogger.notice("token API listening", metadata: ["address": "\(address)"]) })
                do {
                    try service.prepare()
                } catch {
                    await fetcher.shutdown()
                    store.close()
                    await issuer?.stop()
                    FileHandle.standardError.write(Data("token-agent: \(error)\n".utf8))
                    throw ExitCode(1)
                }
                FileDescriptorLimit.raise()
                api = service
            }
            let reloader = SubjectReloader(engine: engine, path: subjectsFile, fixed: Set(keys).subtracting(fileOnly), current: fileKeys, output: output, logger: logger, api: tokenAPI)
            var fileSink: TokenFileSink?
            if let sink {
                let service = TokenFileSink(engine: engine, directory: sink, fileMode: sinkModeValue ?? 0o640, logger: logger)
                do {
                    try service.prepare()
                } catch {
                    await fetcher.shutdown()
                    store.close()
                    await issuer?.stop()
                    FileHandle.standardError.write(Data("token-agent: \(error)\n".utf8))
                    throw ExitCode(1)
                }
                fileSink = service
            }
            try await LongLivedRun(engine: engine, keys: keys, output: output, logger: logger, api: api, reloader: reloader, sink: fileSink,
                               releaseStoreMemory: { store.releaseMemory() }).run()
        }
        await fetcher.shutdown()
        store.close()
        await issuer?.stop()
        if failed { throw ExitCode(1) }
    }
}

/// Parses the `--header` and `--header-file` argument forms.
enum HeaderArgument {
    /// `--header`, or `--header #2` when there are several.
    static func flag(_ name: String, _ index: Int, of count: Int) -> String {
        count > 1 ? "\(name) #\(index + 1)" : name
    }

    /// The fetcher's own header rules, as a usage error naming the flag.
    static func check(_ flag: String, name: String, value: String) throws {
        do {
            try HTTPTokenFetcher.checkHeader(name: name, value: value)
        } catch {
            guard case .invalidHeader(let detail) = error else { throw ValidationError("\(flag): \(error.description)") }
            throw ValidationError("\(flag): \(detail)")
        }
    }

    static func parseHeader(_ text: String) -> (name: String, value: String)? {
        guard let colon = text.firstIndex(of: ":") else { return nil }
        let name = text[..<colon].trimmingCharacters(in: .whitespaces)
        let value = text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        return name.isEmpty ? nil : (name, value)
    }

    static func parseHeaderFile(_ text: String) -> (name: String, path: String)? {
        guard let colon = text.firstIndex(of: ":") else { return nil }
        let name = text[..<colon].trimmingCharacters(in: .whitespaces)
        let path = String(text[text.index(after: colon)...])
        return name.isEmpty || path.isEmpty ? nil : (name, path)
    }
}

enum DemoBanner {
    static func print(url: String, lifetime: Int, socket: String?, example: TokenKey?) {
        var lines = [
            String(repeating: "=", count: 78),
            " token-agent: DEMO MODE - NOT FOR PRODUCTION",
            " Tokens come from an embedded development issuer at",
            " \(url)",
            " that signs a token for anyone who asks (\(lifetime) s lifetime, so refreshes show soon).",
            " Pass --provider-url with your token provider's URL for real use.",
        ]
        if let socket, let example {
            lines += [" Ask it for a token from another terminal:",
                      "   curl --unix-socket \(socket) -H 'Fleet-Token-Request: true' http://localhost/v1/token/\(example.kind.rawValue)/\(example.subjectID)"]
        }
        lines.append(String(repeating: "=", count: 78))
        FileHandle.standardError.write(Data((lines.joined(separator: "\n") + "\n").utf8))
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}
extension HTTPTokenFetcherConfiguration.ExpirationFormat: ExpressibleByArgument {}

extension ProviderRequestMethod: ExpressibleByArgument {
    /// `GET` or `POST`, in any case.
    public init?(argument: String) {
        self.init(rawValue: argument.uppercased())
    }
}


/// The open-files limit: 1,000 idle API clients must not stop the next one being served.
enum FileDescriptorLimit {
    /// Raises the soft limit to the hard limit.
    static func raise() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
}
