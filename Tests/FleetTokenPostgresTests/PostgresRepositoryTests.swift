// What only the PostgreSQL store does: its connection URL, its schema's migrations between
// hosts, and an engine on it while the server goes away and comes back.

import FleetTokenMigrations
import FleetTokenStoreTesting
import Foundation
import Logging
import Testing
import TestSupportKit
@testable import FleetTokenPostgres
@testable import FleetTokenStore

@Suite("PostgresStoreLocation: the connection URL", .paced)
struct PostgresURLTests {
    @Test("host, port, database, user and defaults; the description never shows the password")
    func parts() throws {
        let location = try PostgresStoreLocation(url: "postgres://fleet:s3cr%40t@db.example:6543/tokens?sslmode=verify-full&sslrootcert=/etc/ca.pem&schema=fleet_a")
        #expect(location.host == "db.example" && location.port == 6543 && location.database == "tokens" && location.user == "fleet")
        #expect(location.sslMode == .verifyFull && location.sslRootCertificate == "/etc/ca.pem" && location.schema == "fleet_a")
        #expect(location.urlPassword == "s3cr@t")
        #expect(location.description == "postgres://fleet@db.example:6543/tokens?sslmode=verify-full&schema=fleet_a")
        #expect(!location.description.contains("s3cr"))

        let plain = try PostgresStoreLocation(url: "postgresql://agent@localhost/fleet")
        #expect(plain.port == 5432 && plain.sslMode == .prefer && plain.schema == PostgresStoreLocation.defaultSchema)
        let socket = try PostgresStoreLocation(url: "postgres://agent@/fleet?host=/run/postgresql")
        #expect(socket.socketPath == "/run/postgresql/.s.PGSQL.5432" && socket.host == nil)
        #expect(PostgresStoreLocation.isPostgresURL("postgres://a@b/c") && !PostgresStoreLocation.isPostgresURL("/var/lib/tokens.sqlite"))
    }

    // From a review: the user, password and database were percent-decoded twice (URLComponents
    // decodes them already), so a password holding `%41`, written `%2541`, became `A`.
    @Test("user, password and database are percent-decoded once: a literal % survives")
    func percentDecodedOnce() throws {
        let location = try PostgresStoreLocation(url: "postgres://fl%2541t:a%2541b%25@h/to%2541kens")
        #expect(location.urlPassword == "a%41b%")
        #expect(try PostgresStoreLocation(url: "postgres://u:a%2541b@h/d").urlPassword == "a%41b")
        #expect(location.user == "fl%41t")
        #expect(location.database == "to%41kens")
        let defaulted = try PostgresStoreLocation(url: "postgres://fl%2541t@h")
        #expect(defaulted.database == "fl%41t")
    }

