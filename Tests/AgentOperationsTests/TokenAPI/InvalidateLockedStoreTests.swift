// Issue 27 item 4 through the real token-agent: POST /v1/invalidate answers at once while
// another process holds the store's write lock, and the invalidated tokens leave the store once
// the lock is gone; invalidations of subjects the agent does not hold cannot grow its memory
// without bound meanwhile.

import AsyncHTTPClient
import Foundation
import NIOHTTP1
import TestSupportKit
import Testing

@Suite("token-agent's invalidate while another process holds the store's write lock", .paced, .exclusive)
struct InvalidateLockedStoreTests {
    @Test("POST /v1/invalidate answers 204 within 2 s while sqlite3 holds BEGIN IMMEDIATE for 40 s with a commit pending; GET serves a new token at once; afterwards the store holds neither invalidated token")
    func invalidateWhileLocked() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1", "--vehicle", "v-2"])
        let db = scratch.file("tokens.sqlite")
        let stored = { (id: String) -> String in
            (try? sqlite3(db, "SELECT token FROM tokens WHERE kind = 'vehicle' AND subject_id = '\(id)'", readOnly: true)) ?? ""
        }
        try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            let fingerprint = { (id: String) async throws -> String? in
                try await api.send("/v1/token/vehicle/\(id)").headers.first(name: "Fleet-Token-Fingerprint")
            }
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
            #expect(await eventually(within: 60) { !stored("v-1").isEmpty && !stored("v-2").isEmpty })
            let rejected = ["v-1": stored("v-1"), "v-2": stored("v-2")]
            let servedBefore = ["v-1": try await fingerprint("v-1"), "v-2": try await fingerprint("v-2")]

            let (shell, released) = try await Self.lock(db, forSeconds: 40, in: scratch)

            // v-2 first: the agent refetches it (configured) and its commit then waits for the lock.
            // Each GET takes seconds: the fetch's lease, a write, waits out the agent's busy
            // timeout (5 s), queued behind the commit's attempts; hence the long lock.
            for id in ["v-2", "v-1"] {
                let started = ContinuousClock.now
                let answer = try await api.send("/v1/invalidate/vehicle/\(id)", method: .POST)
                let took = ContinuousClock.now - started
                #expect(answer.status == 204, "\(answer.body)")
                // Below the agent's busy timeout (5 s), which a write behind the lock would wait out.
                #expect(took < .seconds(4), "POST /v1/invalidate/vehicle/\(id) took \(took) while another process held the store's write lock")
                let renewed = try await fingerprint(id)
                #expect(renewed != nil && renewed != servedBefore[id], "\(id): the invalidated token is still served")
            }
            #expect(!FileManager.default.fileExists(atPath: released), "the lock was let go before the invalidations were checked")

            #expect(await eventually(within: 60) { FileManager.default.fileExists(atPath: released) })
            #expect(await shell.wait(upTo: 10) == 0, "sqlite3: \(shell.stderr)")
            let replaced = await eventually(within: 60) { stored("v-1") != rejected["v-1"] && stored("v-2") != rejected["v-2"] }
            #expect(replaced, "an invalidated token is still in the store after the lock was let go")
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    @Test("while the store takes no writes, invalidations of subjects the agent does not hold are taken up to --max-dynamic-subjects, then answered 503 with Retry-After; held subjects are still invalidated; once the store takes writes again, so are new ones")
    func unheldInvalidationsBounded() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template,
                                             ["--vehicle", "v-1", "--allow", "trip:*", "--max-dynamic-subjects", "5"])
        let db = scratch.file("tokens.sqlite")
        try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })

            let (shell, released) = try await Self.lock(db, forSeconds: 15, in: scratch)

            var statuses: [Int] = []
            for index in 0..<8 {
                let answer = try await api.send("/v1/invalidate/trip/made-up-\(index)", method: .POST)
                statuses.append(answer.status)
                if answer.status == 503 {
                    #expect(answer.headers.first(name: "Retry-After") == "10", "\(answer.headers)")
                    #expect(answer.body.contains("waiting for the store"), "\(answer.body)")
                }
            }
            #expect(statuses == [204, 204, 204, 204, 204, 503, 503, 503], "\(statuses)")
            // A subject the agent holds is invalidated as ever.
            let held = try await api.send("/v1/invalidate/vehicle/v-1", method: .POST)
            #expect(held.status == 204, "\(held.body)")
            #expect(!FileManager.default.fileExists(atPath: released), "the lock was let go before the invalidations were checked")

            #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: released) })
            #expect(await shell.wait(upTo: 10) == 0, "sqlite3: \(shell.stderr)")
            // The removals reach the store; then the refused subjects are taken too.
            let taken = try await eventually(within: 60) {
                try await api.send("/v1/invalidate/trip/made-up-6", method: .POST).status == 204
            }
            #expect(taken, "\(agent.process.stderr.suffix(2000))")
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr.suffix(2000))")
    }

    /// sqlite3 holding the store's write lock (`BEGIN IMMEDIATE`) for `seconds`, once it holds
    /// it; `released` exists once it let go.
    static func lock(_ db: String, forSeconds seconds: Int, in scratch: Scratch) async throws -> (shell: RunningProcess, released: String) {
        let locked = scratch.file("locked"), released = scratch.file("released")
        let shell = try RunningProcess(sqlite3Path, [
            db, ".timeout 5000", "BEGIN IMMEDIATE;", ".shell touch \(locked)", ".shell sleep \(seconds)", "COMMIT;",
            ".shell touch \(released)",
        ], in: scratch)
        #expect(await eventually(within: 30) { FileManager.default.fileExists(atPath: locked) })
        return (shell, released)
    }
}
