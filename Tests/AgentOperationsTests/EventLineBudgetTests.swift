// token-agent's per-subject event lines on stdout within --max-event-lines (EventLineBudget.swift):
// the budget's rule with plain values, then real agents started on a real issuer with 30
// subjects, whose stdout is read.

import Foundation
import TestSupportKit
import Testing
@testable import token_agent
#if canImport(Glibc)
import Glibc
#endif

@Suite("the event lines' budget: its rule", .paced)
struct EventLineBudgetTests {
    let t0 = Date(timeIntervalSince1970: 1_800_000_000)

    @Test("a window lets the limit through, counts the rest by event, says once when counting starts, and reports the count when it ends")
    func window() {
        var budget = EventLineBudget(limit: 3, window: 30)
        #expect(budget.admit(2, of: "reused", at: t0) == .init(ended: nil, allowed: 2, withholdingUntil: nil))
        #expect(budget.admit(4, of: "reused", at: t0 + 1) == .init(ended: nil, allowed: 1, withholdingUntil: t0 + 30))
        #expect(budget.admit(1, of: "refreshed", at: t0 + 2) == .init(ended: nil, allowed: 0, withholdingUntil: nil))
        #expect(budget.due(at: t0 + 29.9) == nil)
        #expect(budget.due(at: t0 + 31) == .init(counts: ["reused": 3, "refreshed": 1], since: t0, until: t0 + 30))
        // Reported once; the next line starts a new window.
        #expect(budget.due(at: t0 + 40) == nil)
        #expect(budget.admit(3, of: "failed", at: t0 + 100) == .init(ended: nil, allowed: 3, withholdingUntil: nil))
        #expect(budget.admit(1, of: "failed", at: t0 + 101) == .init(ended: nil, allowed: 0, withholdingUntil: t0 + 130))
    }

    @Test("a line after a window that withheld lines ended, before any report, brings that report first")
    func endedByTheNextLine() {
        var budget = EventLineBudget(limit: 1, window: 10)
        _ = budget.admit(3, of: "refreshed", at: t0)
        let next = budget.admit(1, of: "refreshed", at: t0 + 12)
        #expect(next == .init(ended: .init(counts: ["refreshed": 2], since: t0, until: t0 + 10), allowed: 1, withholdingUntil: nil))
        #expect(budget.due(at: t0 + 30) == nil)
    }

    @Test("at exit, what the open window withheld so far is reported, up to the moment of exit")
    func remaining() {
        var budget = EventLineBudget(limit: 2, window: 600)
        #expect(budget.remaining(at: t0) == nil)
        _ = budget.admit(5, of: "reused", at: t0)
        #expect(budget.remaining(at: t0 + 7) == .init(counts: ["reused": 3], since: t0, until: t0 + 7))
        #expect(budget.remaining(at: t0 + 8) == nil)
    }

    @Test("a limit of 0 lets every line through and never reports")
    func unlimited() {
        var budget = EventLineBudget(limit: 0, window: 30)
        #expect(budget.admit(100_000, of: "reused", at: t0) == .init(ended: nil, allowed: 100_000, withholdingUntil: nil))
        #expect(budget.due(at: t0 + 60) == nil)
        #expect(budget.remaining(at: t0 + 60) == nil)
    }
}

@Suite("token-agent's event lines within --max-event-lines", .paced)
struct EventLineBudgetProcessTests {
    @Test("30 subjects, 10 lines a window: a first start prints 10 refreshed lines, says the rest are counted and reports 20 withheld when the window ends; a restart reports its withheld reused lines when stopped; text lines; 0 lets all through")
    func bounded() async throws {
        let scratch = Scratch()
        let issuer = try await IssuerProcess(scratch: scratch)
        let file = scratch.file("subjects.txt")
        try (1...30).map { String(format: "vehicle:v-%02d\n", $0) }.joined().write(toFile: file, atomically: true, encoding: .utf8)
        let common = ["--db", scratch.file("tokens.sqlite"), "--provider-url", issuer.template, "--subjects-file", file]
        // Stopped with SIGTERM once serving: the service group then handles the signal.
        func start(_ arguments: [String]) async throws -> RunningProcess {
            try await AgentFixture.serving(common + arguments + ["--listen", "unix:" + scratch.file("api.sock")],
                                           environment: AgentFixture.noProxy, in: scratch).process
        }

        // First start: every subject fetched within a 10 s window (the issuer is local).
        let first = try await start(["--json", "--max-event-lines", "10", "--event-line-window", "10"])
        defer { first.signal(SIGKILL) }
        #expect(await first.waitForOutput(#""event":"withheld""#, within: 40), "\(first.stdout)\n\(first.stderr)")
        var events = SubjectReloadTests.events(first)
        #expect(events.filter { $0["event"] == "refreshed" }.count == 10, "\(first.stdout)")
        #expect(events.filter { $0["event"] == "withholding" }.map { $0["limit"] } == ["10"])
        let report = try #require(events.first { $0["event"] == "withheld" })
        #expect(report["count"] == "20" && report["refreshed"] == "20" && report["limit"] == "10", "\(report)")
        // Only lines were withheld: every subject was fetched.
        #expect(try await issuer.stats().issued == 30)
        first.signal(SIGTERM)
        #expect(await first.wait(upTo: 30) == 0, "\(first.stderr)")

        // A restart reuses the 30 stored tokens; the window outlasts the run, so the report
        // comes when the agent stops.
        let second = try await start(["--json", "--max-event-lines", "10", "--event-line-window", "600"])
        defer { second.signal(SIGKILL) }
        #expect(await second.waitForOutput(#""event":"withholding""#, within: 30), "\(second.stdout)\n\(second.stderr)")
        second.signal(SIGTERM)
        #expect(await second.wait(upTo: 30) == 0, "\(second.stderr)")
        events = SubjectReloadTests.events(second)
        #expect(events.filter { $0["event"] == "reused" }.count == 10, "\(second.stdout)")
        #expect(events.filter { $0["event"] == "withheld" }.map { [$0["count"], $0["reused"]] } == [["20", "20"]], "\(second.stdout)")
        #expect(try await issuer.stats().issued == 30)

        // Text lines say the same.
        let text = try await start(["--max-event-lines", "5", "--event-line-window", "600"])
        defer { text.signal(SIGKILL) }
        #expect(await text.waitForOutput("the next are counted", within: 30), "\(text.stdout)\n\(text.stderr)")
        text.signal(SIGTERM)
        #expect(await text.wait(upTo: 30) == 0, "\(text.stderr)")
        let lines = text.stdout.split(separator: "\n")
        #expect(lines.filter { $0.split(separator: " ").dropFirst().first == "reused" }.count == 5, "\(text.stdout)")
        #expect(lines.contains { $0.contains("withheld  more than 5 event lines in 600 s: the next are counted, not printed, until ") })
        #expect(lines.contains { $0.contains("withheld  25 event lines from ") && $0.hasSuffix("past --max-event-lines 5: reused 25; tokenctl list shows every subject") },
                "\(text.stdout)")

        // 0: no limit.
        let all = try await start(["--json", "--max-event-lines", "0"])
        defer { all.signal(SIGKILL) }
        #expect(await eventually(within: 30) { SubjectReloadTests.events(all).filter { $0["event"] == "reused" }.count == 30 }, "\(all.stdout)")
        all.signal(SIGTERM)
        #expect(await all.wait(upTo: 30) == 0, "\(all.stderr)")
        #expect(!SubjectReloadTests.events(all).contains { $0["event"] == "withheld" || $0["event"] == "withholding" })
    }
}
