import ArgumentParser
import FleetTokenPostgres
import FleetTokenStore
import Foundation

struct List: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List entries: kind, id, status, expiry, fingerprint, failures.")

    @OptionGroup var store: StoreOptions
    @Option(help: "Only this kind: vehicle, trip, deliveryVehicle, task.") var kind: TokenKind?
    @Option(help: "Only this subject id.") var id: String?
    @Flag(help: "Only expired tokens.") var expired = false
    @Flag(help: "Only valid (unexpired) tokens.") var valid = false
    @Flag(help: "Print a JSON array.") var json = false

    func validate() throws {
        if expired && valid { throw ValidationError("--expired and --valid exclude each other") }
    }

    func run() async throws {
        try await reportingFailures {
            let now = Date()
            let validity: TokenFilter.Validity? = expired ? .expired(asOf: now) : valid ? .valid(asOf: now) : nil
            let filter = TokenFilter(kind: kind, subjectID: id, validity: validity)
            let entries = try await store.withStore(.readOnly) { repository, _ in
                try await repository.list(filter, page: .everything)
            }
            if json {
                printJSON(entries.map { EntryView($0, now: now).json })
            } else {
                print(Table.render(header: ["KIND", "ID", "STATUS", "EXPIRES", "FINGERPRINT", "FAILURES"],
                                   rows: entries.map { EntryView($0, now: now).row }))
            }
        }
    }
}

struct Show: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Show one entry with every stored field and the token's decoded claims.")

    @OptionGroup var store: StoreOptions
    @Argument(help: "vehicle, trip, deliveryVehicle or task.") var kind: TokenKind
    @Argument(help: "The subject id.") var id: String
    @Flag(help: "Also print the raw token. The only command that does.") var reveal = false
    @Flag(help: "Print JSON.") var json = false

    func validate() throws {
        _ = try validatedKey(kind, id)
    }

    func run() async throws {
        try await reportingFailures {
            let key = try validatedKey(kind, id)
            let (found, where_) = try await store.withStore(.readOnly) { repository, name in
                (try await repository.entry(for: key), name)
            }
            guard let entry = found else { throw Failure("no entry for \(key) in \(where_)") }
            let view = EntryView(entry, now: Date())
            var object = view.json
            object["issued_at"] = iso(entry.token?.issuedAt)
            object["fetched_at"] = iso(entry.token?.fetchedAt)
            object["last_used_at"] = iso(entry.token?.lastUsedAt)
            object["last_error_message"] = entry.failure?.lastErrorMessage ?? NSNull()
            object["last_failure_at"] = iso(entry.failure?.lastFailureAt)
            // Which provider configuration failed, as its digest's first 12 hex digits (never the
            // configuration): a run with another one tries at once.
            object["failure_config"] = entry.failure?.configurationDigest.map { String($0.prefix(12)) } ?? NSNull()
            if let token = entry.token {
                let plain = try opened(token)
                object["claims"] = plain.map { ClaimsView($0).json }
                    ?? ["decoded": false, "sealed_with_key_id": SealedTokenValue.keyID(ofStored: token.value) ?? plaintextKeyID]
                if reveal { object["token"] = plain }
            }
            if json {
                printJSON(object)
            } else {
                for (name, value) in object.sorted(by: { $0.key < $1.key }) where name != "claims" && name != "token" {
                    print("\(name.padding(toLength: 20, withPad: " ", startingAt: 0)) \(Self.text(value))")
                }
                if let claims = object["claims"] as? [String: Any] {
                    print("claims (signature not shown):")
                    for (name, value) in claims.sorted(by: { $0.key < $1.key }) {
                        print("  \(name.padding(toLength: 18, withPad: " ", startingAt: 0)) \(Self.text(value))")
                    }
                }
                if let token = object["token"] as? String { print("token                \(token)") }
            }
        }
    }

    /// The token's value: as stored when not sealed; opened with the given keys when sealed.
    /// One whose key was not given is a failure for --reveal; without it, nil (the entry is
    /// shown with `sealed_with_key_id`), with a note when other keys were given. One that does
    /// not open with its own key (altered, copied from another row) is a failure either way.
    private func opened(_ token: StoredToken) throws -> String? {
        guard let keyID = SealedTokenValue.keyID(ofStored: token.value) else { return token.value }
        let problem: String
        if let keyring = try store.keyring() {
            switch SealedTokenValue.open(token.value, for: token.key, with: keyring) {
            case .opened(let value, _), .plaintext(let value): return value
            case .missingKey(let id):
                problem = "the token of \(token.key) is sealed with encryption key id \(id), and no key given has that id (given: \(keyring.ids.joined(separator: ", ")))"
            case .failed(let id):
                // Not a key missing: the value itself is wrong, which show reports as a failure.
                throw Failure("the token of \(token.key) does not open with key id \(id): it was altered or copied from another row; the agent refetches it")
            }
            if !reveal { FileHandle.standardError.write(Data("tokenctl: note: \(problem)\n".utf8)) }
        } else {
            problem = "the token of \(token.key) is sealed with encryption key id \(keyID): give its key file with --encryption-key-file to reveal it"
        }
        if reveal { throw Failure(problem) }
        return nil
    }

    static func text(_ value: Any) -> String {
        if value is NSNull { return "-" }
        if let dictionary = value as? [String: String] {
            return dictionary.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        }
        return "\(value)"
    }
}

