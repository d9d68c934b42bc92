// Every option of token-agent, each declared once: its name (the long flag without dashes,
// which is also the config file's key and gives the TOKEN_AGENT_ variable), its value's shape,
// parser and default, its help, and whether it is secret or reloadable. The flags, the config
// file, the environment, `--print-config`, the reload diff and `--help` are made from this table
// (AgentOptions.swift). Adding an option: a property here, and the code that uses its value
// (`settings.name`, through AgentSettings' dynamic members).

import AgentVariables
import FleetTokenHTTP
import FleetTokenService
import TokenAgentRuntime
import FleetTokenStore
import Logging

/// The options, in the order `--help` and `--print-config` show them.
struct AgentOptionTable: Sendable {
    /// The one table.
    static let options = AgentOptionTable()

    // A PostgreSQL URL may hold the database password (--print-config shows it as ***).
    // TOKEN_STORE_DB, the library's tools' variable, is a variable too: after TOKEN_AGENT_DB,
    // before the config file.
    let db: AgentOptionSpec<String?> = .text("db", help: "The token store (default: $TOKEN_STORE_DB, else ./tokens.sqlite).")
        .secretValues().alsoReadFrom(AgentVariables.storeVariable)
    let encryptionKeyFiles: AgentOptionSpec<[String]> = .list("encryption-key-file", help: "A file of 32 random bytes (raw or base64) sealing stored token values (repeatable: the first seals, the others only open, for a rotation; default: $CREDENTIALS_DIRECTORY/token-store-key when systemd gives it).")
    let providerURL: AgentOptionSpec<String?> = .text("provider-url", help: "Token provider URL with {kind} and {id} placeholders, e.g. https://auth.example.com/fleet/{kind}/{id}.")
    // The subject flags are taken off the command line before the others (SubjectArguments.swift).
    let vehicles: AgentOptionSpec<[String]> = .list("vehicle", help: "A vehicle ID to keep a token for (repeatable).")
        .reloadable()
    let trips: AgentOptionSpec<[String]> = .list("trip", help: "A trip ID to keep a token for (repeatable).")
        .reloadable()
    let deliveryVehicles: AgentOptionSpec<[String]> = .list("delivery-vehicle", help: "A delivery vehicle ID (Fleet Engine Deliveries) to keep a token for (repeatable).")
        .reloadable()
    let tasks: AgentOptionSpec<[String]> = .list("task", help: "A task ID (Fleet Engine Deliveries) to keep a token for (repeatable).")
        .reloadable()
    let subjectsFile: AgentOptionSpec<String?> = .text("subjects-file", help: "A file of subjects, one KIND:ID a line (# comments), added to the flags'; SIGHUP re-reads it.")
        .reloadable()
    let headers: AgentOptionSpec<[String]> = .list("header", help: "A header sent to the provider, 'Name: value' (repeatable).")
        .secretValues().reloadable().oneItemALineInEnvironment()
    let headerFiles: AgentOptionSpec<[String]> = .list("header-file", help: "A header whose value is read from a file and re-read when it changes, 'Name:PATH' (repeatable).")
        .reloadable().oneItemALineInEnvironment()
    let method: AgentOptionSpec<ProviderRequestMethod> = .choice("method", default: .get, expected: "GET or POST",
                                                               parse: { ProviderRequestMethod(rawValue: $0.uppercased()) },
                                                               help: "HTTP method of requests to the provider: GET (default) or POST.")
    let bodyTemplate: AgentOptionSpec<String?> = .text("body-template", help: "POST body with {id} and {kind} placeholders, e.g. '{\"vehicleId\":\"{id}\"}' (needs --method POST).")
        .secretValues()
    let contentType: AgentOptionSpec<String?> = .text("content-type", help: "Content type of the body: application/json (default), application/x-www-form-urlencoded or text/plain.")
    let caFiles: AgentOptionSpec<[String]> = .list("ca-file", help: "PEM bundle of the CAs to trust for the provider, instead of the system's (repeatable).")
        .reloadable()
    let extraCAFiles: AgentOptionSpec<[String]> = .list("extra-ca-file", help: "PEM bundle of CAs to trust besides the system's (repeatable).")
        .reloadable()
    let clientCertificate: AgentOptionSpec<String?> = .text("client-cert", help: "PEM client certificate (chain allowed) for mutual TLS; re-read when it changes.")
        .reloadable()
    let clientKey: AgentOptionSpec<String?> = .text("client-key", help: "PEM private key of --client-cert; re-read when it changes.")
        .reloadable()
    let proxy: AgentOptionSpec<String?> = .text("proxy", help: "Forward proxy for provider requests and the Fleet Engine proxy's calls, http://[USER:PASSWORD@]HOST[:PORT] (port 1080 when left out), instead of HTTPS_PROXY/HTTP_PROXY.")
        .secretValues()
    let noProxy: AgentOptionSpec<Bool> = .toggle("no-proxy", help: "Reach the provider directly, whatever HTTPS_PROXY/HTTP_PROXY say.")
    let tokenKey: AgentOptionSpec<String?> = .text("token-key", help: "JSON field (or JSON pointer such as /data/token) of the token for every kind (default VEHICLE_TOKEN_KEY, TRIP_TOKEN_KEY, DELIVERY_VEHICLE_TOKEN_KEY, TASK_TOKEN_KEY).")
    let expirationKey: AgentOptionSpec<String> = .text("expiration-key", default: "TOKEN_EXPIRATION", help: "JSON field (or JSON pointer) of the expiration (default TOKEN_EXPIRATION).")
    let expirationFormat: AgentOptionSpec<HTTPTokenFetcherConfiguration.ExpirationFormat> = .choice(
        "expiration-format", default: .auto, expected: "auto, epoch-seconds, epoch-millis or relative-seconds",
        help: "How the expiration is written: auto (default), epoch-seconds, epoch-millis, relative-seconds.")
    let allowInsecureHTTP: AgentOptionSpec<Bool> = .toggle("allow-insecure-http", help: "Allow plain http:// to a non-loopback provider.")
    let allowOpaqueTokens: AgentOptionSpec<Bool> = .toggle("allow-opaque-tokens", help: "Accept tokens that are not JWTs (with a stated expiry), and JWTs without iat or the authorization claim.")
    let connectTimeout: AgentOptionSpec<Double> = .seconds("connect-timeout", default: 5, help: "Seconds to wait for a connection to the provider (default 5).")
    let requestTimeout: AgentOptionSpec<Double> = .seconds("request-timeout", default: 15, help: "Seconds to wait for the provider's whole answer (default 15).")
    let retention: AgentOptionSpec<DurationArgument> = .duration("retention", default: DurationArgument(seconds: 86_400),
                                                                 expected: "a duration such as 90s, 30m, 24h or 7d",
                                                                 help: "Delete rows of subjects nobody here tracks or uses once expired this long: 90s, 30m, 24h (default 1d), 7d; 0 keeps everything.")
    let once: AgentOptionSpec<Bool> = .toggle("once", help: "Make sure each subject has a usable token, print it, and exit.")
    let json: AgentOptionSpec<Bool> = .toggle("json", help: "Print JSON: with --once an array, otherwise one object per event.")
    let maxEventLines: AgentOptionSpec<Int> = .integer("max-event-lines", default: 1000, help: "Most per-subject event lines on stdout in 30 s (default 1000; 0: no limit); past it they are counted, and a line says how many of each were withheld, so a large fleet's start cannot use up journald's rate limit and lose the agent's warnings.")
    let logLevel: AgentOptionSpec<Logger.Level> = .choice("log-level", default: .info, expected: "trace, debug, info, notice, warning, error or critical",
                                                         help: "Log level on stderr: trace, debug, info (default), notice, warning, error, critical; a reload applies a change.")
        .reloadable()
    let logFormat: AgentOptionSpec<LogFormat> = .choice("log-format", default: .text, expected: "text or json",
                                                       help: "Log lines on stderr as text (default) or json (one object a line, for journald and log shippers).")
    let listen: AgentOptionSpec<[String]> = .list("listen", help: "Serve the local token API on unix:PATH or 127.0.0.1:PORT (repeatable; demo mode: unix:./token-agent.sock).")
    let allowNonLoopbackListen: AgentOptionSpec<Bool> = .toggle("allow-non-loopback-listen", help: "Allow --listen on an address other than loopback.")
    let socketMode: AgentOptionSpec<String> = .text("socket-mode", default: "0660", help: "Mode of the API's Unix socket files, in octal (default 0660).")
    let allow: AgentOptionSpec<[String]> = .list("allow", help: "Also hand out subjects matching KIND:GLOB over the API, e.g. 'trip:*' or 'vehicle:truck-*' (repeatable).")
        .reloadable()
    let allowClient: AgentOptionSpec<[String]> = .list("allow-client", help: "Grant a Unix-socket caller subjects: 'user:NAME KIND:GLOB', 'group:NAME KIND:GLOB', 'uid:N …' or 'gid:N …' (repeatable). With any such rule, a caller gets only what a rule for its uid or groups grants; not with a TCP --listen.")
        .reloadable()
    let invalidateInterval: AgentOptionSpec<DurationArgument> = .duration("invalidate-interval", default: DurationArgument(seconds: 10),
                                                                          expected: "a duration such as 10s or 1m",
                                                                          help: "Shortest time between two forced refetches of one key through the API: 10s (default), 1m.")
    let maxDynamicSubjects: AgentOptionSpec<Int> = .integer("max-dynamic-subjects", default: 10_000, help: "Most subjects asked for through --allow patterns held at once (default 10000); past it the API answers 503 with Retry-After.")
    let maxAPIConnections: AgentOptionSpec<Int> = .integer("max-api-connections", default: APIConnectionLimits.defaultMaxConnections, help: "Most API connections open at once (default 4096, less when the open-files limit minus a reserve of 64 is lower); past it a connection is answered 503 and closed.")
    /// nil: half the overall cap in force.
    let maxAPIConnectionsPerPeer: AgentOptionSpec<Int?> = .integer("max-api-connections-per-peer", help: "Most API connections open at once from one peer: a TCP client's address, a Unix-socket client's user (default half the overall cap).")
    let fleetEngineListen: AgentOptionSpec<[String]> = .list("fleet-engine-listen", help: "Serve the Fleet Engine proxy on unix:PATH or 127.0.0.1:PORT (repeatable): gRPC and REST clients call it without credentials, and each call goes to Fleet Engine with the token of the vehicle, trip or task it names.")
    let fleetEngineURL: AgentOptionSpec<String> = .text("fleet-engine-url", default: "https://fleetengine.googleapis.com", help: "Where the Fleet Engine proxy sends calls (default https://fleetengine.googleapis.com; plain http:// to loopback only).")
    let fleetEngineCAFile: AgentOptionSpec<String?> = .text("fleet-engine-ca-file", help: "PEM file of the CAs to trust for --fleet-engine-url, instead of the system's.")
    let fleetEngineDefaultSubject: AgentOptionSpec<String?> = .text("fleet-engine-default-subject", help: "KIND:ID whose token the proxy puts on fleet-wide calls (create, list, search, batch), e.g. a subject your server mints a wildcard token for; without it such calls are refused.")
    let sink: AgentOptionSpec<String?> = .text("sink", help: "Keep each subject's current token in DIR/{kind}/{id}.jwt, replaced atomically on every refresh.")
    let sinkMode: AgentOptionSpec<String> = .text("sink-mode", default: "0640", help: "Mode of the --sink token files, in octal (default 0640).")
    let exitOnPermanentError: AgentOptionSpec<Bool> = .toggle("exit-on-permanent-error", help: "Exit with code 78 when the provider answers 401/403 to every subject --permanent-error-attempts times in a row, instead of retrying forever.")
    let permanentErrorAttempts: AgentOptionSpec<Int> = .integer("permanent-error-attempts", default: 3, help: "Refusals in a row that count as permanent, 1 to 1000 (default 3).")
    let leaseDuration: AgentOptionSpec<Double> = .seconds("lease-duration", default: 30, help: "Seconds a cross-process refresh lease lasts between renewals (default 30); keep the clocks of hosts sharing a store within two thirds of it.")

    // Test and tuning knobs the help hides.
    /// The --max-event-lines window, in seconds (shorter in tests).
    let eventLineWindow: AgentOptionSpec<Double> = .seconds("event-line-window", default: 30, help: "Seconds of the --max-event-lines window (default 30).")
        .hiddenFromHelp()
    let demoLifetime: AgentOptionSpec<Int> = .integer("demo-lifetime", default: 120, expected: "a whole number of seconds", help: "Token lifetime of the demo issuer, in seconds.")
        .hiddenFromHelp()
    /// Seconds an untracked subject is kept fresh after its last use (RefreshPolicy.idleWindow).
    let idleWindow: AgentOptionSpec<Double> = .seconds("idle-window", default: 600, help: "Seconds an untracked subject nobody asks for is still refreshed before it is dropped from memory (default 600).")
        .hiddenFromHelp()
    /// First backoff after a refusal the provider will repeat (401, 403, a bad answer); nil: the policy's.
    let failureBackoff: AgentOptionSpec<Double?> = .seconds("failure-backoff", help: "Seconds of the first backoff after a refusal the provider will repeat (default 30).")
        .hiddenFromHelp()
}
