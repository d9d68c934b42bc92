// FleetTokenPostgres: where the token database is, read from a libpq-style connection URL
// (`postgres://user@host:5432/db?sslmode=verify-full&sslrootcert=/path/ca.pem&schema=fleet`).
// The password never appears in a description, a log or an error.
import FleetTokenStore
import Foundation

/// Where a PostgreSQL token store lives and how to reach it, from a connection URL.
///
/// Accepted: `postgres://` or `postgresql://`, then `user[:password]@host[:port]/database`
/// (several hosts as libpq takes them: `user@h1:5432,h2:5433/database`), then query parameters:
/// - `sslmode`: `disable`, `prefer` (the default), `require` (encrypted, server not verified),
///   `verify-ca` (the server's certificate chains to `sslrootcert`) or `verify-full` (that,
///   and the certificate names the host);
/// - `sslrootcert`: a PEM file of the CA(s) to trust (`verify-ca`, `verify-full`); without it
///   `verify-full` uses the system's trust store, and `verify-ca` is refused (any public
///   certificate, for any name, would pass it);
/// - `host`: a directory holding the server's Unix socket (`/var/run/postgresql`), instead of
///   a TCP host; or host names separated by `,`, in place of the URL's;
/// - `port`: one port for every host, or one per host, separated by `,`;
/// - `target_session_attrs`: `any` (the default with one host), `read-write` (the default with
///   several: a standby is skipped) or `primary`;
/// - `schema`: the schema holding the store's tables (default `fleet_token_store`), so several
///   fleets can share one database;
/// - `passfile`: a libpq password file (`host:port:database:user:password` lines).
///
/// The password comes from the URL, else `PGPASSWORD`, else the password file (`passfile`,
/// `PGPASSFILE` or `~/.pgpass`); ``PostgresStoreConfiguration/passwordFile`` (a file holding
/// just the password) comes before all of them. These files and the `sslrootcert` CA file are
/// refused when another user could have written them (``SteeringFileCheck``): whoever can write
/// the CA file can have the store trust their own server.
///
/// libpq's keyword/value form (`host=db user=agent password=…`) is not accepted: write a URL.
public struct PostgresStoreLocation: Sendable, Equatable, CustomStringConvertible {
    /// How the connection is encrypted and what of the server is verified (libpq's names).
    public enum SSLMode: String, Sendable, Equatable, CaseIterable {
        /// No TLS.
        case disable
        /// TLS when the server offers it, the server not verified (libpq's default).
        case prefer
        /// TLS or no connection; the server verified only when a CA file is given.
        case require
        /// TLS, with a server certificate that chains to the CA file (or the system's roots).
        case verifyCA = "verify-ca"
        /// As ``verifyCA``, and the certificate must name the host: the mode to use across a network.
        case verifyFull = "verify-full"
    }

    /// Which server of several the store uses (libpq's `target_session_attrs`).
    public enum TargetSessionAttributes: String, Sendable, Equatable, CaseIterable {
        /// The first server that answers, whatever it is.
        case any
        /// The first server that accepts writes (`transaction_read_only` off): a standby is
        /// skipped. The default when several hosts are given.
        case readWrite = "read-write"
        /// The first server not in recovery (not a standby).
        case primary
    }

    /// One server of the URL's host list.
    public struct Host: Sendable, Equatable, CustomStringConvertible {
        /// The host name or address.
        public var name: String
        /// The TCP port, also the number in the Unix socket's name.
        public var port: Int

        /// A server at `name`:`port`.
        public init(name: String, port: Int) {
            self.name = name
            self.port = port
        }

        /// `name:port`, an IPv6 address in brackets.
        public var description: String { (name.contains(":") ? "[\(name)]" : name) + ":\(port)" }
    }

    /// The servers, in the order they are tried (one for a Unix socket, whose port it gives).
    public var hosts: [Host]
    /// The first TCP host, or nil when ``socketDirectory`` is set.
    public var host: String? { socketDirectory == nil ? hosts.first?.name : nil }
    /// The first host's TCP port, also the number in the Unix socket's name.
    public var port: Int { hosts.first?.port ?? 5432 }
    /// Which host fits (``TargetSessionAttributes``): `read-write` by default when several
    /// hosts are given, `any` with one.
    public var targetSessionAttributes: TargetSessionAttributes
    /// The directory of the server's Unix socket, when connecting through one.
    public var socketDirectory: String?
    /// The database user.
    public var user: String
    /// The database.
    public var database: String
    /// The schema holding the store's tables.
    public var schema: String
    /// The TLS mode.
    public var sslMode: SSLMode
    /// The CA file trusted for the server's certificate.
    public var sslRootCertificate: String?
    /// A libpq password file named in the URL.
    public var passwordFileFromURL: String?
    /// The password given in the URL; never described.
    var urlPassword: String?