struct Purge: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Delete tokens in one transaction; a running agent refetches tracked subjects.",
        discussion: """
            Exactly one selector is required. --all also needs --yes. A failing subject keeps its \
            failure state (its backoff), so a purge during a provider outage does not make every \
            failing subject retry at once; --include-failures removes that too.
            """)

    @OptionGroup var store: StoreOptions
    @Option(help: "Purge this vehicle.") var vehicle: String?
    @Option(help: "Purge this trip.") var trip: String?
    @Option(name: .customLong("delivery-vehicle"), help: "Purge this delivery vehicle.") var deliveryVehicle: String?
    @Option(help: "Purge this task.") var task: String?
    @Option(help: "Purge every entry of this kind.") var kind: TokenKind?
    @Flag(help: "Purge every expired token.") var expired = false
    @Flag(help: "Purge everything (needs --yes).") var all = false
    @Flag(help: "Count what would be purged; delete nothing.") var dryRun = false
    @Flag(help: "Confirm --all.") var yes = false
    @Flag(help: "Also remove failure state (backoff), so failing subjects retry at once.") var includeFailures = false
    @Flag(help: "Print {\"matched\": N, \"purged\": N}.") var json = false

    func validate() throws {
        let selectors = subjects.count + [kind != nil, expired, all].filter { $0 }.count
        if selectors == 0 {
            throw ValidationError("choose what to purge: --vehicle ID, --trip ID, --delivery-vehicle ID, --task ID, --kind KIND, --expired or --all")
        }
        if selectors > 1 { throw ValidationError("give exactly one of --vehicle, --trip, --delivery-vehicle, --task, --kind, --expired, --all") }
        // The ids `show` and the library accept, no others.
        for (kind, id, flag) in subjects { _ = try validatedKey(kind, id, flag: flag) }
    }

    /// The one-subject selectors given: kind, id and the flag that named it.
    private var subjects: [(TokenKind, String, String)] {
        [(TokenKind.vehicle, vehicle, "--vehicle"), (.trip, trip, "--trip"),
         (.deliveryVehicle, deliveryVehicle, "--delivery-vehicle"), (.task, task, "--task")]
            .compactMap { kind, id, flag in id.map { (kind, $0, flag) } }
    }

    var filter: TokenFilter {
        if let (kind, id, _) = subjects.first { return TokenFilter(kind: kind, subjectID: id) }
        if let kind { return TokenFilter(kind: kind) }
        if expired { return TokenFilter(validity: .expired(asOf: Date())) }
        return .all
    }

    func run() async throws {
        try await reportingFailures {
            if all && !yes && !dryRun {
                throw Failure("--all removes every entry: add --yes to confirm (nothing was removed)")
            }
            let scope: PurgeScope = includeFailures ? .tokensAndFailureState : .tokens
            let filter = self.filter, dryRun = self.dryRun
            let (matched, purged) = try await store.withStore(dryRun ? .readOnly : .adminReadWrite) { repository, _ in
                if dryRun { return (try await repository.count(filter, scope: scope), 0) }
                let purged = try await withProgress("purging") { try await repository.purge(filter, scope: scope) }
                return (purged, purged)
            }
            if json {
                printJSON(["matched": matched, "purged": purged])
            } else if dryRun {
                print("would purge \(matched) \(matched == 1 ? "entry" : "entries") (dry run)")
            } else {
                print("purged \(purged) \(purged == 1 ? "entry" : "entries")")
            }
        }
    }
}

