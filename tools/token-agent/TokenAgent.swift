// token-agent: the reference long-lived agent. Keeps every given subject's token fresh in the
// store until SIGTERM/SIGINT, or (--once) makes sure each has a usable token and exits.

public import ArgumentParser
import Configuration
import DevTokenIssuer
public import FleetTokenHTTP
public import FleetTokenService
import FleetTokenStore
import Foundation
public import Logging
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

            Every option can also come from a config file (--config; its keys are the long flag names) \
            or a TOKEN_AGENT_<FLAG> variable; flags win over variables, variables over the file. \
            SIGHUP (or a change of the config file) reloads subjects, allow patterns, headers, TLS files \
            and the log level.

            Exit codes: 0 ok (every subject has a usable token with --once; clean stop on SIGTERM/SIGINT), \
            1 operational error (a subject without a usable token, a store or provider problem), 64 usage error, \
            78 the provider refused every subject (--exit-on-permanent-error).
            """)

    @Option(help: "A config file (YAML or JSON) whose keys are these flags' long names; flags and TOKEN_AGENT_* variables override it (default: $TOKEN_AGENT_CONFIG).")
    var config: String?

    @Flag(name: .customLong("print-config"), help: "Print the effective configuration (secrets redacted), with where each value came from, and exit.")
    var printConfig = false

    @Option(help: "The token store (default: $TOKEN_STORE_DB, else ./tokens.sqlite).")
    var db: String?

    @Option(name: .customLong("encryption-key-file"),
            help: "A file of 32 random bytes (raw or base64) sealing stored token values (repeatable: the first seals, the others only open, for a rotation; default: $CREDENTIALS_DIRECTORY/token-store-key when systemd gives it).")
    var encryptionKeyFiles: [String] = []

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

    @Option(name: .customLong("method"), help: "HTTP method of requests to the provider: GET (default) or POST.")
    var method: ProviderRequestMethod?

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
    var expirationKey: String?

    @Option(name: .customLong("expiration-format"),
            help: "How the expiration is written: auto (default), epoch-seconds, epoch-millis, relative-seconds.")
    var expirationFormat: HTTPTokenFetcherConfiguration.ExpirationFormat?

    @Flag(name: .customLong("allow-insecure-http"), help: "Allow plain http:// to a non-loopback provider.")
    var allowInsecureHTTP = false

    @Flag(help: "Make sure each subject has a usable token, print it, and exit.")
    var once = false

    @Flag(help: "Print JSON: with --once an array, otherwise one object per event.")
    var json = false

    @Option(name: .customLong("log-level"), help: "Log level on stderr: trace, debug, info (default), notice, warning, error, critical; a reload applies a change.")
    var logLevel: Logger.Level?

    @Option(name: .customLong("log-format"), help: "Log lines on stderr as text (default) or json (one object a line, for journald and log shippers).")
    var logFormat: LogFormat?

    @Option(name: .customLong("connect-timeout"), help: "Seconds to wait for a connection to the provider (default 5).")
    var connectTimeout: Double?

    @Option(name: .customLong("request-timeout"), help: "Seconds to wait for the provider's whole answer (default 15).")
    var requestTimeout: Double?

    @Option(name: .customLong("demo-lifetime"), help: ArgumentHelp("Token lifetime of the demo issuer, in seconds.", visibility: .hidden))
    var demoLifetime: Int?

    @Option(help: "Delete rows of subjects nobody here tracks or uses once expired this long: 90s, 30m, 24h (default 1d), 7d; 0 keeps everything.")
    var retention: DurationArgument?

    @Flag(name: .customLong("allow-opaque-tokens"),
          help: "Accept tokens that are not JWTs (with a stated expiry), and JWTs without iat or the authorization claim.")
    var allowOpaqueTokens = false

    @Option(name: .customLong("listen"),
            help: "Serve the local token API on unix:PATH or 127.0.0.1:PORT (repeatable; demo mode: unix:./token-agent.sock).")
    var listen: [String] = []

    @Flag(name: .customLong("allow-non-loopback-listen"), help: "Allow --listen on an address other than loopback.")
    var allowNonLoopbackListen = false

    @Option(name: .customLong("socket-mode"), help: "Mode of the API's Unix socket files, in octal (default 0660).")
    var socketMode: String?

    @Option(name: .customLong("sink"), help: "Keep each subject's current token in DIR/{kind}/{id}.jwt, replaced atomically on every refresh.")
    var sink: String?

    @Option(name: .customLong("sink-mode"), help: "Mode of the --sink token files, in octal (default 0640).")
    var sinkMode: String?

    @Option(name: .customLong("allow"),
            help: "Also hand out subjects matching KIND:GLOB over the API, e.g. 'trip:*' or 'vehicle:truck-*' (repeatable).")
    var allowPatterns: [String] = []

    @Option(name: .customLong("allow-client"),
            help: "Grant a Unix-socket caller subjects: 'user:NAME KIND:GLOB', 'group:NAME KIND:GLOB', 'uid:N …' or 'gid:N …' (repeatable). With any such rule, a caller gets only what a rule for its uid or groups grants; not with a TCP --listen.")
    var allowClients: [String] = []

    @Option(name: .customLong("invalidate-interval"), help: "Shortest time between two forced refetches of one key through the API: 10s (default), 1m.")
    var invalidateInterval: DurationArgument?

    @Option(name: .customLong("max-dynamic-subjects"),
            help: "Most subjects asked for through --allow patterns held at once (default 10000); past it the API answers 503 with Retry-After.")
    var maxDynamicSubjects: Int?

    @Option(name: .customLong("max-api-connections"),
            help: "Most API connections open at once (default 4096, less when the open-files limit minus a reserve of 64 is lower); past it a connection is answered 503 and closed.")
    var maxAPIConnections: Int?

    @Option(name: .customLong("max-api-connections-per-peer"),
            help: "Most API connections open at once from one peer: a TCP client's address, a Unix-socket client's user (default half the overall cap).")
    var maxAPIConnectionsPerPeer: Int?

    @Flag(name: .customLong("exit-on-permanent-error"),
          help: "Exit with code 78 when the provider answers 401/403 to every subject --permanent-error-attempts times in a row, instead of retrying forever.")
    var exitOnPermanentError = false

    @Option(name: .customLong("permanent-error-attempts"), help: "Refusals in a row that count as permanent (default 3).")
    var permanentErrorAttempts: Int?

    @Option(name: .customLong("lease-duration"),
            help: ArgumentHelp("Seconds a cross-process refresh lease lasts between renewals.", visibility: .hidden))
    var leaseDuration: Double?

    @Option(name: .customLong("idle-window"),
            help: ArgumentHelp("Seconds an untracked subject nobody asks for is still refreshed before it is dropped from memory (default 600).", visibility: .hidden))
    var idleWindow: Double?

    @Option(name: .customLong("failure-backoff"),
            help: ArgumentHelp("Seconds of the first backoff after a refusal the provider will repeat (default 30).", visibility: .hidden))
    var failureBackoff: Double?

    /// The options given on the command line, by key, as text: the highest-precedence source.
    var flagValues: [String: ConfigContent] {
        var values: [String: ConfigContent] = [:]
        let lists: [(String, [String])] = [
            ("vehicle", vehicles), ("trip", trips), ("delivery-vehicle", deliveryVehicles), ("task", tasks), ("header", headers),
            ("header-file", headerFiles), ("ca-file", caFiles), ("extra-ca-file", extraCAFiles), ("listen", listen), ("allow", allowPatterns), ("allow-client", allowClients),
            ("encryption-key-file", encryptionKeyFiles),
        ]
        for (key, list) in lists where !list.isEmpty { values[key] = .stringArray(list) }
        let texts: [(String, String?)] = [
            ("db", db), ("provider-url", providerURL), ("subjects-file", subjectsFile), ("method", method?.rawValue),
            ("body-template", bodyTemplate), ("content-type", contentType), ("client-cert", clientCertificate), ("client-key", clientKey),
            ("proxy", proxy), ("token-key", tokenKey), ("expiration-key", expirationKey), ("expiration-format", expirationFormat?.rawValue),
            ("log-level", logLevel?.rawValue), ("log-format", logFormat?.rawValue), ("connect-timeout", connectTimeout.map { String($0) }),
            ("request-timeout", requestTimeout.map { String($0) }), ("demo-lifetime", demoLifetime.map(String.init)),
            ("retention", retention?.description), ("socket-mode", socketMode), ("sink", sink), ("sink-mode", sinkMode),
            ("invalidate-interval", invalidateInterval?.description), ("permanent-error-attempts", permanentErrorAttempts.map(String.init)),
            ("max-dynamic-subjects", maxDynamicSubjects.map(String.init)),
            ("max-api-connections", maxAPIConnections.map(String.init)), ("max-api-connections-per-peer", maxAPIConnectionsPerPeer.map(String.init)),
            ("lease-duration", leaseDuration.map { String($0) }), ("failure-backoff", failureBackoff.map { String($0) }),
            ("idle-window", idleWindow.map { String($0) }),
        ]
        for case (let key, let text?) in texts { values[key] = .string(text) }
        let toggles: [(String, Bool)] = [
            ("no-proxy", noProxy), ("allow-insecure-http", allowInsecureHTTP), ("once", once), ("json", json),
            ("allow-opaque-tokens", allowOpaqueTokens), ("allow-non-loopback-listen", allowNonLoopbackListen),
            ("exit-on-permanent-error", exitOnPermanentError),
        ]
        for (key, on) in toggles where on { values[key] = .string("true") }
        return values
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

    /// The settings from the flags, the environment and the config file (`--config`, else
    /// `$TOKEN_AGENT_CONFIG`), checked.
    func settings(environment: [String: String]) async throws(UsageError) -> (AgentSettings, SettingSources) {
        let path = config ?? environment[AgentOption.configFileVariable].flatMap { $0.isEmpty ? nil : $0 }
        var file: AgentConfigFile?
        if let path {
            do { file = try await AgentConfigFile.load(path) } catch { throw UsageError(error.description) }
        }
        let sources = SettingSources(flags: flagValues, environment: environment, file: file)
        let settings = try AgentSettings.resolve(sources)
        try settings.check(environment: environment)
        do { try settings.checkSteeringFiles() } catch { throw UsageError(error.description) }
        return (settings, sources)
    }

    func run() async throws {
        let environment = ProcessInfo.processInfo.environment
        let settings: AgentSettings
        let sources: SettingSources
        do { (settings, sources) = try await self.settings(environment: environment) } catch { throw ValidationError(error.description) }
        if printConfig {
            let configuration = EffectiveConfiguration(settings: settings, configFile: sources.file?.path,
                                                      storeVariable: environment["TOKEN_STORE_DB"])
            Swift.print(configuration.text, terminator: "")
            return
        }
        try await AgentRun(settings: settings, sources: sources, environment: environment).run()
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
extension LogFormat: ExpressibleByArgument {}

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
