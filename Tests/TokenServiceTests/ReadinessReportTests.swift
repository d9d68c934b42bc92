@testable import FleetTokenService
import FleetTokenStore
import Testing

@Suite("ReadinessReport: what /readyz says (pure)", .paced)
struct ReadinessReportTests {
    func vehicles(_ count: Int) throws -> [TokenKey] { try (1...count).map { try TokenKey.vehicle("v-\($0)") } }

    @Test("ready only with a writable store and no subject left without a usable token")
    func ready() throws {
        #expect(ReadinessReport(storeProblem: nil, namesSubjects: true).isReady)
        let store = ReadinessReport(storeProblem: "disk I/O error", namesSubjects: true)
        #expect(!store.isReady && store.reasons == ["the store cannot be written: disk I/O error"])
        var subject = ReadinessReport(storeProblem: nil, namesSubjects: true)
        subject.addUnusable(try TokenKey.vehicle("v-1")) { ": last error timeout" }
        #expect(!subject.isReady && subject.reasons == ["vehicle/v-1 has no usable token: last error timeout"])
    }

    @Test("at most 10 subjects are named, in order, the others counted; a cause is built only for those named")
    func bounded() throws {
        var report = ReadinessReport(storeProblem: "locked", namesSubjects: true)
        var causesBuilt = 0
        for key in try vehicles(100_000) { report.addUnusable(key) { causesBuilt += 1; return "" } }
        #expect(causesBuilt == ReadinessReport.namedLimit)
        #expect(report.reasons.count == 1 + 10 + 1)
        #expect(report.reasons.first == "the store cannot be written: locked")
        #expect(Array(report.reasons[1...10]) == (1...10).map { "vehicle/v-\($0) has no usable token" })
        #expect(report.reasons.last == "and 99990 more configured subjects have no usable token (see /v1/subjects, or the agent's log)")
        var eleven = ReadinessReport(storeProblem: nil, namesSubjects: true)
        for key in try vehicles(11) { eleven.addUnusable(key) { "" } }
        #expect(eleven.reasons.last == "and 1 more configured subject has no usable token (see /v1/subjects, or the agent's log)")
    }

    @Test("with client rules no subject is named, only counted")
    func counted() throws {
        var report = ReadinessReport(storeProblem: nil, namesSubjects: false)
        for key in try vehicles(3) { report.addUnusable(key) { Issue.record("a cause built for a subject not named"); return "" } }
        #expect(report.reasons == ["3 configured subjects have no usable token (see /v1/subjects, or the agent's log)"])
        #expect(!report.reasons.joined().contains("v-1"))
    }
}