struct Stats: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Totals by kind and status, schema version, file size, expiry range.")

    @OptionGroup var store: StoreOptions
    @Flag(help: "Print JSON.") var json = false

    func run() async throws {
        try await reportingFailures {
            let now = Date()
            let (stats, sealing, name) = try await store.withStore(.readOnly) { repository, name in
                (try await repository.stats(at: now), try await repository.valueKeyCounts(), name)
            }
            if json {
                var byKind: [String: [String: Int]] = [:]
                for (kind, counts) in stats.counts {
                    byKind[kind.rawValue] = Dictionary(uniqueKeysWithValues: counts.map { ($0.key.rawValue, $0.value) })
                }
                printJSON([
                    "total": stats.total, "by_kind": byKind, "schema_version": stats.schemaVersion,
                    "file_size_bytes": stats.fileSizeBytes, "oldest_expiry": iso(stats.oldestExpiry),
                    "newest_expiry": iso(stats.newestExpiry), "values_by_key_id": sealing,
                ])
                return
            }
            print("store           \(name)")
            print("schema version  \(stats.schemaVersion)")
            print("file size       \(stats.fileSizeBytes) bytes")
            print("entries         \(stats.total)")
            if !sealing.isEmpty { print("token values    \(Self.describe(sealing))") }
            let rows = TokenKind.allCases.filter { stats.counts[$0] != nil }.map { kind in
                [kind.rawValue] + TokenStatus.allCases.map { String(stats.count(kind, $0)) }
            }
            print(Table.render(header: ["KIND"] + TokenStatus.allCases.map { $0.rawValue.uppercased() }, rows: rows))
            if let oldest = stats.oldestExpiry, let newest = stats.newestExpiry {
                print("expiries        \(oldest.formatted(.iso8601)) (\(relative(oldest, now: now))) … \(newest.formatted(.iso8601)) (\(relative(newest, now: now)))")
            }
        }
    }
}

extension Stats {
    /// "12 sealed with key id 0123456789abcdef, 3 not sealed": the count under each key id.
    static func describe(_ counts: [String: Int]) -> String {
        let sealed = counts.filter { $0.key != plaintextKeyID }.sorted { $0.key < $1.key }.map { "\($0.value) sealed with key id \($0.key)" }
        let plain = counts[plaintextKeyID].map { ["\($0) not sealed"] } ?? []
        return (sealed + plain).joined(separator: ", ")
    }
}