    // Issue 26: a parameter is named, never its value (a value in the wrong place may be a
    // pasted password).
    @Test("bad URLs are refused with what to write instead, naming the parameter, never echoing its value or the password", arguments: [
        ("postgres://db.example/tokens", "no user", nil),
        ("postgres://u:pw@h/d?sslmode=maybe", "parameter sslmode is not accepted", "maybe"),
        ("postgres://u:pw@h/d?schema=Fleet-A", "parameter schema is not accepted", "Fleet-A"),
        ("postgres://u:pw@h/d?schema=pg_catalog", "parameter schema is not accepted", "pg_catalog"),
        ("postgres://u:pw@h/d?host=relative/dir", "parameter host is not accepted", "relative/dir"),
        ("postgres://u:pw@h/d?sslmode=verify-full&host=/run/pg", "Unix socket", nil),
        ("postgres://u:pw@h/d?sslmode=verify-ca", "verify-ca with sslrootcert=PATH", nil),
        ("postgres://u:pw@h/d?user=xavier", "parameter user is not accepted", "xavier"),
        ("postgres://u@h/d?password=hunter2", "parameter password is not accepted", "hunter2"),
        ("postgres://u@h/d?hunter2%20hunter2=x", "(its name not shown)", "hunter2"),
        ("postgres://u:pw@h:99999/d", "out of range", nil),
        ("postgres:u:pw@h/d", "no user", nil),
    ] as [(String, String, String?)])
    func refused(url: String, says: String, value: String?) {
        #expect(throws: PostgresURLError.self) { try PostgresStoreLocation(url: url) }
        do { _ = try PostgresStoreLocation(url: url) } catch {
            #expect(error.description.contains(says), "\(error)")
            #expect(!error.description.contains("pw"), "\(error)")
            if let value { #expect(!error.description.contains(value), "\(error)") }
        }
    }

    @Test("redacted: the password and every value that may be one as ***, the rest of the URL kept; a URL that does not parse is not shown; a path is left alone", arguments: [
        ("postgres://agent:s3cret@db:5432/fleet?sslmode=require&password=s3cret", "postgres://agent:***@db:5432/fleet?sslmode=require&password=***"),
        ("postgresql://agent:s3cr%40t@db/fleet", "postgresql://agent:***@db/fleet"),
        ("postgres://agent@db/fleet?sslmode=verify-full&sslrootcert=/etc/ca.pem&schema=fleet_a&host=/run/pg&passfile=/etc/pgpass",
         "postgres://agent@db/fleet?sslmode=verify-full&sslrootcert=/etc/ca.pem&schema=fleet_a&host=/run/pg&passfile=/etc/pgpass"),
        ("postgres://agent@db/fleet?sslmode=s3cret&pasword=s3cret&schema=S3cret", "postgres://agent@db/fleet?sslmode=***&pasword=***&schema=***"),
        ("postgres://agent@db/fleet?s3cret%20s3cret=1#s3cret", "postgres://agent@db/fleet?***=***#***"),
        ("postgres://agent:s3cret@db:99999/fleet", "postgres://agent:***@db:99999/fleet"),
        ("postgres://agent:s3cret@db:5432:1/fleet", "postgres://<not shown: not a valid URL>"),
        ("postgres:agent:s3cret@db/fleet", "postgres://<not shown: not a valid URL>"),
        ("./tokens.sqlite", "./tokens.sqlite"),
        ("/var/lib/token-agent/tokens.sqlite", "/var/lib/token-agent/tokens.sqlite"),
    ])
    func redacted(text: String, shown: String) {
        #expect(PostgresStoreLocation.redacted(text) == shown)
        #expect(!PostgresStoreLocation.redacted(text).lowercased().contains("s3cr"))
    }

    @Test("the password: a password file first, then the URL, PGPASSWORD, then a matching libpq password file line")
    func passwordSources() throws {
        let scratch = Scratch()
        let file = scratch.file("password")
        try "from-file\n".write(toFile: file, atomically: true, encoding: .utf8)
        let pgpass = scratch.file("pgpass")
        try """
            # comment
            other:5432:fleet:agent:not-this
            db.example:5432:fleet:agent:from-pgpass
            *:*:*:*:fallback
            """.write(toFile: pgpass, atomically: true, encoding: .utf8)
        let withPassword = try PostgresStoreLocation(url: "postgres://agent:from-url@db.example/fleet")
        let without = try PostgresStoreLocation(url: "postgres://agent@db.example/fleet")
        #expect(try withPassword.password(passwordFile: file, environment: ["PGPASSWORD": "env"]) == "from-file")
        #expect(try withPassword.password(passwordFile: nil, environment: ["PGPASSWORD": "env"]) == "from-url")
        #expect(try without.password(passwordFile: nil, environment: ["PGPASSWORD": "env", "PGPASSFILE": pgpass]) == "env")
        #expect(try without.password(passwordFile: nil, environment: ["PGPASSFILE": pgpass]) == "from-pgpass")
        let elsewhere = try PostgresStoreLocation(url: "postgres://agent@elsewhere/fleet?passfile=\(pgpass)")
        #expect(try elsewhere.password(passwordFile: nil, environment: [:]) == "fallback")
        #expect(try without.password(passwordFile: nil, environment: ["HOME": scratch.path]) == nil)
        #expect(throws: PostgresURLError.self) { try without.password(passwordFile: scratch.file("missing"), environment: [:]) }
        #expect(throws: PostgresURLError.self) {
            try PostgresStoreLocation(url: "postgres://agent@h/f?passfile=\(scratch.file("none"))").password(passwordFile: nil, environment: [:])
        }
    }

    @Test("SQL scripts split at top-level semicolons only")
    func scriptSplitting() {
        let script = """
            -- a comment; with a semicolon
            CREATE TABLE a (x text DEFAULT 'a;b');
            CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$;
            /* block; comment */ SELECT 'it''s; fine', $1;
            """
        #expect(SQLStatements.split(script) == [
            "CREATE TABLE a (x text DEFAULT 'a;b')",
            "CREATE FUNCTION f() RETURNS int LANGUAGE sql AS $body$ SELECT 1; $body$",
            "SELECT 'it''s; fine', $1",
        ])
        #expect(SQLStatements.split(EmbeddedMigrations.postgres[0].sql).count >= 5)
    }
}

