// Issue 27 item 8: when the retention sweep runs, decided from plain values.

import Foundation
import Testing
@testable import FleetTokenStore

@Suite("When the retention sweep runs", .paced)
struct RetentionScheduleTests {
    let now = Date(timeIntervalSince1970: 1_800_000_000)

    @Test("no sweep yet: at once when the earliest row is already eligible, else when it becomes eligible")
    func firstSweep() {
        let schedule = RetentionSchedule(retention: 90)
        #expect(schedule.nextSweep(earliestEligible: now - 500, lastSweep: nil, started: now, now: now) == now)
        #expect(schedule.nextSweep(earliestEligible: now + 85, lastSweep: nil, started: now, now: now) == now + 85)
        // Nothing known (an empty store, or one that cannot say): the longest interval after
        // the start, however often the store is asked again meanwhile.
        #expect(schedule.nextSweep(earliestEligible: nil, lastSweep: nil, started: now, now: now) == now + 3600)
        #expect(schedule.nextSweep(earliestEligible: nil, lastSweep: nil, started: now - 3000, now: now) == now + 600)
        #expect(schedule.nextSweep(earliestEligible: nil, lastSweep: nil, started: now - 3600, now: now) <= now)
    }

    @Test("sweeps are at least a minute apart, however short the retention or early the row")
    func minimumInterval() {
        let schedule = RetentionSchedule(retention: 5)
        let last = now - 10
        #expect(schedule.nextSweep(earliestEligible: now - 3, lastSweep: last, started: last - 5, now: now) == last + 60)
        #expect(schedule.nextSweep(earliestEligible: last + 61, lastSweep: last, started: last - 5, now: now) == last + 61)
    }

    @Test("sweeps are at most an hour apart, however late the earliest row")
    func maximumInterval() {
        let schedule = RetentionSchedule(retention: 86_400)
        let last = now - 100
        #expect(schedule.nextSweep(earliestEligible: now + 86_000, lastSweep: last, started: last - 5, now: now) == last + 3600)
        #expect(schedule.nextSweep(earliestEligible: nil, lastSweep: last, started: last - 5, now: now) == last + 3600)
        #expect(schedule.nextSweep(earliestEligible: last + 1800, lastSweep: last, started: last - 5, now: now) == last + 1800)
    }

    @Test("a sweep due in the past is due now (a time not after now)")
    func overdue() {
        let schedule = RetentionSchedule(retention: 90)
        let last = now - 7200
        #expect(schedule.nextSweep(earliestEligible: now - 10, lastSweep: last, started: last - 5, now: now) <= now)
        #expect(schedule.nextSweep(earliestEligible: nil, lastSweep: last, started: last - 5, now: now) <= now)
    }

    @Test("the store is asked again as often as the retention, within a minute and an hour, so no row written after a look is found late")
    func recheck() {
        #expect(RetentionSchedule(retention: 5).recheckInterval == 60)
        #expect(RetentionSchedule(retention: 90).recheckInterval == 90)
        #expect(RetentionSchedule(retention: 86_400).recheckInterval == 3600)
    }
}