struct Rekey: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Re-seal every token value under the first --encryption-key-file (the primary key).",
        discussion: """
            Rotating a key: start the agents with the new key first and the old one second, run \
            `tokenctl rekey` with the same two key files, then drop the old one. Values under a \
            key not given, or that do not open, stay as they are and make the exit code 1. Safe \
            beside a running agent: a value refreshed meanwhile is left to the agent.
            """)

    @OptionGroup var store: StoreOptions
    @Flag(help: "Print the counts as JSON.") var json = false

    func validate() throws {
        if store.selection.encryptionKeyFiles.isEmpty && ProcessInfo.processInfo.environment["CREDENTIALS_DIRECTORY"] == nil {
            throw ValidationError("give the key to seal with: --encryption-key-file NEW (then any old key files, to open values sealed with them)")
        }
    }

    func run() async throws {
        try await reportingFailures {
            guard let keyring = try store.keyring() else {
                throw Failure("no key: $CREDENTIALS_DIRECTORY holds no token-store-key; give --encryption-key-file")
            }
            let logger = store.logger
            let (report, name) = try await store.withStore(.adminReadWrite) { repository, name in
                (try await withProgress("re-sealing") { try await TokenValueResealer(store: repository, logger: logger).rekey(keyring) }, name)
            }
            let unopenable = report.unopenable.values.reduce(0, +)
            if json {
                printJSON([
                    "primary_key_id": keyring.primary.id, "resealed": report.resealed, "already_primary": report.alreadyPrimary,
                    "unopenable": report.unopenable, "changed_meanwhile": report.changedMeanwhile,
                ])
            } else {
                let from = report.resealed.isEmpty ? "" : " (" + Stats.describe(report.resealed)
                    .replacingOccurrences(of: "sealed with key id", with: "from key id").replacingOccurrences(of: "not sealed", with: "not sealed before") + ")"
                print("re-sealed \(report.resealedTotal) token value(s) in \(name) under key id \(keyring.primary.id)\(from)")
                print("\(report.alreadyPrimary + report.resealedTotal) under key id \(keyring.primary.id) now (\(report.alreadyPrimary) were already)")
                if report.changedMeanwhile > 0 { print("\(report.changedMeanwhile) refreshed or removed meanwhile, left to the agent") }
            }
            if unopenable > 0 {
                let ids = report.unopenable.keys.sorted().joined(separator: ", ")
                throw Failure("\(unopenable) token value(s) did not open and stay as they were (key id \(ids)): give that key file too, or purge those tokens so the agent refetches them")
            }
        }
    }
}

struct Check: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Integrity check, schema version against this build, file modes. Non-zero exit when anything is wrong.")

    @OptionGroup var store: StoreOptions
    @Flag(help: "Print JSON.") var json = false

    func run() async throws {
        try await reportingFailures {
            let report = store.isPostgres ? await postgresReport() : await SQLiteTokenRepository.check(path: store.path, logger: store.logger)
            let view = CheckView(report: report)
            if json {
                printJSON(view.json)
            } else {
                for line in view.lines { print(line) }
            }
            if !report.isHealthy { throw ExitCode(1) }
        }
    }
}

extension Check {
    /// The database's report; a database that cannot be opened is one problem.
    private func postgresReport() async -> StoreCheckReport {
        do {
            return try await store.withPostgres(.readOnly) { await $0.check() }
        } catch {
            let location = (try? PostgresStoreLocation(url: store.path))?.description ?? "the database"
            return StoreCheckReport(storePath: location, buildSchemaVersion: PostgresTokenRepository.buildSchemaVersion,
                                    schemaVersion: nil, integrityProblems: nil, backgroundIntegrityFinding: nil,
                                    files: nil, problems: ["\(error)"])
        }
    }
}

struct Migrate: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Create the store if missing and apply pending migrations.")

    @OptionGroup var store: StoreOptions

    func run() async throws {
        try await reportingFailures {
            let (name, created, before, after): (String, Bool, Int, Int)
            if store.isPostgres {
                (name, created, before, after) = try await withProgress("migrating") {
                    try await store.withPostgres(.migrate) { repository in
                        let report = repository.openReport
                        return (repository.storeDescription, report.created, report.schemaVersionBefore, report.schemaVersion)
                    }
                }
            } else {
                let repository = try await withProgress("migrating") { try store.open(.migrate) }
                defer { repository.close() }
                let report = repository.openReport
                (name, created, before, after) = (repository.path, report.created, report.schemaVersionBefore, report.schemaVersion)
            }
            if created {
                print("created \(name) at schema version \(after)")
            } else if before == after {
                print("\(name) is at schema version \(after); nothing to do")
            } else {
                print("migrated \(name) from schema version \(before) to \(after)")
            }
        }
    }
}
