// Encryption at rest (issue 17) on PostgreSQL with real processes: token-agent with
// --encryption-key-file refreshing short-lived tokens, killed with SIGKILL while it writes and
// started again, then every byte of the server's cluster directory searched for the tokens the
// dev issuer handed out; tokenctl's views of a sealed store, rekey, and an agent refused without
// the key; replicas sharing the database (two with the key; one without it beside one with it)
// asked over their token APIs. Every wait is bounded; every process is stopped by its pid.

import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import Testing
import TestSupportKit
#if canImport(Glibc)
import Glibc
#endif

@Suite("Encryption at rest on PostgreSQL: token-agent and tokenctl as processes", .paced, .serialized, .exclusive,
       .enabled(if: PostgresServer.testsEnabled))
struct PostgresEncryptionProcessTests {
    // MARK: - kill -9 while writing, then the cluster's bytes

    @Test("token-agent --encryption-key-file refreshing 6 s tokens, killed with SIGKILL mid-write 3 times and restarted: after CHECKPOINT no file of the cluster holds an issued token or signature, and every subject has a sealed row that opens to a token the issuer issued")
    func killedAgentLeavesNoPlaintextOnDisk() async throws {
        let server = try await PostgresServer.make()
        defer { server.stopInBackground() }
        let database = "sealed"
        try await server.createDatabase(database)
        let scratch = Scratch()
        let lifetime = 6.0
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Int(lifetime), recordTokens: true)
        defer { issuer.process.signal(SIGTERM) }
        let (keyPath, key) = try Self.keyFile(in: scratch, "agent.key", base64: false)
        let vehicles = (1...6).map { "sv-\($0)" }, trips = ["st-1", "st-2"]
        let subjects = vehicles.map { "vehicle/\($0)" } + trips.map { "trip/\($0)" }
        let arguments = ["--db", server.url(database: database), "--provider-url", issuer.template, "--encryption-key-file", keyPath,
                         "--log-level", "debug"] + vehicles.flatMap { ["--vehicle", $0] } + trips.flatMap { ["--trip", $0] }
        let table = "fleet_token_store.tokens"
        let floor = min(30, 0.1 * lifetime)
        let validSealed = "SELECT count(*) FROM \(table) WHERE value_key_id = '\(key.id)' AND expires_at > extract(epoch from now()) + \(floor)"
        func psql(_ sql: String) async throws -> String { try await server.psql(sql, database: database) }

        var agents: [RunningProcess] = []
        defer { for agent in agents where agent.isRunning { agent.signal(SIGKILL) } }
        var killedMidWave: [Int] = []
        for round in 0..<3 {
            let agent = try AgentFixture.launch(arguments, environment: ["PGPASSWORD": server.password], in: scratch)
            agents.append(agent)
            let served = await eventually(within: 30) { (try? await psql(validSealed)) == "\(subjects.count)" }
            try #require(served, "round \(round): the agent did not keep all \(subjects.count) keys sealed and valid within 30 s: \(agent.stderr.suffix(3000))")
            // Wait for the next refresh wave to begin (a token fetched after the newest one now
            // stored), then SIGKILL at once: some of the wave's writes are done, others not.
            let newest = try await psql("SELECT max(fetched_at) FROM \(table)")
            let refreshed = "SELECT count(*) FROM \(table) WHERE fetched_at > \(newest)"
            var begun = "0"
            let waveBegan = await eventually(within: 2 * lifetime + 5) {
                begun = (try? await psql(refreshed)) ?? "0"
                return begun != "0"
            }
            agent.signal(SIGKILL)
            try #require(waveBegan, "round \(round): no refresh began within \(2 * lifetime + 5) s: \(agent.stderr.suffix(3000))")
            #expect(await agent.wait(upTo: 5) != nil, "round \(round): the agent survived SIGKILL")
            killedMidWave.append(Int(begun) ?? 0)
            // What the killed agent left: every row sealed, and each opens to a token issued for it.
            let problems = try await Self.unopenedRows(server, database, key: key, issued: issuer.issuedTokens(), subjects: subjects)
            #expect(problems.isEmpty, "round \(round), right after SIGKILL: \(problems)")
        }
        // Started once more after the last kill: it opens the store it left, and writes again.
        let last = try AgentFixture.launch(arguments, environment: ["PGPASSWORD": server.password], in: scratch)
        agents.append(last)
        let restartedAt = Date().timeIntervalSince1970
        let rewritten = await eventually(within: 2 * lifetime + 10) {
            (try? await psql("SELECT count(*) FROM \(table) WHERE value_key_id = '\(key.id)' AND fetched_at >= \(restartedAt)")) == "\(subjects.count)"
        }
        #expect(rewritten, "the agent started after the last kill did not write every key within \(2 * lifetime + 10) s: \(last.stderr.suffix(3000))")
        last.signal(SIGTERM)
        #expect(await last.wait(upTo: 15) == 0, "\(last.stderr.suffix(2000))")