@Suite("PostgreSQL schema migrations between hosts", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresMigrationTests {
    let logger = Logger(label: "migrations")

    @Test("a schema written by a newer release is refused with the typed error and left untouched")
    func newerSchemaRefused() async throws {
        let (server, database, configuration) = try await freshDatabase()
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            try await store.upsert(token(try .vehicle("kept"), expiresIn: 600))
        }
        _ = try await server.psql("INSERT INTO fleet_token_store.schema_migrations (identifier) VALUES ('V0099__from_the_future')",
                            database: database)
        let snapshot = """
            SELECT (SELECT string_agg(identifier, ',' ORDER BY identifier) FROM fleet_token_store.schema_migrations)
                || '|' || (SELECT string_agg(kind || '/' || subject_id || '/' || md5(token), ',') FROM fleet_token_store.tokens)
                || '|' || (SELECT count(*) FROM information_schema.tables WHERE table_schema = 'fleet_token_store')
            """
        let before = try await server.psql(snapshot, database: database)
        for mode in [StoreOpenMode.agent, .migrate, .readOnly, .adminReadWrite] {
            await #expect {
                try await PostgresTokenRepository.withRepository(configuration, mode: mode, logger: logger) { _ in }
            } throws: { error in
                guard let error = error as? TokenStoreError else { return false }
                return error.code == .storeNewerThanBuild && error.storeVersion == 99 && error.buildVersion == PostgresTokenRepository.buildSchemaVersion
                    && error.description.contains("newer than this build")
            }
        }
        #expect(try await server.psql(snapshot, database: database) == before)
    }

    @Test("a missing schema is refused by the admin modes and created by the agent's")
    func missingSchema() async throws {
        let (_, _, configuration) = try await freshDatabase(schema: "fleet_b")
        for mode in [StoreOpenMode.readOnly, .adminReadWrite] {
            await #expect {
                try await PostgresTokenRepository.withRepository(configuration, mode: mode, logger: logger) { _ in }
            } throws: { ($0 as? TokenStoreError)?.code == .storeMissing }
        }
        let report = try await PostgresTokenRepository.withRepository(configuration, mode: .agent, logger: logger) { $0.openReport }
        #expect(report == PostgresOpenReport(created: true, schemaVersionBefore: 0, schemaVersion: PostgresTokenRepository.buildSchemaVersion))
    }

    @Test("four hosts opening an old schema at once: each migration runs once, every open succeeds")
    func concurrentMigrations() async throws {
        let (server, database, base) = try await freshDatabase()
        var old = base
        old.migrations = [EmbeddedMigrations.postgres[0]]
        try await PostgresTokenRepository.withRepository(old, logger: logger) { _ in }
        // A slow second migration that fails if run twice (the table exists then).
        var new = base
        new.migrations = EmbeddedMigrations.postgres + [EmbeddedMigration(identifier: "V0004__test_slow", sql: """
            SELECT pg_sleep(0.3);
            CREATE TABLE migrated_once (id integer PRIMARY KEY);
            INSERT INTO migrated_once VALUES (1);
            """)!]
        let newer = new, logger = self.logger
        let reports = try await withThrowingTaskGroup(of: PostgresOpenReport.self) { group in
            for _ in 0..<4 {
                group.addTask { try await PostgresTokenRepository.withRepository(newer, logger: logger) { $0.openReport } }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(reports.count == 4 && reports.allSatisfy { $0.schemaVersion == 4 })
        #expect(reports.filter { $0.schemaVersionBefore == 1 }.count == 1, "\(reports)")
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.migrated_once", database: database) == "1")
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.schema_migrations", database: database) == "4")
    }

    @Test("a failing migration is rolled back whole and named; the earlier schema stays")
    func failingMigration() async throws {
        let (server, database, base) = try await freshDatabase()
        var broken = base
        broken.migrations = EmbeddedMigrations.postgres + [EmbeddedMigration(identifier: "V0004__broken", sql: """
            CREATE TABLE half_done (id integer);
            SELECT no_such_function();
            """)!]
        await #expect {
            try await PostgresTokenRepository.withRepository(broken, logger: logger) { _ in }
        } throws: { error in
            guard let error = error as? TokenStoreError else { return false }
            return error.code == .migrationFailed && error.migrationIdentifier == "V0004__broken"
        }
        #expect(try await server.psql("SELECT to_regclass('fleet_token_store.half_done') IS NULL", database: database) == "t")
        #expect(try await server.psql("SELECT string_agg(identifier, ',' ORDER BY identifier) FROM fleet_token_store.schema_migrations", database: database)
                == EmbeddedMigrations.postgres.map(\.identifier).joined(separator: ","))
    }

    @Test("four tokenctl migrate processes at once on a new database: one creates, the others find nothing to do")
    func concurrentMigrateProcesses() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let url = server.url(database: database)
        let results = try await withThrowingTaskGroup(of: (status: Int32, stdout: String, stderr: String).self) { group in
            for _ in 0..<4 {
                group.addTask { try await runToEnd("tokenctl", ["migrate", "--db", url], environment: ["PGPASSWORD": server.password], in: scratch) }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(results.allSatisfy { $0.status == 0 }, "\(results.map(\.stderr))")
        #expect(results.filter { $0.stdout.contains("created") }.count == 1, "\(results.map(\.stdout))")
        #expect(results.filter { $0.stdout.contains("nothing to do") }.count == 3)
    }
}

