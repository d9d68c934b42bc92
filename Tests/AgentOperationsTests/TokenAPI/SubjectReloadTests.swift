// Issue 13: subjects that change while running. A real token-agent process with
// --subjects-file, reloaded with SIGHUP, against a real dev-token-server; observed over its
// stdout events, its log, the API's /v1/subjects on a Unix socket, tokenctl and the issuer's
// counters.

import FleetTokenStore
import Foundation
import TestSupportKit
import Testing
#if canImport(Glibc)
import Glibc
#endif

@Suite("token-agent --subjects-file and SIGHUP", .paced, .exclusive)
struct SubjectReloadTests {
    @Test("SIGHUP tracks added subjects and untracks removed ones (still served); flag subjects stay; a bad file leaves the list as it was; SIGTERM exits 0")
    func reload() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let file = scratch.file("subjects.txt")
        try "# start\nvehicle:keep\nvehicle:gone\n".write(toFile: file, atomically: true, encoding: .utf8)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--subjects-file", file, "--trip", "fixed", "--json"])
        defer { agent.process.signal(SIGKILL) }
        #expect(await eventually(within: 30) { Self.refreshed(agent.process) == ["trip/fixed", "vehicle/gone", "vehicle/keep"] },
                "\(agent.process.stdout)")
        #expect(try await issuer.stats().issued == 3)

        var servedToken = ""
        try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            #expect(try await Self.tracked(api) == ["trip/fixed": true, "vehicle/gone": true, "vehicle/keep": true])

            // Add one, remove one, keep one (a rewrite in place, as an editor or a config tool does).
            try "# reloaded\nvehicle:keep\n\ndeliveryVehicle:new\n".write(toFile: file, atomically: true, encoding: .utf8)
            agent.process.signal(SIGHUP)
            #expect(await agent.process.waitForOutput(#""event":"subjects_reloaded""#, within: 30), "\(agent.process.stderr)")
            let events = Self.events(agent.process)
            #expect(events.contains(["event": "tracked", "kind": "deliveryVehicle", "id": "new"]))
            #expect(events.contains(["event": "untracked", "kind": "vehicle", "id": "gone"]))
            #expect(events.contains(["event": "subjects_reloaded", "added": "1", "removed": "1", "subjects": "3"]))
            #expect(await eventually(within: 30) { Self.refreshed(agent.process).contains("deliveryVehicle/new") })
            #expect(try await issuer.stats().issued == 4, "only the added subject is fetched")
            #expect(agent.process.stderr.contains("SIGHUP: subjects file reloaded"))
            #expect(agent.process.stderr.contains("added_keys=deliveryVehicle/new"))
            #expect(agent.process.stderr.contains("removed_keys=vehicle/gone"))

            // The removed subject is untracked but its token still held and served: no drop, no fetch.
            #expect(try await Self.tracked(api) == ["trip/fixed": true, "vehicle/gone": false, "vehicle/keep": true, "deliveryVehicle/new": true])
            let served = try await api.send("/v1/token/vehicle/gone")
            #expect(served.status == 200, "\(served.body)")
            servedToken = try #require(served.json?["token"] as? String)
            #expect(try await issuer.stats().issued == 4)
            // The API follows the reloaded list: the added subject is allowed without a pattern.
            let added = try await api.send("/v1/token/deliveryVehicle/new")
            #expect(added.status == 200, "\(added.body)")
            #expect(try await api.send("/readyz").status == 200)
            let listed = try await runToEnd("tokenctl", ["--db", scratch.file("tokens.sqlite"), "list", "--json"], in: scratch)
            #expect(listed.status == 0)
            let rows = try #require(try JSONSerialization.jsonObject(with: Data(listed.stdout.utf8)) as? [[String: Any]])
            #expect(rows.contains { $0["kind"] as? String == "deliveryVehicle" && $0["id"] as? String == "new" && $0["status"] as? String == "valid" })

            // A bad file: every bad line reported with its number; the list in force stays.
            try "vehicle:keep\nbus:b-1\nvehicle:other # note\ntrip:ok\n".write(toFile: file, atomically: true, encoding: .utf8)
            agent.process.signal(SIGHUP)
            #expect(await agent.process.waitForOutput(#""event":"reload_failed""#, within: 30), "\(agent.process.stderr)")
            let failed = try #require(Self.events(agent.process).last { $0["event"] == "reload_failed" })
            #expect(failed["lines"] == "2,3")
            #expect(failed["error"]?.contains("line 2: unknown kind \"bus\"") == true)
            #expect(failed["error"]?.contains("line 3: a comment must be on its own line") == true)
            #expect(agent.process.stderr.contains("the previous subject list stays in force"))
            #expect(agent.process.stderr.contains("lines=2,3"))
            #expect(try await Self.tracked(api) == ["trip/fixed": true, "vehicle/gone": false, "vehicle/keep": true, "deliveryVehicle/new": true])
            #expect(try await issuer.stats().issued == 4)

            // The flag subject stays even when the file names it and then drops it; a deleted file
            // is a failed reload too.
            try "trip:fixed\nvehicle:keep\ndeliveryVehicle:new\n".write(toFile: file, atomically: true, encoding: .utf8)
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { Self.events(agent.process).filter { $0["event"] == "subjects_reloaded" }.count == 2 })
            try "vehicle:keep\ndeliveryVehicle:new\n".write(toFile: file, atomically: true, encoding: .utf8)
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { Self.events(agent.process).filter { $0["event"] == "subjects_reloaded" }.count == 3 })
            let unchanged: [String: String] = ["event": "subjects_reloaded", "added": "0", "removed": "0", "subjects": "3"]
            #expect(Array(Self.events(agent.process).filter { $0["event"] == "subjects_reloaded" }.dropFirst()) == [unchanged, unchanged])
            #expect(try await Self.tracked(api)["trip/fixed"] == true)
            try FileManager.default.removeItem(atPath: file)
            agent.process.signal(SIGHUP)
            #expect(await eventually(within: 30) { Self.events(agent.process).filter { $0["event"] == "reload_failed" }.count == 2 })
            #expect(try await Self.tracked(api) == ["trip/fixed": true, "vehicle/gone": false, "vehicle/keep": true, "deliveryVehicle/new": true])
        }

        #expect(agent.process.isRunning)
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
        #expect(servedToken.split(separator: ".").count == 3)
        #expect(!(agent.process.stdout + agent.process.stderr).contains(servedToken), "no token value in the agent's output")
    }

    @Test("SIGHUP without --subjects-file logs that there is nothing to reload and the agent goes on")
    func nothingToReload() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1"])
        defer { agent.process.signal(SIGKILL) }
        agent.process.signal(SIGHUP)
        #expect(await agent.process.waitForOutput("nothing to reload", within: 30), "\(agent.process.stderr)")
        agent.process.signal(SIGHUP)
        #expect(await eventually(within: 30) { agent.process.stderr.components(separatedBy: "nothing to reload").count == 3 })
        #expect(agent.process.isRunning)
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("at start: a bad or missing file is a usage error (64) naming the lines; an empty file waits for a reload; --once merges the file with the flags")
    func startUp() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let db = scratch.file("tokens.sqlite")
        let bad = scratch.file("bad.txt")
        try "vehicle:v-1\nbus:1\n\ntrip\n".write(toFile: bad, atomically: true, encoding: .utf8)
        let badRun = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--subjects-file", bad], in: scratch)
        #expect(badRun.status == 64)
        #expect(badRun.stderr.contains("line 2: unknown kind \"bus\"") && badRun.stderr.contains("line 4: write KIND:ID"), "\(badRun.stderr)")
        let missing = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--subjects-file", scratch.file("nope.txt")], in: scratch)
        #expect(missing.status == 64)
        #expect(missing.stderr.contains("no such file"), "\(missing.stderr)")
        #expect(try await issuer.stats().requests == 0)

        let file = scratch.file("subjects.txt")
        try "vehicle:v-1\ntrip:t-1\nvehicle:v-1\n".write(toFile: file, atomically: true, encoding: .utf8)
        let once = try await AgentFixture.run(["--db", db, "--provider-url", issuer.template, "--subjects-file", file,
                                                      "--vehicle", "v-1", "--task", "k-1", "--once", "--json"], in: scratch)
        #expect(once.status == 0, "\(once.stderr)")
        #expect(try onceResults(once.stdout).map { "\($0["kind"]!)/\($0["id"]!)" } == ["vehicle/v-1", "task/k-1", "trip/t-1"])
        #expect(try await issuer.stats().issued == 3)

        // An empty list is allowed while running: subjects come with the first reload.
        let empty = scratch.file("empty.txt")
        try "# filled in later\n".write(toFile: empty, atomically: true, encoding: .utf8)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--subjects-file", empty, "--json"])
        defer { agent.process.signal(SIGKILL) }
        try "vehicle:late\n".write(toFile: empty, atomically: true, encoding: .utf8)
        agent.process.signal(SIGHUP)
        #expect(await eventually(within: 30) { Self.refreshed(agent.process).contains("vehicle/late") }, "\(agent.process.stdout)\(agent.process.stderr)")
        #expect(await agent.stop() == 0)
    }

    // MARK: helpers

    /// The agent's JSON events on stdout.
    static func events(_ process: RunningProcess) -> [[String: String]] {
        process.stdout.split(separator: "\n").compactMap { line in
            (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: String]
        }
    }

    /// `kind/id` of every subject with a `refreshed` or `reused` event, sorted.
    static func refreshed(_ process: RunningProcess) -> [String] {
        Set(events(process).filter { $0["event"] == "refreshed" || $0["event"] == "reused" }
            .compactMap { event in event["kind"].flatMap { kind in event["id"].map { "\(kind)/\($0)" } } }).sorted()
    }

    /// `kind/id` → tracked, from GET /v1/subjects.
    static func tracked(_ api: APIClient) async throws -> [String: Bool] {
        let answer = try await api.send("/v1/subjects")
        #expect(answer.status == 200)
        let list = try #require(try JSONSerialization.jsonObject(with: Data(answer.body.utf8)) as? [[String: Any]])
        return Dictionary(uniqueKeysWithValues: list.map { ("\($0["kind"] ?? "")/\($0["id"] ?? "")", ($0["tracked"] as? NSNumber)?.boolValue ?? false) })
    }
}
