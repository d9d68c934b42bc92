// One page of the subjects listing (SubjectPage): the first `limit` distinct keys after a
// bound, in key order, of keys offered in any order and some twice, exactly what sorting the
// union and taking a prefix gives. Plain values.

import Testing
@testable import FleetTokenStore

@Suite("A page of the subjects listing", .paced)
struct SubjectPageTests {
    /// Keys of three kinds, ids that sort differently as text and as numbers.
    static let keys: [TokenKey] = (0..<600).map { index in
        let id = "s\(index * 7919 % 1000)"
        switch index % 3 {
        case 0: return try! TokenKey.vehicle(id)
        case 1: return try! TokenKey.trip(id)
        default: return try! TokenKey.deliveryVehicle(id)
        }
    }

    /// What the listing did before: the union sorted whole, filtered, a prefix.
    func expected(_ offered: [TokenKey], after: TokenKey?, limit: Int, included: (TokenKey) -> Bool) -> [TokenKey] {
        Array(Set(offered).filter { key in after.map { $0 < key } ?? true && included(key) }.sorted().prefix(max(0, limit)))
    }

    @Test("every page, walked from the start with a Link-style cursor, equals the sorted union's", arguments: [1, 7, 100, 1_000])
    func walk(limit: Int) {
        // Memory's keys, then the tracked ones: a third of them twice, in another order.
        var generator = SystemRandomNumberGenerator()
        let offered = Self.keys.shuffled(using: &generator) + Self.keys.filter { $0.subjectID.hasSuffix("1") }.shuffled(using: &generator)
        let included: (TokenKey) -> Bool = { !$0.subjectID.hasSuffix("5") }
        var after: TokenKey?
        var listed: [TokenKey] = []
        for _ in 0...600 {
            var page = SubjectPage(after: after, limit: limit)
            for key in offered { page.offer(key, if: included) }
            #expect(page.keys == expected(offered, after: after, limit: limit, included: included))
            listed += page.keys
            guard page.keys.count == limit, let last = page.keys.last else { break }
            after = last
        }
        #expect(listed == expected(offered, after: nil, limit: .max, included: included), "the pages together list every included key once, in order")
    }

    @Test("edges: no room, nothing after the bound, a page larger than the keys, and included asked only of keys that make the page")
    func edges() throws {
        var empty = SubjectPage(after: nil, limit: 0)
        for key in Self.keys { empty.offer(key) }
        #expect(empty.keys.isEmpty)

        let last = try #require(Self.keys.max())
        var beyond = SubjectPage(after: last, limit: 10)
        for key in Self.keys { beyond.offer(key) }
        #expect(beyond.keys.isEmpty)

        var all = SubjectPage(after: nil, limit: 10_000)
        for key in Self.keys + Self.keys { all.offer(key) }
        #expect(all.keys == Set(Self.keys).sorted())

        // Offered in order, once the page is full no later key is asked about.
        var asked = 0
        var first = SubjectPage(after: nil, limit: 5)
        for key in Set(Self.keys).sorted() { first.offer(key) { _ in asked += 1; return true } }
        #expect(asked == 5 && first.keys == Array(Set(Self.keys).sorted().prefix(5)))
    }
}