    /// The default schema.
    public static let defaultSchema = "fleet_token_store"

    /// True when `text` is meant for PostgreSQL (as opposed to a SQLite store path): it starts
    /// with `postgres:` or `postgresql:`, so that a URL missing its `//` is refused as a URL
    /// (without being printed) instead of being taken for a file name; or it is a libpq
    /// keyword/value string (``isKeywordConnectionString(_:)``), which ``init(url:)`` refuses
    /// without showing it and ``redacted(_:)`` never shows: it may hold a password.
    public static func isPostgresURL(_ text: String) -> Bool {
        let lower = text.lowercased()
        return lower.hasPrefix("postgres:") || lower.hasPrefix("postgresql:") || isKeywordConnectionString(text)
    }

    /// True when `text` has the shape of a libpq keyword/value connection string
    /// (`host=db user=agent password=…`): after any blanks, a keyword (letters and `_`), any
    /// blanks, then `=`. A SQLite path never starts so unless its file name does; such a file is
    /// named as `./NAME` or by its absolute path.
    public static func isKeywordConnectionString(_ text: String) -> Bool {
        let scalars = text.unicodeScalars.drop { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        let keyword = scalars.prefix { ("a"..."z").contains($0) || ("A"..."Z").contains($0) || $0 == "_" }
        guard !keyword.isEmpty else { return false }
        return scalars.dropFirst(keyword.count).drop { $0 == " " || $0 == "\t" }.first == "="
    }

    /// Whether ``redacted(_:)`` shows a parameter's value: the plain parameters' values, when
    /// they are what the parameter takes (a value in the wrong place may be a pasted password).
    static func isPlainValue(_ value: String, of name: String) -> Bool {
        switch name {
        case "sslmode": SSLMode(rawValue: value) != nil
        case "schema": isPlainIdentifier(value)
        case "host": value.hasPrefix("/") || PostgresHostList.names(value) != nil
        case "port": PostgresHostList.ports(value) != nil
        case "target_session_attrs": TargetSessionAttributes(rawValue: value) != nil
        case "sslrootcert", "passfile": true
        default: false
        }
    }

    /// `text` fit to print: for a PostgreSQL URL, its password (`USER:PASSWORD@`) and the
    /// value of every parameter but the plain ones (`sslmode`, `sslrootcert`, `host`, `port`,
    /// `target_session_attrs`, `schema`,
    /// `passfile`, when their value is one they take) as `***`, whether or not the URL would be
    /// accepted; a URL that cannot be parsed at all is not shown. Any other text (a SQLite
    /// path) as it is.
    ///
    /// `postgres://agent:s3cret@db:5432/fleet?sslmode=require&password=s3cret` becomes
    /// `postgres://agent:***@db:5432/fleet?sslmode=require&password=***`.
    public static func redacted(_ text: String) -> String {
        guard isPostgresURL(text) else { return text }
        if isKeywordConnectionString(text) { return keywordStringNotShown }
        let lower = text.lowercased()
        guard lower.hasPrefix("postgres://") || lower.hasPrefix("postgresql://"), let split = PostgresHostList.split(text),
              split.hostList.isEmpty || PostgresHostList.hasHostShape(split.hostList), var components = URLComponents(string: split.withPlaceholder) else {
            return notShown
        }
        if components.percentEncodedPassword != nil { components.percentEncodedPassword = "***" }
        if let items = components.percentEncodedQueryItems {
            components.percentEncodedQueryItems = items.map { item in
                let name = isShowableName(item.name) ? item.name : "***"
                guard let value = item.value else { return URLQueryItem(name: name, value: nil) }
                return URLQueryItem(name: name, value: isPlainValue(value.removingPercentEncoding ?? value, of: item.name) ? value : "***")
            }
        }
        if components.percentEncodedFragment != nil { components.percentEncodedFragment = "***" }
        guard let shown = components.string else { return notShown }
        guard !split.hostList.isEmpty, let place = shown.range(of: PostgresHostList.placeholder) else { return shown }
        return shown.replacingCharacters(in: place, with: split.hostList)
    }

    /// What ``redacted(_:)`` prints for a PostgreSQL URL it cannot parse.
    static let notShown = "postgres://<not shown: not a valid URL>"
    /// What ``redacted(_:)`` prints for a libpq keyword/value string (which is refused).
    static let keywordStringNotShown = "<not shown: a libpq keyword/value string; write a postgres:// URL>"

    /// A parameter name shown in messages: a short word. Anything else may be a value pasted in
    /// the wrong place.
    static func isShowableName(_ name: String) -> Bool {
        !name.isEmpty && name.count <= 40
            && name.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || ("A"..."Z").contains($0) || ("0"..."9").contains($0) || $0 == "_" || $0 == "-" }
    }

