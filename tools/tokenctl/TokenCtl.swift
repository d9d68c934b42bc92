// tokenctl: list, show, purge, count, check and migrate a token store, safely beside a live agent.

public import ArgumentParser
import BuildStamp
import FleetTokenPostgres
import FleetTokenStore
import Foundation
import Logging

@main
struct TokenCtl: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tokenctl",
        abstract: "Inspect and purge a FleetTokenStore token store.",
        discussion: """
            Safe to run beside a live token-agent: reads never block it, purges wait for its writes.
            Read commands (list, show, stats, check) never create or change a store.
            Token values are never printed, except by `show --reveal`.
            An encrypted store needs its key only for `show --reveal`, `show`'s claims and `rekey`.

            Exit codes: 0 ok; 1 operational error (no store, corrupt store, nothing to show, a check \
            that found problems, --all without --yes); 64 usage error.
            """,
        version: BuildStamp.versionLine(program: "tokenctl"),
        subcommands: [List.self, Show.self, Purge.self, Stats.self, Check.self, Migrate.self, Rekey.self])

    // Declared here too so `tokenctl --db PATH list` parses; subcommands read the same group.
    @OptionGroup var store: StoreOptions
}

/// Options every subcommand takes.
struct StoreOptions: ParsableArguments {
    @Option(help: "The token store: a SQLite file path, or a postgres://USER@HOST:PORT/DATABASE URL (default: $TOKEN_STORE_DB, else ./tokens.sqlite).")
    var db: String?

    @Option(name: .customLong("encryption-key-file"),
            help: "A key file of an encrypted store (repeatable: the first is the primary; default: $CREDENTIALS_DIRECTORY/token-store-key when set). Needed by show --reveal and rekey only.")
    var encryptionKeyFiles: [String] = []

    @Option(help: "The agent's config file: its db and encryption-key-file apply when neither the flags nor TOKEN_AGENT_DB, TOKEN_STORE_DB or TOKEN_AGENT_ENCRYPTION_KEY_FILE give them (default: $TOKEN_AGENT_CONFIG).")
    var config: String?

    /// The agent's config file as read by the first ``validate()``: copies of these options
    /// (ArgumentParser hands the root command's to the subcommand) share it, so the file is
    /// read and parsed once however often the selection is asked for.
    private let agentConfigRead = AgentConfigRead()

    /// Only the options are parsed; ``agentConfigRead`` is this process's, not an argument.
    enum CodingKeys: String, CodingKey {
        case db, encryptionKeyFiles, config
    }

    /// The agent's config file (`--config`, else `$TOKEN_AGENT_CONFIG`) is usable: a usage error (exit 64) otherwise.
    func validate() throws {
        do { _ = try agentConfig() } catch { throw ValidationError(error.description) }
    }

    /// The agent's config file's settings, nil when no file is named. Read on the first call only.
    func agentConfig() throws(AgentConfigError) -> AgentConfigDefaults? {
        let path = config ?? ProcessInfo.processInfo.environment[AgentConfigDefaults.fileVariable].flatMap { $0.isEmpty ? nil : $0 }
        return try agentConfigRead.value(path: path)
    }

    /// The store and key files in force. (The file was checked by ``validate()``.)
    var selection: StoreSelection {
        StoreSelection(db: db, encryptionKeyFiles: encryptionKeyFiles, environment: ProcessInfo.processInfo.environment,
                       file: (try? agentConfig()) ?? nil)
    }

    /// The keys given (or systemd's credential), nil when none; a refused key file is a failure.
    func keyring() throws -> TokenKeyring? {
        do {
            return try TokenKeyring.load(files: selection.encryptionKeyFiles, environment: ProcessInfo.processInfo.environment)
        } catch {
            throw Failure(error.description)
        }
    }

    var path: String { selection.db }

    /// Warnings and errors on stderr (a mode too open, say); never a token.
    var logger: Logger {
        var logger = Logger(label: "tokenctl") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = .warning
        return logger
    }

    /// True when ``path`` is a PostgreSQL URL.
    var isPostgres: Bool { PostgresStoreLocation.isPostgresURL(path) }