@Suite("An engine on PostgreSQL while the server goes away", .paced, .exclusive, .enabled(if: PostgresServer.testsEnabled))
struct PostgresFaultTests {
    @Test("the server stopped: tokens are served from memory, a new key is fetched and served, store-degraded is reported; back: store-recovered and the write lands")
    func serverStopsAndReturns() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        try await server.createDatabase("faults")
        var configuration = try configuration(server, "faults")
        configuration.connectionWait = .seconds(1)  // the default: an outage is found within it
        let fetcher = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
        let log = LogRecorder()
        try await PostgresTokenRepository.withRepository(configuration, logger: log.logger) { store in
            let engine = TokenSyncEngine(repository: store, fetcher: fetcher, logger: log.logger)
            let events = StreamRecorder(engine.events())
            let running = Task { try await engine.run() }
            defer { running.cancel() }
            let held = try TokenKey.vehicle("held"), later = try TokenKey.vehicle("later")
            let first = try await engine.token(for: held)
            let stored = "SELECT count(*) FROM fleet_token_store.tokens WHERE token IS NOT NULL"
            #expect(await eventually(within: 30) { (try? server.psql(stored, database: "faults")) == "1" })

            try await server.shutDown(mode: .fast)
            // Found out within the connection wait (1 s) and a refused direct connection, not
            // the statement timeout (30 s in these tests, 10 s by default); then at once. The
            // bounds leave room for a loaded machine and still tell the two apart.
            let clock = ContinuousClock()
            var failed = false
            let noticed = await clock.measure {
                do { _ = try await store.entry(for: held) } catch { failed = (error as? TokenStoreError)?.code == .databaseUnavailable }
            }
            #expect(noticed < .seconds(8), "the first call after the server stopped took \(noticed)")
            #expect(failed)
            #expect(store.isJudgedDown)
            let next = await clock.measure { _ = try? await store.acquireRefreshLease(for: later, holder: "h", now: Date(), duration: 30) }
            #expect(next < .seconds(1), "a call while the database is known down took \(next)")
            #expect(try await engine.token(for: held) == first, "a held token is served while the database is down")
            let second = try await engine.token(for: later)
            #expect(second.key == later)
            #expect(await eventually(within: 30) { events.elements.contains { if case .storeDegraded = $0 { true } else { false } } })
            #expect(try await engine.token(for: later) == second)

            try await server.start()
            #expect(await eventually(within: 60) { events.elements.contains(.storeRecovered) }, "\(log.messages(at: .warning))")
            // A call that waited through the outage may judge it down once more; the next call
            // a second later finds the server and clears it.
            #expect(await eventually(within: 30) { (try? await store.entry(for: held)) != nil && !store.isJudgedDown })
            #expect(await eventually(within: 30) { (try? server.psql(stored, database: "faults")) == "2" },
                    "the token fetched while the database was down is written once it is back")
            #expect(fetcher.count(later) == 1 && fetcher.count(held) == 1)
            #expect(!log.allText.contains(server.password))
        }
    }
}