    /// Reads `url`: one host (`postgres://user@db:5432/fleet`) or several, as libpq takes them
    /// (`postgres://user@h1:5432,h2:5433/fleet`, or `host=h1,h2&port=5432,5433`).
    /// - Throws: ``PostgresURLError`` naming what is wrong: a parameter by its name, never its
    ///   value, and never the password.
    public init(url: String) throws(PostgresURLError) {
        guard !Self.isKeywordConnectionString(url) else { throw .keywordString }
        guard Self.isPostgresURL(url) else { throw .notAPostgresURL }
        // URLComponents takes one host: the host list is read by PostgresHostList and the rest
        // of the URL by URLComponents with a placeholder host in its place.
        guard let split = PostgresHostList.split(url), let components = URLComponents(string: split.withPlaceholder) else {
            throw .malformed("not a valid URL")
        }
        guard let user = components.user, !user.isEmpty else {
            throw .malformed("no user: write postgres://USER@HOST:PORT/DATABASE")
        }
        // URLComponents gives user, password and path percent-decoded once already: a second
        // decoding would turn a password's literal `%41` (written `%2541`) into `A`.
        self.user = user
        urlPassword = components.password
        var hosts = try PostgresHostList.hosts(split.hostList)
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        database = path.isEmpty ? self.user : path
        guard !database.contains("/") else { throw .malformed("the database name contains '/'") }
        schema = Self.defaultSchema
        sslMode = .prefer
        var hostNames: [String]?
        var ports: [Int]?
        var attributes: TargetSessionAttributes?
        for item in components.queryItems ?? [] {
            let value = item.value ?? ""
            switch item.name {
            case "sslmode":
                guard let mode = SSLMode(rawValue: value) else {
                    throw .badParameter(name: "sslmode", expected: SSLMode.allCases.map(\.rawValue).joined(separator: ", "))
                }
                sslMode = mode
            case "sslrootcert": sslRootCertificate = value
            case "host":
                if value.hasPrefix("/") && !value.contains(",") {
                    socketDirectory = value
                } else if let names = PostgresHostList.names(value) {
                    hostNames = names
                } else {
                    throw .badParameter(name: "host", expected: "an absolute directory holding the server's Unix socket, "
                                        + "or host names separated by ',' (host=db1,db2)")
                }
            case "port":
                guard let list = PostgresHostList.ports(value) else {
                    throw .badParameter(name: "port", expected: "port numbers from 1 to 65535 separated by ',' (port=5432,5433)")
                }
                ports = list
            case "target_session_attrs":
                guard let wanted = TargetSessionAttributes(rawValue: value) else {
                    throw .badParameter(name: "target_session_attrs",
                                        expected: TargetSessionAttributes.allCases.map(\.rawValue).joined(separator: ", "))
                }
                attributes = wanted
            case "schema":
                guard Self.isPlainIdentifier(value) else {
                    throw .badParameter(name: "schema",
                                        expected: "a lower-case name of letters, digits and '_' (at most 48 characters), not starting with a digit or pg_")
                }
                schema = value
            case "passfile": passwordFileFromURL = value
            case "password":
                throw .badParameter(name: "password", expected: "the password in the URL as USER:PASSWORD@HOST, in PGPASSWORD, "
                                    + "or in a password file (passfile=, PGPASSFILE, ~/.pgpass)")
            default:
                throw .badParameter(name: Self.isShowableName(item.name) ? item.name : "(its name not shown)",
                                    expected: "one of sslmode, sslrootcert, host, port, target_session_attrs, schema, passfile")
            }
        }
        // As libpq: host= replaces the URL's hosts, port= their ports (one port for all, or one each).
        if let hostNames { hosts = hostNames.map { Host(name: $0, port: 5432) } }
        if hosts.isEmpty { hosts = [Host(name: "localhost", port: 5432)] }
        if let ports {
            guard ports.count == 1 || ports.count == hosts.count else {
                throw .malformed("port= lists \(ports.count) ports for \(hosts.count) hosts: give one port, or one per host")
            }
            for index in hosts.indices { hosts[index].port = ports.count == 1 ? ports[0] : ports[index] }
        }
        self.hosts = hosts
        targetSessionAttributes = attributes ?? (hosts.count > 1 ? .readWrite : .any)
        if socketDirectory != nil && hosts.count > 1 {
            throw .badParameter(name: "host", expected: "one server with a Unix socket directory: give no host list with it")
        }
        if socketDirectory != nil && sslMode != .disable && sslMode != .prefer {
            throw .badParameter(name: "sslmode", expected: "disable or prefer with a Unix socket (TLS runs over TCP)")
        }
        // verify-ca checks the chain, not the name: against the system's roots, any public
        // certificate for any name would pass (libpq refuses it too).
        if sslMode == .verifyCA && sslRootCertificate == nil {
            throw .badParameter(name: "sslmode", expected: "verify-ca with sslrootcert=PATH (the CA of your database's certificate), "
                                + "or verify-full to check the host name against the system's trust store")
        }
    }

