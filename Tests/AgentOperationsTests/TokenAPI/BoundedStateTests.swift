// Issue 26 item 4: nothing a request asks for makes state that outlives the idle rule or the
// caps. Against a real token-agent process and dev-token-server.

import AsyncHTTPClient
import Foundation
import TestSupportKit
import Testing

@Suite("token API: bounded state per request", .paced, .exclusive)
struct BoundedStateTests {
    @Test("invalidating ids the agent does not hold creates nothing: /v1/subjects still lists only what it holds")
    func invalidateUnknownCreatesNothing() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1", "--allow", "trip:*"], logLevel: "notice")
        try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
            for index in 0..<300 {
                let answer = try await api.send("/v1/invalidate/trip/unknown-\(index)", method: .POST)
                #expect(answer.status == 204, "\(answer.body)")
            }
            let subjects = try await api.send("/v1/subjects")
            let list = try #require(try JSONSerialization.jsonObject(with: Data(subjects.body.utf8)) as? [[String: Any]])
            #expect(list.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" } == ["vehicle/v-1"], "\(subjects.body.prefix(300))")
            // A held subject is still invalidated: the next GET fetches anew.
            let before = try await api.send("/v1/token/vehicle/v-1").headers.first(name: "Fleet-Token-Fingerprint")
            #expect(try await api.send("/v1/invalidate/vehicle/v-1", method: .POST).status == 204)
            let after = try await api.send("/v1/token/vehicle/v-1").headers.first(name: "Fleet-Token-Fingerprint")
            #expect(before != nil && after != nil && before != after)
        }
        #expect(try await issuer.stats().issued == 2, "the unknown ids were never fetched")
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
    }

    @Test("--max-dynamic-subjects caps pattern-allowed subjects (503 with Retry-After); configured and held ones are still served")
    func dynamicSubjectCap() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let agent = try await APIAgent.start(scratch, provider: issuer.template, ["--vehicle", "v-1", "--allow", "trip:*", "--max-dynamic-subjects", "3"],
                                             logLevel: "notice")
        try await withAPIClient { client in
            let api = APIClient.unix(agent.socket, client)
            #expect(try await eventually(within: 60) { try await api.send("/readyz").status == 200 })
            for index in 1...3 { #expect(try await api.send("/v1/token/trip/t-\(index)").status == 200) }
            let refused = try await api.send("/v1/token/trip/t-4")
            #expect(refused.status == 503)
            #expect(refused.headers.first(name: "Retry-After").flatMap(Int.init) ?? 0 > 0)
            #expect(refused.body.contains("--max-dynamic-subjects"), "\(refused.body)")
            #expect(try await api.send("/v1/token/trip/t-2").status == 200, "a held one is served")
            #expect(try await api.send("/v1/token/vehicle/v-1").status == 200, "a configured one is served")
            // Paging: 4 subjects, two at a time, following the Link header.
            var seen: [String] = []
            var path: String? = "/v1/subjects?limit=3"
            var pages = 0
            while let next = path, pages < 5 {
                let page = try await api.send(next)
                #expect(page.status == 200, "\(page.body)")
                let list = try #require(try JSONSerialization.jsonObject(with: Data(page.body.utf8)) as? [[String: Any]])
                seen += list.map { "\($0["kind"] ?? "")/\($0["id"] ?? "")" }
                path = page.headers.first(name: "Link").flatMap { link in
                    link.range(of: #"<[^>]+>"#, options: .regularExpression).map { String(link[$0].dropFirst().dropLast()) }
                }
                pages += 1
            }
            #expect(seen == ["trip/t-1", "trip/t-2", "trip/t-3", "vehicle/v-1"])
            #expect(pages == 2)
            #expect(try await api.send("/v1/subjects?limit=0").status == 400)
            #expect(try await api.send("/v1/subjects?after=bus/x").status == 400)
        }
        #expect(await agent.stop() == 0, "\(agent.process.stderr)")
        let usage = try await AgentFixture.run(["--db", scratch.file("u.sqlite"), "--provider-url", issuer.template, "--vehicle", "v",
                                                       "--max-dynamic-subjects", "0"], in: scratch, timeout: 30)
        #expect(usage.status == 64 && usage.stderr.contains("--max-dynamic-subjects"), "\(usage.stderr)")
    }
}