        // Every agent: no value ever failed to open (a torn or plaintext write would have).
        for (index, agent) in agents.enumerated() {
            for bad in ["does not open", "is not sealed", "sealed with a key this process does not hold"] {
                #expect(!agent.stderr.contains(bad), "agent \(index) logged '\(bad)': \(agent.stderr.suffix(2000))")
            }
        }

        // What the issuer handed out, and the rows: every subject has a sealed row under the key
        // that opens to one of its issued tokens.
        let issued = try await issuer.issuedTokens()
        #expect(Set(issued.keys) == Set(subjects), "\(issued.keys.sorted())")
        let allIssued = issued.values.flatMap { $0 }
        // What the rounds prove was fetched, each a token of its own: the first agent's one per
        // subject (the store was empty), each wave's rows seen before its kill, the last agent's
        // one per subject. More is timing: a killed wave's unwritten fetches, a restart that found
        // tokens due. (3 per subject was asked here once; a quick CI run issued 20 of 24.)
        let proven = subjects.count + killedMidWave.reduce(0, +) + subjects.count
        #expect(allIssued.count >= proven, "only \(allIssued.count) tokens issued, fewer than the \(proven) the rounds saw stored")
        let problems = try await Self.unopenedRows(server, database, key: key, issued: issued, subjects: subjects)
        #expect(problems.isEmpty, "after the last agent stopped: \(problems)")
        let sealedValues = try await psql("SELECT token FROM \(table) WHERE token IS NOT NULL").split(separator: "\n").map(String.init)

        // A control the scan must find: a JWT-shaped value written as plaintext in the same database.
        let canary = TestJWT.make(for: try .vehicle("canary"), issuedAt: Date(), lifetime: 3600)
        _ = try await psql("CREATE TABLE public.canary (value text); INSERT INTO public.canary VALUES ('\(canary)')")
        _ = try await server.psql("CHECKPOINT")