    /// A schema name used in SQL text without quoting: lower-case letters, digits and `_`.
    static func isPlainIdentifier(_ name: String) -> Bool {
        guard let first = name.unicodeScalars.first, name.unicodeScalars.count <= 48,
              ("a"..."z").contains(first) || first == "_", !name.hasPrefix("pg_") else { return false }
        return name.unicodeScalars.allSatisfy { ("a"..."z").contains($0) || ("0"..."9").contains($0) || $0 == "_" }
    }

    /// The Unix socket's path, when connecting through one.
    public var socketPath: String? {
        socketDirectory.map { "\($0)/.s.PGSQL.\(port)" }
    }

    /// The URL without its password, and the schema: for logs, errors and reports.
    public var description: String {
        var text = "postgres://\(user)@"
        if socketDirectory == nil {
            text += hosts.map(\.description).joined(separator: ",")
        } else {
            text += ":\(port)"
        }
        text += "/\(database)"
        var parameters: [String] = []
        if let socketDirectory { parameters.append("host=\(socketDirectory)") }
        if sslMode != .prefer { parameters.append("sslmode=\(sslMode.rawValue)") }
        if targetSessionAttributes != (hosts.count > 1 ? .readWrite : .any) {
            parameters.append("target_session_attrs=\(targetSessionAttributes.rawValue)")
        }
        if schema != Self.defaultSchema { parameters.append("schema=\(schema)") }
        if !parameters.isEmpty { text += "?" + parameters.joined(separator: "&") }
        return text
    }