@Suite("The PostgreSQL change feed and leases between engines", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresFeedTests {
    let logger = Logger(label: "feed")

    @Test("a lost LISTEN connection is re-established; subscribers get .unknown, then changes again")
    func reconnects() async throws {
        let (server, database, base) = try await freshDatabase()
        var configuration = base
        configuration.feedReconnectInitial = .milliseconds(50)
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { other in
                let work = Task { await store.runBackgroundWork() }
                defer { work.cancel() }
                let recorder = StreamRecorder(store.changes())
                #expect(await eventually(within: 30) { store.isListening })
                let first = try TokenKey.vehicle("before")
                try await other.upsert(token(first, expiresIn: 600))
                #expect(await eventually(within: 5) { recorder.elements.contains(.upserted(first)) })
                // The background work's LISTEN taking effect was one (what committed before is unknown).
                let unknownsBefore = recorder.elements.filter { $0 == .unknown }.count

                // The server ends every session of the database (the listening one among them), as
                // a restart or a network cut would.
                let ended = try await server.psql("""
                    SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                    WHERE datname = '\(database)' AND pid <> pg_backend_pid()
                    """, database: database)
                #expect((Int(ended) ?? 0) >= 1)
                #expect(await eventually(within: 30) { recorder.elements.filter { $0 == .unknown }.count > unknownsBefore },
                        "\(recorder.elements)")
                #expect(await eventually(within: 30) { store.isListening })
                let second = try TokenKey.vehicle("after")
                try await other.upsert(token(second, expiresIn: 600))
                #expect(await eventually(within: 5) { recorder.elements.contains(.upserted(second)) })
            }
        }
    }

    // From a review: after its first SELECT 1, nothing was ever sent on the LISTEN connection,
    // so one whose flow a NAT dropped (or whose host lost power) gave no error, ever: the feed
    // said it listened for good, logged nothing, and no change (a purge) reached this replica
    // again, nor the .unknown that has it re-read what others wrote meanwhile.
    @Test("a LISTEN connection gone silent is found by the feed's own check within seconds and re-established: logged, .unknown, then changes again")
    func silentConnectionReestablished() async throws {
        let (server, database, direct) = try await freshDatabase()
        let relay = try FreezingRelay(target: server.port)
        defer { relay.stop() }
        let scratch = Scratch()
        let passfile = try passwordFile([(relay.port, server.password)], database: database, in: scratch)
        var relayed = try configuration(hosts: "127.0.0.1:\(relay.port)", database: database, passfile: passfile)
        // Short for the test: a check every 250 ms, each to be answered within 3 s.
        relayed.feedProbeInterval = .milliseconds(250)
        relayed.statementTimeout = .seconds(3)
        relayed.feedReconnectInitial = .milliseconds(50)
        let log = LogRecorder()
        let lossLogged = { log.messages(at: .warning).contains { $0.contains("change feed lost its connection") } }
        // The other repository (straight to the server, the generous timeouts) makes the schema.
        try await PostgresTokenRepository.withRepository(direct, logger: logger) { other in
            try await PostgresTokenRepository.withRepository(relayed, logger: log.logger) { store in
                let recorder = StreamRecorder(store.changes())
                let work = Task { await store.runBackgroundWork() }
                defer { work.cancel() }
                #expect(await eventually(within: 30) { store.isListening })
                let first = try TokenKey.vehicle("before-silence")
                try await other.upsert(token(first, expiresIn: 600))
                #expect(await eventually(within: 10) { recorder.elements.contains(.upserted(first)) }, "\(recorder.elements)")
                let unknownsBefore = recorder.elements.filter { $0 == .unknown }.count

                // The feed's connection (the only one this store holds) carries nothing more
                // either way and stays open: no FIN, no RST. New connections are relayed.
                let relayedBefore = relay.relayedConnections
                relay.freezeOpenConnections()
                // On the old code nothing ever noticed: no warning, isListening true for good.
                #expect(await eventually(within: 15) { lossLogged() }, "warnings: \(log.messages(at: .warning))")
                #expect(await eventually(within: 30) {
                    store.isListening && recorder.elements.filter { $0 == .unknown }.count > unknownsBefore
                }, "listening: \(store.isListening), changes: \(recorder.elements)")
                let second = try TokenKey.vehicle("after-silence")
                try await other.upsert(token(second, expiresIn: 600))
                #expect(await eventually(within: 10) { recorder.elements.contains(.upserted(second)) }, "\(recorder.elements)")
                #expect(relay.relayedConnections > relayedBefore, "the feed listens on a new connection")
            }
        }
    }

    @Test("two engines without run() on one database fetch a missing key once; the waiter ends through the feed")
    func twoEnginesOneFetch() async throws {
        let (_, _, configuration) = try await freshDatabase()
        let fetcher = ScriptedFetcher { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: Date(), lifetime: 3600)) }
        let key = try TokenKey.vehicle("shared")
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { first in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { second in
                let a = TokenSyncEngine(repository: first, fetcher: fetcher, logger: logger)
                let b = TokenSyncEngine(repository: second, fetcher: fetcher, logger: logger)
                fetcher.close()
                async let fromA = a.token(for: key)
                #expect(await eventually(within: 30) { fetcher.waitingAtGate == 1 })
                async let fromB = b.token(for: key)
                #expect(await eventually(within: 30) {
                    if case .waitingForHolder = b.flightPhase(of: key) { true } else { false }
                })
                // b listens for the length of its wait (no run()): a's write reaches it by NOTIFY.
                #expect(await eventually(within: 30) { second.isListening })
                fetcher.open()
                let started = ContinuousClock.now
                let (tokenA, tokenB) = try await (fromA, fromB)
                #expect(tokenA.value == tokenB.value)
                #expect(fetcher.total == 1)
                #expect(ContinuousClock.now - started < .seconds(5), "the waiter learned the result through the feed, not its lease's expiry")
                await a.shutdown()
                await b.shutdown()
            }
        }
    }
}

