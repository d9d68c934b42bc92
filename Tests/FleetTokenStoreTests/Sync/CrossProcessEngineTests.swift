import Foundation
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Processes sharing one store", .paced)
struct CrossProcessEngineTests {
    @Test("two processes asking for the same missing key at once fetch it once between them")
    func twoProcessesOneFetch() async throws {
        let dir = Scratch()
        let store = dir.file("tokens.sqlite")
        let fetchLog = dir.file("fetches.log")
        try #require(FileManager.default.createFile(atPath: fetchLog, contents: nil))
        try openStore(store).close() // created and migrated once, so neither probe races on it
        let probe = productsDirectory.appendingPathComponent("token-engine-probe").path
        #expect(FileManager.default.isExecutableFile(atPath: probe))

        async let first = runCapturing([probe, store, "vehicle", "shared-1", fetchLog, "15000"], timeout: 60)
        // The second starts once the first's fetch has begun; the first holds it for 15 s, so the
        // second meets its lease even when starting a process takes seconds on a loaded machine.
        #expect(await eventually(within: 60) {
            ((try? String(contentsOfFile: fetchLog, encoding: .utf8)) ?? "").contains("shared-1")
        })
        async let second = runCapturing([probe, store, "vehicle", "shared-1", fetchLog, "15000"], timeout: 60)
        let (a, b) = try await (first, second)
        #expect(a.status == 0, "\(a.stderr)")
        #expect(b.status == 0, "\(b.stderr)")
        let fetches = try String(contentsOfFile: fetchLog, encoding: .utf8).split(separator: "\n")
        #expect(fetches.count == 1, "fetch log: \(fetches)")
        // Both print the same token fingerprint; the second got it from the first via the store.
        let fingerprints = [a.stdout, b.stdout].map { $0.split(separator: " ").first.map(String.init) }
        #expect(fingerprints[0] != nil && fingerprints[0] == fingerprints[1])
        #expect(b.stdout.contains("other_process"))
    }

    @Test("six processes opening a store that does not exist yet, at once, all open it (20 rounds)")
    func concurrentFirstOpens() async throws {
        let probe = productsDirectory.appendingPathComponent("token-engine-probe").path
        for round in 0..<20 {
            let dir = Scratch()
            let store = dir.file("tokens.sqlite")
            let fetchLog = dir.file("fetches.log")
            try #require(FileManager.default.createFile(atPath: fetchLog, contents: nil))
            let results = try await withThrowingTaskGroup(of: (status: Int32, stdout: String, stderr: String).self) { group in
                for index in 0..<6 {
                    group.addTask { try await runCapturing([probe, store, "vehicle", "v\(index)", fetchLog, "10"], timeout: 60) }
                }
                return try await group.reduce(into: []) { $0.append($1) }
            }
            for result in results {
                #expect(result.status == 0, "round \(round): \(result.stderr)")
            }
            #expect(try await sqlite3(store, "SELECT count(*) FROM tokens") == "6", "round \(round)")
        }
    }
}