        let scan = ClusterScan(directory: server.directory)
        #expect(scan.unreadable.isEmpty, "files of the cluster that could not be read: \(scan.unreadable.prefix(10))")
        #expect(scan.files > 100 && scan.bytes > 10_000_000, "scanned only \(scan.files) files, \(scan.bytes) bytes of \(server.directory)")
        #expect(!scan.filesContaining(canary).isEmpty, "the control failed: the plaintext canary is in no file of \(server.directory)")
        #expect(!scan.filesContaining(Self.signature(of: canary)).isEmpty, "the control failed: the canary's signature is in no file")
        for value in sealedValues {
            let found = scan.filesContaining(value)
            #expect(found.contains { $0.contains("/base/") }, "a current sealed value is in no table file after CHECKPOINT: \(found)")
        }
        var leaks: [String] = []
        for (subject, tokens) in issued.sorted(by: { $0.key < $1.key }) {
            for (index, token) in tokens.enumerated() {
                // The signature is in the token: searching it finds the token anywhere too.
                let files = scan.filesContaining(Self.signature(of: token))
                if !files.isEmpty {
                    let whole = scan.filesContaining(token)
                    leaks.append("\(subject) token #\(index): its signature in \(files), the whole token in \(whole)")
                }
            }
        }
        #expect(leaks.isEmpty, "\(leaks.count) of \(allIssued.count) issued tokens found in the cluster's files: \(leaks.prefix(5))")
        print("sealed on disk: killed when \(killedMidWave.map { "\($0)/\(subjects.count)" }) of the keys' refreshes were written; \(leaks.count) of \(allIssued.count) issued tokens found in \(scan.files) files (\(scan.bytes) bytes) of the cluster; \(sealedValues.count) sealed rows")
    }

    // MARK: - tokenctl on a sealed store

    @Test("tokenctl on a sealed PostgreSQL store: stats and list without a key show key id counts and no token; show --reveal needs the key; rekey with two keys moves every value and reports counts; then an agent with only the old key is refused")
    func tokenctlOnSealedStore() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let url = server.url(database: database)
        let environment = ["PGPASSWORD": server.password]
        let issuer = try await IssuerProcess(scratch: scratch, recordTokens: true)
        defer { issuer.process.signal(SIGTERM) }
        let (oldPath, old) = try Self.keyFile(in: scratch, "old.key", base64: true)
        let (newPath, new) = try Self.keyFile(in: scratch, "new.key", base64: false)
        func tokenctl(_ arguments: [String]) async throws -> (status: Int32, stdout: String, stderr: String) {
            try await runToEnd("tokenctl", arguments + ["--db", url], environment: environment, in: scratch)
        }

        let once = try await AgentFixture.run(["--db", url, "--provider-url", issuer.template, "--encryption-key-file", oldPath,
                                                      "--vehicle", "v1", "--vehicle", "v2", "--trip", "t1", "--once"],
                                      environment: environment, in: scratch)
        #expect(once.status == 0, "\(once.stderr)")
        let issued = try await issuer.issuedTokens()
        let tokens = issued.values.flatMap { $0 }
        #expect(tokens.count == 3, "\(issued.keys)")

        let stats = try await tokenctl(["stats"])
        #expect(stats.status == 0, "\(stats.stderr)")
        #expect(stats.stdout.contains("token values    3 sealed with key id \(old.id)"), "\(stats.stdout)")
        #expect(!stats.stdout.contains("not sealed"), "\(stats.stdout)")
        let statsJSON = try await tokenctl(["stats", "--json"])
        let byKeyID = try Self.jsonObject(statsJSON.stdout)["values_by_key_id"] as? [String: Int]
        #expect(byKeyID == [old.id: 3], "\(statsJSON.stdout) \(statsJSON.stderr)")

        // The fingerprints are those of the tokens issued, read from the sealed envelope without a key.
        let list = try await tokenctl(["list"])
        #expect(list.status == 0, "\(list.stderr)")
        let listJSON = try await tokenctl(["list", "--json"])
        let entries = try JSONSerialization.jsonObject(with: Data(listJSON.stdout.utf8)) as? [[String: Any]] ?? []
        #expect(entries.count == 3 && entries.allSatisfy { $0["value_key_id"] as? String == old.id }, "\(listJSON.stdout)")
        for (subject, values) in issued {
            let fingerprint = TokenFingerprint(of: values[0]).description
            let entry = entries.first { "\($0["kind"] as? String ?? "")/\($0["id"] as? String ?? "")" == subject }
            #expect(entry?["fingerprint"] as? String == fingerprint, "\(subject): \(String(describing: entry))")
            #expect(list.stdout.contains(fingerprint), "list shows no fingerprint \(fingerprint) of \(subject): \(list.stdout)")
        }

        let hidden = try await tokenctl(["show", "vehicle", "v1"])
        #expect(hidden.status == 0, "\(hidden.stderr)")
        let revealWithout = try await tokenctl(["show", "vehicle", "v1", "--reveal"])
        #expect(revealWithout.status == 1, "show --reveal without the key: \(revealWithout.stdout) \(revealWithout.stderr)")
        #expect(revealWithout.stderr.contains(old.id), "\(revealWithout.stderr)")
        let revealWrong = try await tokenctl(["show", "vehicle", "v1", "--reveal", "--encryption-key-file", newPath])
        #expect(revealWrong.status == 1 && revealWrong.stderr.contains(old.id), "show --reveal with another key: \(revealWrong.stdout) \(revealWrong.stderr)")
        let revealed = try await tokenctl(["show", "vehicle", "v1", "--reveal", "--encryption-key-file", oldPath])
        #expect(revealed.status == 0, "\(revealed.stderr)")
        let v1 = try #require(issued["vehicle/v1"]?.first)
        #expect(revealed.stdout.contains(v1), "show --reveal with the key did not print vehicle/v1's token: \(revealed.stdout)")

        // rekey with the new key alone: the old values do not open, stay, and make exit 1.
        let before = try await server.psql("SELECT string_agg(token, ',' ORDER BY kind, subject_id) FROM fleet_token_store.tokens", database: database)
        let alone = try await tokenctl(["rekey", "--encryption-key-file", newPath])
        #expect(alone.status == 1 && alone.stderr.contains(old.id), "rekey without the old key: \(alone.stdout) \(alone.stderr)")
        #expect(try await server.psql("SELECT string_agg(token, ',' ORDER BY kind, subject_id) FROM fleet_token_store.tokens", database: database) == before)

        let rekey = try await tokenctl(["rekey", "--encryption-key-file", newPath, "--encryption-key-file", oldPath, "--json"])
        #expect(rekey.status == 0, "\(rekey.stdout) \(rekey.stderr)")
        let report = try Self.jsonObject(rekey.stdout)
        #expect(report["primary_key_id"] as? String == new.id, "\(rekey.stdout)")
        #expect(report["resealed"] as? [String: Int] == [old.id: 3], "\(rekey.stdout)")
        // None was under the new key before: already_primary (TokenValueResealer.Report.alreadyPrimary,
        // "values already under the primary key, left as they were") is 0.
        #expect(report["already_primary"] as? Int == 0, "already_primary counts the values just re-sealed: \(rekey.stdout)")
        #expect((report["unopenable"] as? [String: Int])?.isEmpty == true && report["changed_meanwhile"] as? Int == 0, "\(rekey.stdout)")
        let after = try await tokenctl(["stats"])
        #expect(after.stdout.contains("token values    3 sealed with key id \(new.id)") && !after.stdout.contains(old.id), "\(after.stdout)")
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = '\(new.id)'", database: database) == "3")
        let again = try await tokenctl(["rekey", "--encryption-key-file", newPath])
        #expect(again.status == 0 && again.stdout.contains("re-sealed 0 token value(s)") && again.stdout.contains("3 under key id \(new.id) now"),
                "\(again.stdout) \(again.stderr)")
        let revealedNew = try await tokenctl(["show", "vehicle", "v1", "--reveal", "--encryption-key-file", newPath])
        #expect(revealedNew.status == 0 && revealedNew.stdout.contains(v1), "\(revealedNew.stdout) \(revealedNew.stderr)")
        let revealedOld = try await tokenctl(["show", "vehicle", "v1", "--reveal", "--encryption-key-file", oldPath])
        #expect(revealedOld.status == 1 && revealedOld.stderr.contains(new.id), "\(revealedOld.stdout) \(revealedOld.stderr)")

        // An agent given only the rotated-out key is refused, naming the new key id, and fetches nothing.
        let issuedBefore = try await issuer.stats().issued
        let oldAgent = try await AgentFixture.run(["--db", url, "--provider-url", issuer.template, "--encryption-key-file", oldPath,
                                                          "--vehicle", "v1", "--once"], environment: environment, in: scratch)
        #expect(oldAgent.status == 1 && oldAgent.stderr.contains("sealed with encryption key id \(new.id)"), "\(oldAgent.stderr)")
        #expect(try await issuer.stats().issued == issuedBefore)

        // No output but the two reveals printed a token.
        for output in [once, stats, statsJSON, list, listJSON, hidden, revealWithout, revealWrong, alone, rekey, after, again, revealedOld, oldAgent] {
            for token in tokens {
                #expect(!output.stdout.contains(token) && !output.stderr.contains(token), "a token in tokenctl's output: \(output.stdout.prefix(300))")
                #expect(!output.stdout.contains(Self.signature(of: token)) && !output.stderr.contains(Self.signature(of: token)))
            }
        }
    }

    // MARK: - The agent without the key

    @Test("token-agent on a sealed PostgreSQL store without its key (none, or another): exits 1 naming the key id, fetches nothing, the table unchanged; with the key as a second key it opens the stored tokens")
    func agentRefusedWithoutKey() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let url = server.url(database: database)
        let environment = ["PGPASSWORD": server.password]
        let issuer = try await IssuerProcess(scratch: scratch)
        defer { issuer.process.signal(SIGTERM) }
        let (keyPath, key) = try Self.keyFile(in: scratch, "key", base64: true)
        let (otherPath, _) = try Self.keyFile(in: scratch, "other.key", base64: false)
        let base = ["--db", url, "--provider-url", issuer.template, "--vehicle", "v1", "--vehicle", "v2"]
        let once = try await AgentFixture.run(base + ["--encryption-key-file", keyPath, "--once"], environment: environment, in: scratch)
        #expect(once.status == 0, "\(once.stderr)")
        let snapshot = "SELECT string_agg(t::text || '@' || t.xmin::text, E'\\n' ORDER BY kind, subject_id) FROM fleet_token_store.tokens t"
        let before = try await server.psql(snapshot, database: database)
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = '\(key.id)'", database: database) == "2")
        let issuedBefore = try await issuer.stats().issued

        for (label, keyArguments) in [("no key", [String]()), ("another key", ["--encryption-key-file", otherPath])] {
            // Long-lived (no --once): it must exit, not serve.
            let agent = try AgentFixture.launch(base + keyArguments, environment: environment, in: scratch)
            defer { if agent.isRunning { agent.signal(SIGKILL) } }
            let status = await agent.wait(upTo: 30)
            #expect(status == 1, "\(label): exit \(String(describing: status)): \(agent.stderr.suffix(2000))")
            #expect(agent.stderr.contains("sealed with encryption key id \(key.id)"), "\(label): \(agent.stderr.suffix(2000))")
            #expect(agent.stderr.contains("--encryption-key-file"), "\(label): no hint: \(agent.stderr.suffix(2000))")
            let says = keyArguments.isEmpty ? "no encryption key was given" : "no key given has that id"
            #expect(agent.stderr.contains(says), "\(label): \(agent.stderr.suffix(2000))")
            #expect(try await server.psql(snapshot, database: database) == before, "\(label): the table changed")
        }
        #expect(try await issuer.stats().issued == issuedBefore, "a refused agent fetched tokens")
        // With the key as a second one (rotation), it starts and reads the sealed tokens.
        let rotating = try await AgentFixture.run(base + ["--encryption-key-file", otherPath, "--encryption-key-file", keyPath, "--once"],
                                          environment: environment, in: scratch)
        #expect(rotating.status == 0, "\(rotating.stderr)")
        #expect(try await issuer.stats().issued == issuedBefore, "the rotating agent did not open the stored tokens and fetched anew")
    }

    // MARK: - Rotation beside a running agent

    @Test("rotation beside a running agent: values sealed with the old key, an agent started with the new key first and the old second refreshing 6 s tokens, tokenctl rekey run 3 times meanwhile: every run exits 0 with nothing unopenable, and afterwards every value is under the new key and opens with it alone")
    func rekeyBesideRunningAgent() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let url = server.url(database: database)
        let environment = ["PGPASSWORD": server.password]
        let lifetime = 6.0
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Int(lifetime), recordTokens: true)
        defer { issuer.process.signal(SIGTERM) }
        let (oldPath, old) = try Self.keyFile(in: scratch, "old.key", base64: false)
        let (newPath, new) = try Self.keyFile(in: scratch, "new.key", base64: true)
        let ids = (1...20).map { "rot-\($0)" }
        let subjects = ids.map { "vehicle/\($0)" }
        let vehicles = ids.flatMap { ["--vehicle", $0] }
        let seeded = try await AgentFixture.run(["--db", url, "--provider-url", issuer.template, "--encryption-key-file", oldPath, "--once"] + vehicles,
                                        environment: environment, in: scratch)
        #expect(seeded.status == 0, "\(seeded.stderr)")
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = '\(old.id)'", database: database) == "20")

        let agent = try AgentFixture.launch(["--db", url, "--provider-url", issuer.template, "--encryption-key-file", newPath,
                                                       "--encryption-key-file", oldPath, "--log-level", "debug"] + vehicles,
                                       environment: environment, in: scratch)
        defer { if agent.isRunning { agent.signal(SIGKILL) } }
        try #require(await agent.waitForOutput("token values are sealed at rest", within: 30), "\(agent.stderr.suffix(2000))")
        // Rekey once the agent's first refresh wave has begun, so its writes and rekey's overlap.
        let underNew = "SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = '\(new.id)'"
        try #require(await eventually(within: 2 * lifetime + 5) { ((try? await server.psql(underNew, database: database)) ?? "0") != "0" },
                     "the agent wrote nothing under the new key: \(agent.stderr.suffix(2000))")
        var reports: [[String: Any]] = []
        for round in 0..<3 {
            let rekey = try await runToEnd("tokenctl", ["rekey", "--db", url, "--encryption-key-file", newPath, "--encryption-key-file", oldPath, "--json"],
                                           environment: environment, in: scratch)
            #expect(rekey.status == 0, "rekey \(round): \(rekey.stdout) \(rekey.stderr)")
            let report = try Self.jsonObject(rekey.stdout)
            #expect((report["unopenable"] as? [String: Int])?.isEmpty == true, "rekey \(round): \(rekey.stdout)")
            reports.append(report)
            try await Task.sleep(for: .seconds(lifetime / 3))
        }
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id <> '\(new.id)'", database: database) == "0",
                "values not under the new key after rekey: \(reports)")
        // The agent goes on refreshing under the new key: a whole lifetime more, then every row
        // opens with the new key alone to a token issued for it.
        let since = Date().timeIntervalSince1970
        let refreshed = await eventually(within: 2 * lifetime + 5) {
            (try? await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = '\(new.id)' AND fetched_at > \(since)",
                                    database: database)) == "20"
        }
        #expect(refreshed, "the agent did not refresh every key under the new key: \(agent.stderr.suffix(2000))")
        agent.signal(SIGTERM)
        #expect(await agent.wait(upTo: 15) == 0, "\(agent.stderr.suffix(2000))")
        let problems = try await Self.unopenedRows(server, database, key: new, issued: issuer.issuedTokens(), subjects: subjects)
        #expect(problems.isEmpty, "\(problems)")
        for line in ["does not open", "is not sealed", "sealed with a key this process does not hold", "this engine was given no key"] {
            #expect(!agent.stderr.contains(line), "the agent logged '\(line)': \(agent.stderr.suffix(2000))")
        }
        let resealed = reports.map { ($0["resealed"] as? [String: Int])?[old.id] ?? 0 }
        let meanwhile = reports.map { $0["changed_meanwhile"] as? Int ?? -1 }
        print("rekey beside an agent: re-sealed \(resealed) from the old key, \(meanwhile) changed meanwhile")
    }

    // MARK: - A replica without the key beside one with it

    @Test("rolling out a key on a shared PostgreSQL store: an agent still running without the key beside one started with it never serves a sealed value as a token, both keep answering, and they do not fetch in a loop")
    func keylessReplicaNeverServesSealedValues() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let url = server.url(database: database)
        let environment = ["PGPASSWORD": server.password]
        let lifetime = 6.0
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Int(lifetime))
        defer { issuer.process.signal(SIGTERM) }
        let (keyPath, _) = try Self.keyFile(in: scratch, "key", base64: true)
        let ids = ["m-1", "m-2"]
        func agent(_ name: String, _ extra: [String]) throws -> PostgresReplicaTests.ServingReplica {
            let socket = scratch.file("\(name).sock"), sink = scratch.file("sink-\(name)")
            let process = try AgentFixture.launch(["--db", url, "--provider-url", issuer.template, "--listen", "unix:\(socket)",
                                                             "--sink", sink, "--log-level", "debug"] + extra + ids.flatMap { ["--vehicle", $0] },
                                             environment: environment, in: scratch)
            return PostgresReplicaTests.ServingReplica(process: process, socket: socket, sink: sink)
        }
        // The fleet as it ran before: no key, plaintext values.
        let keyless = try agent("keyless", [])
        defer { keyless.process.signal(SIGTERM) }
        let stored = "SELECT count(*) FROM fleet_token_store.tokens WHERE token IS NOT NULL"
        try #require(await keyless.process.waitForOutput("token API listening", within: 30), "\(keyless.process.stderr.suffix(2000))")
        try #require(await eventually(within: 30) { (try? await server.psql(stored, database: database)) == "2" },
                     "\(keyless.process.stderr.suffix(2000))")
        // One replica restarted with the key: it seals the store's values and writes sealed ones.
        let keyed = try agent("keyed", ["--encryption-key-file", keyPath])
        defer { keyed.process.signal(SIGTERM) }
        try #require(await keyed.process.waitForOutput("token API listening", within: 30), "\(keyed.process.stderr.suffix(2000))")
        #expect(keyed.process.stderr.contains("sealed the store's unencrypted token values"), "\(keyed.process.stderr.suffix(2000))")
        let issuedBefore = try await issuer.stats().issued

        // Ask both for every key every 0.25 s for three lifetimes: every answer must be a JWT.
        let (answers, bad) = try await Self.nonJWTAnswers([("keyless", keyless), ("keyed", keyed)], ids: ids, for: 3 * lifetime, scratch: scratch)
        let plaintextRows = try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = 'plaintext'", database: database)
        let unsealedErrors = keyed.process.stderr.components(separatedBy: "is not sealed although the store is encrypted").count - 1
        let issued = try await issuer.stats().issued - issuedBefore
        print("mixed fleet: \(answers) answers, \(bad.count) not a JWT; \(issued) tokens issued for \(ids.count) keys in \(3 * lifetime) s; \(plaintextRows) plaintext rows at the end; the keyed agent removed \(unsealedErrors) plaintext values")
        // Both keep answering (the probe asks each for 2 keys about 70 times), and the two do not
        // fetch in a loop: one fetch per key per lifetime is the rule; three, mixed, is the bound.
        #expect(answers > 100, "only \(answers) answers from the two agents in \(3 * lifetime) s")
        #expect(issued <= 3 * ids.count * 3, "\(issued) tokens issued for \(ids.count) keys in 3 lifetimes: the two agents fetch in a loop")
        #expect(bad.isEmpty, "\(bad.count) answers were not JWTs (a sealed value handed out as a token): \(bad.prefix(6)); keyless agent: \(keyless.process.stderr.suffix(1500))")
    }

    @Test("two token-agents with the same key on one PostgreSQL database, 6 s tokens for three lifetimes: every answer of both is a JWT, never a sealed value (a token the other replica stored reaches each through the lease and the change feed)")
    func keyedReplicasServeOnlyJWTs() async throws {
        let (server, database) = try await PostgresServer.makeDatabase()
        let scratch = Scratch()
        let lifetime = 6.0
        let issuer = try await IssuerProcess(scratch: scratch, lifetime: Int(lifetime))
        defer { issuer.process.signal(SIGTERM) }
        let (keyPath, key) = try Self.keyFile(in: scratch, "key", base64: false)
        let ids = (1...8).map { "r-\($0)" }
        var replicas: [(String, PostgresReplicaTests.ServingReplica)] = []
        defer { for (_, replica) in replicas { replica.process.signal(SIGTERM) } }
        for name in ["a", "b"] {
            let socket = scratch.file("\(name).sock"), sink = scratch.file("sink-\(name)")
            let process = try AgentFixture.launch(["--db", server.url(database: database), "--provider-url", issuer.template,
                                                             "--encryption-key-file", keyPath, "--listen", "unix:\(socket)", "--sink", sink,
                                                             "--log-level", "debug"] + ids.flatMap { ["--vehicle", $0] },
                                             environment: ["PGPASSWORD": server.password], in: scratch)
            replicas.append((name, PostgresReplicaTests.ServingReplica(process: process, socket: socket, sink: sink)))
        }
        for (name, replica) in replicas {
            try #require(await replica.process.waitForOutput("token API listening", within: 30), "\(name): \(replica.process.stderr.suffix(2000))")
        }
        let sealed = "SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id = '\(key.id)'"
        try #require(await eventually(within: 30) { (try? await server.psql(sealed, database: database)) == "\(ids.count)" })
        let (answers, bad) = try await Self.nonJWTAnswers(replicas, ids: ids, for: 3 * lifetime, scratch: scratch)
        let issued = try await issuer.stats().issued
        print("two keyed replicas: \(answers) answers, \(bad.count) not a JWT; \(issued) tokens issued for \(ids.count) keys in \(3 * lifetime) s")
        #expect(answers > 40, "only \(answers) answers from the two agents")
        #expect(bad.isEmpty, "\(bad.count) answers were not JWTs (a sealed value handed out as a token): \(bad.prefix(6))")
        for (name, replica) in replicas {
            #expect(replica.process.isRunning, "\(name) exited: \(replica.process.stderr.suffix(2000))")
            for line in ["does not open", "is not sealed", "this engine was given no key"] {
                #expect(!replica.process.stderr.contains(line), "\(name) logged '\(line)'")
            }
        }
        #expect(try await server.psql("SELECT count(*) FROM fleet_token_store.tokens WHERE value_key_id <> '\(key.id)'", database: database) == "0")
        // Single flight across the replicas holds with sealed values: no key fetched twice within a lifetime.
        var twice: [String] = []
        for (subject, times) in try await issuer.issuedTimes() {
            for (_, gap) in IssuerProcess.refetchesTooSoon(times, lifetime: lifetime) {
                twice.append("\(subject): \(String(format: "%.2f", gap)) s apart")
            }
        }
        #expect(twice.isEmpty, "keys fetched twice within one lifetime: \(twice.prefix(10))")
    }

    // MARK: - Helpers

    /// Asks every replica for every key every 0.25 s for `seconds` (through the token API with
    /// curl, or its token files without curl); returns how many answers came and the ones that
    /// were not a JWT (a sealed value, say).
    static func nonJWTAnswers(_ replicas: [(String, PostgresReplicaTests.ServingReplica)], ids: [String], for seconds: Double,
                              scratch: Scratch) async throws -> (answers: Int, bad: [String]) {
        let curl = executable(["/usr/bin/curl", "/usr/local/bin/curl"])
        var bad: [String] = []
        var answers = 0
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            for (name, replica) in replicas {
                let served = await PostgresReplicaTests.servedTokens(ids, socket: replica.socket, sink: replica.sink, curl: curl, scratch: scratch)
                for (id, answer) in served {
                    guard case .success(let value) = answer else { continue }
                    answers += 1
                    if value.split(separator: ".").count != 3 || value.hasPrefix(SealedTokenValue.prefix) {
                        bad.append("\(name) served \(id) \(String(value.prefix(36)))… at \(String(format: "%.2f", Date().timeIntervalSince1970))")
                    }
                }
            }
            try await Task.sleep(for: .milliseconds(250))
        }
        return (answers, bad)
    }

    /// What is wrong with the token rows: a subject without a row, a row whose value is not
    /// sealed under `key`, does not open, or opens to a token the issuer never issued for it.
    static func unopenedRows(_ server: PostgresServer, _ database: String, key: TokenEncryptionKey, issued: [String: [String]],
                             subjects: [String]) async throws -> [String] {
        let rows = try await server.psql("SELECT kind || '|' || subject_id || '|' || coalesce(value_key_id, 'NULL') || '|' || coalesce(token, 'NULL') "
                                         + "FROM fleet_token_store.tokens", database: database)
            .split(separator: "\n").map { $0.split(separator: "|", maxSplits: 3).map(String.init) }
        var problems: [String] = []
        let present = Set(rows.map { "\($0[0])/\($0[1])" })
        if present != Set(subjects) { problems.append("rows of \(present.sorted()), not of \(subjects.sorted())") }
        let keyring = TokenKeyring(primary: key)
        for row in rows {
            let subject = "\(row[0])/\(row[1])"
            guard row.count == 4, row[2] == key.id, row[3].hasPrefix("sealed:v1:\(key.id):"), let kind = TokenKind(rawValue: row[0]) else {
                problems.append("\(subject): value_key_id \(row.count > 2 ? row[2] : "?"), token \(row.count > 3 ? String(row[3].prefix(30)) : "?")")
                continue
            }
            switch SealedTokenValue.open(row[3], for: TokenKey(uncheckedKind: kind, subjectID: row[1]), with: keyring) {
            case .opened(let value, _):
                if issued[subject]?.contains(value) != true { problems.append("\(subject) opens to a token the issuer never issued for it") }
            case let other:
                problems.append("\(subject) does not open: \(String(describing: other).prefix(24))")
            }
        }
        return problems
    }

    /// A key file of 32 random bytes (raw or base64), mode 0600, and the key it holds.
    static func keyFile(in scratch: Scratch, _ name: String, base64: Bool) throws -> (path: String, key: TokenEncryptionKey) {
        var generator = SystemRandomNumberGenerator()
        let bytes = Data((0..<32).map { _ in UInt8.random(in: 0...255, using: &generator) })
        let path = scratch.file(name)
        let contents = base64 ? Data((bytes.base64EncodedString() + "\n").utf8) : bytes
        guard FileManager.default.createFile(atPath: path, contents: contents, attributes: [.posixPermissions: 0o600]) else {
            throw ProcessFailure(message: "cannot write \(path)")
        }
        return (path, try TokenEncryptionKey.load(file: path))
    }

    /// A JWT's third part.
    static func signature(of token: String) -> String { String(token.split(separator: ".").last ?? "") }

    static func jsonObject(_ text: String) throws -> [String: Any] {
        guard let object = try JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else {
            throw ProcessFailure(message: "not a JSON object: \(text)")
        }
        return object
    }
}