@Suite("TLS to the database", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresTLSTests {
    let logger = Logger(label: "tls")

    @Test("sslmode disable, require and verify-full connect as they say; verify-full against another CA is refused, saying so")
    func modes() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let sessions = """
            SELECT coalesce(string_agg(DISTINCT s.ssl::text, ','), '') FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
            WHERE a.datname = '\(database)' AND a.application_name LIKE 'fleet-token-store/%'
            """
        for (mode, encrypted) in [("disable", "false"), ("require", "true"), ("verify-full", "true")] {
            let configuration = try configuration(server, database, sslmode: mode)
            let seen = try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
                try await store.upsert(token(try .vehicle("tls-\(mode)"), expiresIn: 600))
                return try await server.psql(sessions, database: database)
            }
            #expect(seen == encrypted, "sslmode=\(mode): sessions with ssl=\(seen)")
        }

        // Verified against a CA that did not sign the server's certificate.
        let scratch = Scratch()
        let otherCA = scratch.file("other-ca.pem")
        let made = try await runCapturing(["/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                                     "-nodes", "-keyout", scratch.file("other-ca.key"), "-out", otherCA, "-days", "1",
                                     "-subj", "/CN=another CA"])
        try #require(made.status == 0, "\(made.stderr)")
        var wrong = try PostgresStoreConfiguration(url: "postgres://fleet@127.0.0.1:\(server.port)/\(database)?sslmode=verify-full&sslrootcert=\(otherCA)")
        wrong.environment = ["PGPASSWORD": server.password]
        await #expect {
            try await PostgresTokenRepository.withRepository(wrong, logger: logger) { _ in }
        } throws: { error in
            guard let error = error as? TokenStoreError else { return false }
            // The operator is told what failed: TLS's verdict, not "connection failed".
            #expect(error.description.contains("CERTIFICATE_VERIFY_FAILED"), "\(error)")
            return error.code == .databaseUnavailable && !error.description.contains(server.password)
        }
    }

    @Test("a database that refuses connections is reported as refusing them, and one that never answers as the connect deadline passing")
    func connectionFailuresSayWhy() async throws {
        let closed = try SilentSocket(listening: false)
        defer { closed.close() }
        var refused = try PostgresStoreConfiguration(url: "postgres://fleet@127.0.0.1:\(closed.port)/db?sslmode=disable")
        refused.environment = ["PGPASSWORD": "unused"]
        await #expect {
            try await PostgresTokenRepository.withRepository(refused, logger: Logger(label: "refused")) { _ in }
        } throws: { error in
            #expect("\(error)".contains("Connection refused"), "\(error)")
            return (error as? TokenStoreError)?.code == .databaseUnavailable
        }
        // Listening, never accepting: TCP completes, no startup answer ever comes.
        let silent = try SilentSocket(listening: true)
        defer { silent.close() }
        var unanswered = try PostgresStoreConfiguration(url: "postgres://fleet@127.0.0.1:\(silent.port)/db?sslmode=disable")
        unanswered.environment = ["PGPASSWORD": "unused"]
        unanswered.connectTimeout = .seconds(1)
        await #expect {
            try await PostgresTokenRepository.withRepository(unanswered, logger: Logger(label: "silent")) { _ in }
        } throws: { error in
            #expect("\(error)".contains("no connection within 1.0 s"), "\(error)")
            return (error as? TokenStoreError)?.code == .databaseUnavailable
        }
    }
}
