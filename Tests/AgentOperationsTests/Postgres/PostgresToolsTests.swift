// tokenctl and token-agent with `--db postgres://…`: real processes against the private server.

import FleetTokenPostgres
import FleetTokenStore
import Foundation
import Testing
import TestSupportKit

@Suite("tokenctl and token-agent on PostgreSQL", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresToolsTests {
    @Test("tokenctl migrate creates the schema once; stats, list, check and purge work against it; token-agent --once stores tokens")
    func tokenctlAndAgentOnce() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let url = server.url(database: database)
        let environment = ["PGPASSWORD": server.password]

        let created = try await runToEnd("tokenctl", ["migrate", "--db", url], environment: environment, in: scratch)
        #expect(created.status == 0, "\(created.stderr)")
        #expect(created.stdout.contains("created postgres://fleet@127.0.0.1:\(server.port)/\(database)"), "\(created.stdout)")
        #expect(created.stdout.contains("at schema version \(PostgresTokenRepository.buildSchemaVersion)"))
        let again = try await runToEnd("tokenctl", ["migrate", "--db", url], environment: environment, in: scratch)
        #expect(again.stdout.contains("nothing to do"), "\(again.stdout) \(again.stderr)")

        let issuer = try await IssuerProcess(scratch: scratch)
        let once = try await AgentFixture.run(["--db", url, "--provider-url", issuer.template, "--vehicle", "v1",
                                                      "--trip", "t1", "--once"], environment: environment, in: scratch)
        #expect(once.status == 0, "\(once.stderr)")
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE token IS NOT NULL", database: database) == "2")

        let list = try await runToEnd("tokenctl", ["list", "--db", url], environment: environment, in: scratch)
        #expect(list.status == 0 && list.stdout.contains("v1") && list.stdout.contains("t1"), "\(list.stdout) \(list.stderr)")
        let stats = try await runToEnd("tokenctl", ["stats", "--db", url, "--json"], environment: environment, in: scratch)
        #expect(stats.status == 0 && stats.stdout.contains("\"total\" : 2") || stats.stdout.contains("\"total\":2"), "\(stats.stdout)")
        let check = try await runToEnd("tokenctl", ["check", "--db", url], environment: environment, in: scratch)
        #expect(check.status == 0, "\(check.stdout) \(check.stderr)")
        let purge = try await runToEnd("tokenctl", ["purge", "--db", url, "--vehicle", "v1"], environment: environment, in: scratch)
        #expect(purge.stdout.contains("purged 1 entry"), "\(purge.stdout) \(purge.stderr)")
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE token IS NOT NULL", database: database) == "1")

        // No password anywhere a process printed, and none in the errors of a wrong one.
        let started = ContinuousClock.now
        let refused = try await runToEnd("tokenctl", ["stats", "--db", url], environment: ["PGPASSWORD": "wrong-" + server.password],
                                         in: scratch)
        #expect(refused.status == 1, "\(refused.stdout) \(refused.stderr)")
        #expect(refused.stderr.contains("password authentication failed"), "\(refused.stderr)")
        #expect(ContinuousClock.now - started < .seconds(8), "a refused password is reported at once, not after the pool's retries")
        for output in [created, again, once, list, stats, check, purge, refused] {
            #expect(!output.stdout.contains(server.password) && !output.stderr.contains(server.password))
        }
        issuer.process.signal(SIGTERM)
    }

    @Test("--print-config shows a database URL without its password")
    func printConfigRedactsPassword() async throws {
        let scratch = Scratch()
        let result = try await AgentFixture.run(["--db", "postgres://agent:Sup3rSecret@db.example:5432/fleet?sslmode=verify-full",
                                                        "--vehicle", "v1", "--print-config"], in: scratch)
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("db: \"postgres://agent:***@db.example:5432/fleet?sslmode=verify-full\""), "\(result.stdout)")
        #expect(!result.stdout.contains("Sup3rSecret") && !result.stderr.contains("Sup3rSecret"))
    }

    @Test("an unreachable database: the agent exits 1 at once, naming the URL without its password and what to check")
    func unreachableDatabase() async throws {
        let scratch = Scratch()
        // A port nothing listens on (bound and closed by the harness's free-port probe would do;
        // port 1 needs privileges to listen on, so nobody does).
        let result = try await AgentFixture.run(["--db", "postgres://agent:Sup3rSecret@127.0.0.1:1/fleet?sslmode=disable",
                                                        "--vehicle", "v1"], in: scratch, timeout: 30)
        #expect(result.status == 1, "\(result.stderr)")
        #expect(result.stderr.contains("cannot reach the token database postgres://agent@127.0.0.1:1/fleet"), "\(result.stderr)")
        #expect(result.stderr.contains("--db or TOKEN_STORE_DB sets the database URL"))
        #expect(!result.stderr.contains("Sup3rSecret") && !result.stdout.contains("Sup3rSecret"))
    }
}