    /// Runs `body` with the store opened as `mode` allows (a SQLite file, or a PostgreSQL
    /// database for the length of the call) and how to name it; store errors become an
    /// operator message and exit 1.
    func withStore<T: Sendable>(_ mode: StoreOpenMode, _ body: (any AdminStore, String) async throws -> T) async throws -> T {
        guard isPostgres else {
            let repository = try open(mode)
            defer { repository.close() }
            return try await body(repository, repository.path)
        }
        return try await withPostgres(mode) { try await body($0, $0.storeDescription) }
    }

    /// Runs `body` with the PostgreSQL store at ``path`` opened as `mode` allows.
    func withPostgres<T: Sendable>(_ mode: StoreOpenMode, _ body: (PostgresTokenRepository) async throws -> T) async throws -> T {
        let configuration: PostgresStoreConfiguration
        do { configuration = try PostgresStoreConfiguration(url: path) } catch {
            // Names a parameter, never its value nor the password.
            throw ValidationError("\(selection.dbOrigin): \(error)")
        }
        do {
            return try await PostgresTokenRepository.withRepository(configuration, mode: mode, logger: logger, body)
        } catch let error as TokenStoreError {
            throw Failure(OperatorHints.describe(error))
        }
    }

    /// Opens the SQLite store as `mode` allows, turning store errors into an operator message and exit 1.
    func open(_ mode: StoreOpenMode) throws -> SQLiteTokenRepository {
        do {
            return try SQLiteTokenRepository(path: path, mode: mode, logger: logger)
        } catch {
            throw Failure(OperatorHints.describe(error))
        }
    }
}

/// What every command needs of a store, SQLite or PostgreSQL.
typealias AdminStore = TokenRepository & TokenStoreAdmin & TokenSealingStore

/// An operational failure: the message goes to stderr and the exit code is 1.
struct Failure: Error, CustomStringConvertible {
    let description: String
    init(_ message: String) { description = message }
}

extension TokenKind: ExpressibleByArgument {}

/// The library's key for an id given on the command line, or a usage error (exit 64) saying
/// what is wrong with it, prefixed by `flag` when the id came from one.
func validatedKey(_ kind: TokenKind, _ id: String, flag: String? = nil) throws(ValidationError) -> TokenKey {
    do throws(InvalidTokenKey) {
        return try TokenKey(kind: kind, subjectID: id)
    } catch {
        throw ValidationError((flag.map { "\($0): " } ?? "") + error.description)
    }
}

/// Runs `body`, reporting a ``Failure`` or store error as "tokenctl: message" with exit code 1.
func reportingFailures(_ body: () async throws -> Void) async throws {
    do {
        try await body()
    } catch let failure as Failure {
        FileHandle.standardError.write(Data("tokenctl: \(failure.description)\n".utf8))
        throw ExitCode(1)
    } catch let error as TokenStoreError {
        FileHandle.standardError.write(Data("tokenctl: \(OperatorHints.describe(error))\n".utf8))
        throw ExitCode(1)
    }
}

func printJSON(_ value: Any) {
    let data = (try? JSONSerialization.data(withJSONObject: value, options: [.sortedKeys, .prettyPrinted])) ?? Data("null".utf8)
    print(String(decoding: data, as: UTF8.self))
}

func iso(_ date: Date?) -> Any {
    date.map { $0.formatted(.iso8601) } ?? NSNull()
}

func relative(_ date: Date, now: Date) -> String {
    RelativeTime.describe(date, now: now)
}

/// Prints a line on stderr while a slow operation runs, after a second, on a terminal only.
func withProgress<T>(_ label: String, _ body: () async throws -> T) async throws -> T {
    guard isatty(STDERR_FILENO) != 0 else { return try await body() }
    let started = Date()
    let ticker = Task {
        try await Task.sleep(for: .seconds(1))
        while !Task.isCancelled {
            FileHandle.standardError.write(Data("\rtokenctl: \(label)… \(Int(Date().timeIntervalSince(started))) s".utf8))
            try await Task.sleep(for: .seconds(1))
        }
    }
    defer {
        ticker.cancel()
        if Date().timeIntervalSince(started) >= 1 { FileHandle.standardError.write(Data("\n".utf8)) }
    }
    return try await body()
}
