// FleetTokenPostgres: how the repository talks to the database (timeouts, pool size, the
// change feed's reconnect pacing), and the postgres-nio client settings made from it.
import FleetTokenStore
import FleetTokenMigrations
import Foundation
import NIOSSL
import PostgresNIO

/// How ``PostgresTokenRepository`` uses its database.
public struct PostgresStoreConfiguration: Sendable {
    /// Where the database is.
    public var location: PostgresStoreLocation
    /// A file holding only the password (say, a systemd credential), read at open; comes
    /// before the URL's password, `PGPASSWORD` and the libpq password file. Refused when
    /// another user could have written it (``SteeringFileCheck``).
    public var passwordFile: String?
    /// The server ends any statement running longer (`statement_timeout`), and no operation
    /// waits longer for a connection: the engine then serves from memory and retries.
    public var statementTimeout: Duration = .seconds(10)
    /// How long establishing one connection may take.
    public var connectTimeout: Duration = .seconds(5)
    /// How long a call waits for a pooled connection before checking, with one direct
    /// connection attempt, whether the database is there at all. When it is not, the call and
    /// every call after it fail at once (one a second tries again) instead of waiting out the
    /// statement timeout: a refresh then goes on without its lease instead of waiting.
    public var connectionWait: Duration = .seconds(1)
    /// Connections in the pool (one more is used by the change feed while it runs).
    public var maximumConnections: Int = 8
    /// The change feed's first wait before reconnecting after a lost connection; doubled
    /// after each failed attempt up to ``feedReconnectMaximum``.
    public var feedReconnectInitial: Duration = .milliseconds(200)
    /// The longest wait between the change feed's reconnect attempts.
    public var feedReconnectMaximum: Duration = .seconds(5)
    /// How often the change feed proves its LISTEN connection alive: a `SELECT 1` there, to be
    /// answered within ``statementTimeout``, or the connection is lost (reconnect, `.unknown`).
    /// Nothing else is sent on it, and a flow a NAT dropped or a host that lost power gives no
    /// error by itself. Not public: tests shorten it.
    var feedProbeInterval: Duration = .seconds(15)
    /// The environment the password is looked up in (`PGPASSWORD`, `PGPASSFILE`, `HOME`).
    public var environment: [String: String] = ProcessInfo.processInfo.environment
    /// The migrations applied (tests replace them to build older and newer schemas).
    var migrations: [EmbeddedMigration] = EmbeddedMigrations.postgres

    /// A configuration for `location`, with the defaults above.
    public init(location: PostgresStoreLocation) {
        self.location = location
    }

    /// A configuration for the connection URL `url`.
    /// - Throws: ``PostgresURLError`` when the URL cannot be used.
    public init(url: String) throws(PostgresURLError) {
        self.init(location: try PostgresStoreLocation(url: url))
    }

    /// The postgres-nio settings of each host of the URL, in its order: for the pool and for one
    /// direct connection (opening, migrating and host searches, where a refusal must be reported
    /// at once, not after the pool's retries); `applicationName` marks this repository's own
    /// writes in the change feed. The CA file is read, and the TLS context made, once for all.
    func clientConfigurations(applicationName: String) throws(TokenStoreError)
        -> [(pool: PostgresClient.Configuration, direct: PostgresConnection.Configuration)] {
        var tls: (settings: TLSConfiguration, enforced: Bool)?
        var directTLS = PostgresConnection.Configuration.TLS.disable
        if location.socketPath == nil, let settings = try tlsConfiguration() {
            tls = settings
            do {
                let context = try NIOSSLContext(configuration: settings.settings)
                directTLS = settings.enforced ? .require(context) : .prefer(context)
            } catch {
                throw .databaseUnavailable(path: location.description, reason: "TLS could not be set up: \(error)")
            }
        }
        var configurations: [(pool: PostgresClient.Configuration, direct: PostgresConnection.Configuration)] = []
        for server in location.hosts {
            configurations.append(try clientConfiguration(applicationName: applicationName, server: server, tls: tls, directTLS: directTLS))
        }
        return configurations
    }

    /// The settings for `server`, one host of the URL.
    private func clientConfiguration(applicationName: String, server: PostgresStoreLocation.Host, tls: (settings: TLSConfiguration, enforced: Bool)?,
                                     directTLS: PostgresConnection.Configuration.TLS) throws(TokenStoreError)
        -> (pool: PostgresClient.Configuration, direct: PostgresConnection.Configuration) {
        let password: String?
        do { password = try location.password(passwordFile: passwordFile, environment: environment, host: server) } catch {
            throw .databaseUnavailable(path: location.description, reason: error.description)
        }
        // application_name is the one startup parameter PgBouncer passes on; the schema
        // (search_path) and the statement timeout are set on each session by
        // PostgresSessionSettings, as a pooler refuses them in the startup packet.
        let parameters = [("application_name", applicationName)]
        var pool: PostgresClient.Configuration
        var direct: PostgresConnection.Configuration
        if let socketPath = location.socketPath {
            pool = .init(unixSocketPath: socketPath, username: location.user, password: password, database: location.database)
            direct = .init(unixSocketPath: socketPath, username: location.user, password: password, database: location.database)
        } else {
            pool = .init(host: server.name, port: server.port, username: location.user, password: password,
                         database: location.database, tls: tls.map { $0.enforced ? .require($0.settings) : .prefer($0.settings) } ?? .disable)
            direct = .init(host: server.name, port: server.port, username: location.user, password: password,
                           database: location.database, tls: directTLS)
        }
        pool.options.connectTimeout = connectTimeout
        pool.options.maximumConnections = max(2, maximumConnections)
        pool.options.minimumConnections = 0
        pool.options.additionalStartupParameters = parameters
        direct.options.connectTimeout = .nanoseconds(Int64(connectTimeout.components.seconds) * 1_000_000_000
                                                     + connectTimeout.components.attoseconds / 1_000_000_000)
        direct.options.additionalStartupParameters = parameters
        return (pool, direct)
    }

    /// The TLS settings `sslmode` asks for (nil: none), and whether TLS is required.
    private func tlsConfiguration() throws(TokenStoreError) -> (settings: TLSConfiguration, enforced: Bool)? {
        var tls = TLSConfiguration.makeClientConfiguration()
        if let ca = location.sslRootCertificate {
            // Read once, judged as a steering file (whoever can write it can have the store
            // trust their own server), and trusted as read: not by path at connect time.
            let data: Data
            do { data = try SteeringFileCheck.read(path: ca, role: "sslrootcert CA file") } catch {
                let reason = switch error.code {
                case .missing, .unreadable: "the CA file \(ca) (sslrootcert) cannot be read"
                default: error.description
                }
                throw .databaseUnavailable(path: location.description, reason: reason)
            }
            guard let roots = try? NIOSSLCertificate.fromPEMBytes(Array(data)), !roots.isEmpty else {
                throw .databaseUnavailable(path: location.description, reason: "the CA file \(ca) (sslrootcert) holds no PEM certificate")
            }
            tls.trustRoots = .certificates(roots)
        }
        switch location.sslMode {
        case .disable:
            return nil
        case .prefer:
            tls.certificateVerification = .none
            return (tls, false)
        case .require:
            // libpq's require: encrypted, the server not verified (unless a CA file is given,
            // where libpq verifies the chain as verify-ca does).
            tls.certificateVerification = location.sslRootCertificate == nil ? .none : .noHostnameVerification
            return (tls, true)
        case .verifyCA:
            tls.certificateVerification = .noHostnameVerification
            return (tls, true)
        case .verifyFull:
            tls.certificateVerification = .fullVerification
            return (tls, true)
        }
    }
}