    /// Equal when they name the same place the same way (the password is not compared).
    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.description == rhs.description && lhs.sslRootCertificate == rhs.sslRootCertificate
    }

    /// The password to use: `passwordFile`'s contents, else the URL's, else `PGPASSWORD`, else
    /// a matching line of the libpq password file; nil when none (trust or peer auth). Each
    /// file is read as a steering file (``SteeringFileCheck/read(path:role:maximumSize:)``):
    /// refused when another user could have written or replaced it. A libpq password file
    /// that is not a regular file (`PGPASSFILE=/dev/null`) is no password file, as with libpq.
    /// - Throws: ``PostgresURLError/passwordFile(path:reason:)`` when a named file cannot be used.
    func password(passwordFile: String?, environment: [String: String], host server: Host? = nil) throws(PostgresURLError) -> String? {
        if let passwordFile {
            let data: Data
            do { data = try SteeringFileCheck.read(path: passwordFile, role: "database password file") } catch {
                throw .passwordFile(path: passwordFile, reason: Self.problem(error))
            }
            guard let text = String(data: data, encoding: .utf8) else { throw .passwordFile(path: passwordFile, reason: "cannot be read") }
            let password = text.trimmingCharacters(in: .newlines)
            guard !password.isEmpty else { throw .passwordFile(path: passwordFile, reason: "is empty") }
            return password
        }
        if let urlPassword { return urlPassword }
        if let password = environment["PGPASSWORD"], !password.isEmpty { return password }
        let named = passwordFileFromURL ?? environment["PGPASSFILE"]
        guard let file = named ?? environment["HOME"].map({ "\($0)/.pgpass" }) else { return nil }
        let data: Data
        do { data = try SteeringFileCheck.read(path: file, role: "database password file") } catch {
            switch error.code {
            case .missing:
                if let named { throw .passwordFile(path: named, reason: "does not exist") }
                return nil
            case .notARegularFile:
                return nil
            default:
                throw .passwordFile(path: file, reason: Self.problem(error))
            }
        }
        guard let text = String(data: data, encoding: .utf8) else { throw .passwordFile(path: file, reason: "cannot be read") }
        let server = server ?? hosts.first ?? Host(name: "localhost", port: 5432)
        return PasswordFileLines(text).password(host: socketDirectory ?? server.name, port: server.port,
                                                database: database, user: user)
    }

    /// What is wrong with a password or CA file, after its path: `cannot be read`, or the
    /// refusal and its fix.
    static func problem(_ error: SteeringFileReadError) -> String {
        switch error.code {
        case .missing: "does not exist"
        case .unreadable: "cannot be read"
        default: error.reason
        }
    }
}

/// The lines of a libpq password file: `host:port:database:user:password`, `*` matching
/// anything, `\:` and `\\` escaped; the first matching line wins.
struct PasswordFileLines {
    let lines: [[String]]

    init(_ text: String) {
        lines = text.split(whereSeparator: \.isNewline).compactMap { line in
            guard !line.hasPrefix("#") else { return nil }
            var fields: [String] = [], field = "", escaped = false
            for character in line {
                if escaped { field.append(character); escaped = false }
                else if character == "\\" { escaped = true }
                else if character == ":" && fields.count < 4 { fields.append(field); field = "" }
                else { field.append(character) }
            }
            fields.append(field)
            return fields.count == 5 ? fields : nil
        }
    }

    func password(host: String, port: Int, database: String, user: String) -> String? {
        let wanted = [host, String(port), database, user]
        return lines.first { fields in zip(fields.prefix(4), wanted).allSatisfy { $0 == "*" || $0 == $1 } }?.last
    }
}

/// A connection URL that cannot be used, worded for the operator; names a parameter, never
/// carries its value or the password.
public struct PostgresURLError: Error, Sendable, Equatable, CustomStringConvertible {
    enum Reason: Sendable, Equatable {
        case notAPostgresURL
        case malformed(String)
        case badParameter(name: String, expected: String)
        case passwordFile(path: String, reason: String)
        case keywordString
    }
    let reason: Reason

    static let notAPostgresURL = Self(reason: .notAPostgresURL)
    static let keywordString = Self(reason: .keywordString)
    static func malformed(_ what: String) -> Self { Self(reason: .malformed(what)) }
    static func badParameter(name: String, expected: String) -> Self {
        Self(reason: .badParameter(name: name, expected: expected))
    }
    static func passwordFile(path: String, reason: String) -> Self { Self(reason: .passwordFile(path: path, reason: reason)) }

    /// What is wrong and how to write it instead.
    public var description: String {
        switch reason {
        case .notAPostgresURL:
            "not a PostgreSQL URL: write postgres://USER@HOST:PORT/DATABASE"
        case .malformed(let what):
            "the PostgreSQL URL is malformed (\(what)): write postgres://USER@HOST:PORT/DATABASE?sslmode=..."
        case .badParameter(let name, let expected):
            "the PostgreSQL URL's parameter \(name) is not accepted (its value is not shown): expected \(expected)"
        case .passwordFile(let path, let reason):
            "the database password file \(path) \(reason)"
        case .keywordString:
            // Not a word of it: it may hold the password.
            "a libpq keyword/value connection string is not accepted (not shown: it may hold a password): write a URL, "
                + "postgres://USER@HOST:PORT/DATABASE?sslmode=verify-full, with the password in PGPASSWORD or a password file "
                + "(a SQLite file whose name has '=' in it: write ./NAME)"
        }
    }
}