/// Every regular file under a directory, read once into memory, searched for byte strings
/// (memmem). Run as root or as the files' owner (the harness's cluster: the server user, or
/// this user when not root).
struct ClusterScan {
    private let contents: [(path: String, data: Data)]
    /// Files listed that could not be read (other than ones gone since they were listed).
    let unreadable: [String]

    init(directory: String) {
        var contents: [(String, Data)] = []
        var unreadable: [String] = []
        let files = FileManager.default
        for relative in files.enumerator(atPath: directory)?.compactMap({ $0 as? String }) ?? [] {
            let path = "\(directory)/\(relative)"
            var info = stat()
            guard lstat(path, &info) == 0 else { continue }                 // gone since listed
            guard info.st_mode & S_IFMT == S_IFREG else { continue }
            guard let data = files.contents(atPath: path) else {
                if files.fileExists(atPath: path) { unreadable.append(path) }
                continue
            }
            contents.append((path, data))
        }
        self.contents = contents
        self.unreadable = unreadable
    }

    /// glibc's memmem (a GNU extension the Glibc module does not import), found in the
    /// running process.
    private static let memmem: @convention(c) (UnsafeRawPointer?, Int, UnsafeRawPointer?, Int) -> UnsafeMutableRawPointer? = {
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "memmem") else { fatalError("memmem not found: \(String(cString: dlerror()))") }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeRawPointer?, Int, UnsafeRawPointer?, Int) -> UnsafeMutableRawPointer?).self)
    }()

    var files: Int { contents.count }
    var bytes: Int { contents.reduce(0) { $0 + $1.data.count } }

    /// The files that contain `text`'s UTF-8 bytes.
    func filesContaining(_ text: String) -> [String] {
        let needle = Array(text.utf8)
        guard !needle.isEmpty else { return [] }
        return contents.filter { file in
            file.data.withUnsafeBytes { haystack in
                needle.withUnsafeBytes { Self.memmem(haystack.baseAddress, haystack.count, $0.baseAddress, $0.count) != nil }
            }
        }.map(\.path)
    }
}
