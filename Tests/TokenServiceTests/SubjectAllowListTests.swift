@testable import FleetTokenService
import FleetTokenStore
import Foundation
import NIOCore
import Testing

@Suite("SubjectAllowList and InvalidationLimiter (pure)", .paced)
struct SubjectAllowListTests {
    @Test("patterns match the whole id with * as any run; configured subjects always pass", arguments: [
        ("trip:*", "trip", "t-1", true),
        ("trip:*", "vehicle", "t-1", false),
        ("vehicle:truck-*", "vehicle", "truck-7", true),
        ("vehicle:truck-*", "vehicle", "truck-", true),
        ("vehicle:truck-*", "vehicle", "a-truck-7", false),
        ("vehicle:*-7", "vehicle", "truck-7", true),
        ("vehicle:*-7", "vehicle", "truck-77", false),
        ("vehicle:a*b*c", "vehicle", "abc", true),
        ("vehicle:a*b*c", "vehicle", "aXbYc", true),
        ("vehicle:a*b*c", "vehicle", "acb", false),
        ("vehicle:ab*ba", "vehicle", "aba", false),
        ("vehicle:exact", "vehicle", "exact", true),
        ("vehicle:exact", "vehicle", "exactly", false),
        ("task:?[x]*", "task", "?[x]1", true),
        ("deliveryVehicle:van-*", "deliveryVehicle", "van-12", true),
    ])
    func patterns(pattern: String, kind: String, id: String, expected: Bool) throws {
        let list = SubjectAllowList(patterns: [try .init(parsing: pattern)])
        let key = try TokenKey(kind: TokenKind(rawValue: kind)!, subjectID: id)
        #expect(list.allows(key) == expected)
    }

    @Test("configured subjects pass without a pattern; others do not")
    func configured() throws {
        let list = SubjectAllowList(subjects: [try .vehicle("v-1")])
        #expect(list.allows(try .vehicle("v-1")))
        #expect(!list.allows(try .vehicle("v-2")))
        #expect(!list.allows(try .trip("v-1")))
    }

    @Test("bad patterns say how to write one", arguments: [
        ("trip", "KIND:GLOB", SubjectPatternError.Code.invalidForm), ("bus:*", "unknown kind", .unknownKind),
        ("trip:", "empty", .emptyIDPattern),
    ])
    func badPatterns(pattern: String, message: String, code: SubjectPatternError.Code) {
        #expect(throws: SubjectPatternError.self) { try SubjectAllowList.Pattern(parsing: pattern) }
        do { _ = try SubjectAllowList.Pattern(parsing: pattern) } catch {
            #expect(error.description.contains(message))
            #expect(error.code == code && error.pattern == pattern)
        }
    }

    @Test("bad listen addresses have a code and say what to write, naming no flag (token-agent adds its own)", arguments: [
        ("unix:", TokenAPIError.Code.invalidAddress, "socket's path"), ("localhost", .invalidAddress, "unix:PATH or HOST:PORT"),
        ("0.0.0.0:8080", .nonLoopbackAddress, "loopback only"),
    ])
    func badListenAddresses(text: String, code: TokenAPIError.Code, message: String) {
        let error = #expect(throws: TokenAPIError.self) { try ListenAddress(parsing: text) }
        #expect(error?.code == code && error?.address == text, "\(String(describing: error))")
        #expect(error?.description.contains(message) == true, "\(String(describing: error))")
        #expect(error?.description.contains("--") == false && error?.description.contains("token-agent") == false)
    }

    @Test("one invalidation per key per interval, on the monotonic clock")
    func limiter() throws {
        let limiter = InvalidationLimiter(interval: 10)
        let start = ContinuousClock.now
        let a = try TokenKey.vehicle("a"), b = try TokenKey.vehicle("b")
        #expect(limiter.admit(a, now: start) == .allowed)
        #expect(limiter.admit(b, now: start) == .allowed)
        #expect(limiter.admit(a, now: start + .seconds(4)) == .limited(retryAfter: 6))
        #expect(limiter.admit(a, now: start + .seconds(10)) == .allowed)
        #expect(limiter.admit(a, now: start + .seconds(19.5)) == .limited(retryAfter: 0.5))
    }

    // Issue 26 item 4: the limiter forgets what the interval no longer covers, a few entries
    // per call, instead of re-filtering its whole table past a size.
    @Test("the limiter's table holds only the last interval's keys, however many passed through")
    func limiterBound() throws {
        let limiter = InvalidationLimiter(interval: 10)
        let start = ContinuousClock.now
        for index in 0..<30_000 { #expect(limiter.admit(try .vehicle("old-\(index)"), now: start + .milliseconds(index / 10)) == .allowed) }
        #expect(limiter.rememberedCount == 30_000)
        let later = start + .seconds(20)
        for index in 0..<20_000 { _ = limiter.admit(try .vehicle("new-\(index)"), now: later + .milliseconds(index / 10)) }
        #expect(limiter.rememberedCount == 20_000, "every old key dropped, two per call")
        // Without further invalidations, the other routes' sweeps forget them all.
        for _ in 0..<400 { limiter.sweep(now: later + .seconds(30)) }
        #expect(limiter.rememberedCount == 0, "a burst is forgotten by sweeps alone")
        #expect(limiter.admit(try .vehicle("new-5"), now: later + .seconds(31)) == .allowed)
        // Still one per key per interval after the clean-up.
        #expect(limiter.admit(try .vehicle("new-5"), now: later + .seconds(35)) == .limited(retryAfter: 6))
        #expect(limiter.admit(try .vehicle("old-5"), now: later + .seconds(35)) == .allowed)
    }

    // Found with heaptrack on the bounded-state benchmark: 2.6 MiB of the limiter's tables were
    // still allocated after the burst was forgotten. The storage went back only when the last
    // compaction left more than 1,024 entries; with sweeps of 64, 3,000 invalidations end with
    // 376, and the emptied tables kept the capacity of the whole burst.
    @Test("a forgotten burst gives the limiter's storage back, whatever the burst's size", arguments: [1_500, 3_000, 20_000, 30_000])
    func limiterGivesStorageBack(burst: Int) throws {
        let limiter = InvalidationLimiter(interval: 10)
        let start = ContinuousClock.now
        for index in 0..<burst { _ = limiter.admit(try .vehicle("u-\(index)"), now: start) }
        #expect(limiter.storageCapacity >= burst)
        for _ in 0..<(burst / 64 + 2) { limiter.sweep(now: start + .seconds(11)) }
        #expect(limiter.rememberedCount == 0)
        #expect(limiter.storageCapacity <= 1_024, "the emptied tables keep room for \(limiter.storageCapacity) entries")
        // Through the once-a-second sweep's budget as well.
        for index in 0..<burst { _ = limiter.admit(try .vehicle("v-\(index)"), now: start + .seconds(20)) }
        for _ in 0..<(burst / 4096 + 2) { limiter.sweep(now: start + .seconds(31), budget: 4096) }
        #expect(limiter.storageCapacity <= 1_024, "the emptied tables keep room for \(limiter.storageCapacity) entries")
    }

    @Test("the token route's hand-written JSON strings and timestamps read back as Foundation's", arguments: [
        "truck-7", #"a"b\c"#, "é ü 🚚", "tab\there", "nul\u{1}x", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln", "/slash/",
    ])
    func jsonText(text: String) throws {
        let decoded = try JSONSerialization.jsonObject(with: Data(("[" + JSONText.quoted(text) + "]").utf8)) as? [String]
        #expect(decoded == [text])
    }

    @Test("timestamps match ISO8601FormatStyle", arguments: [0.0, 1_795_438_377, 1_795_438_377.999, 4_102_444_800])
    func timestamps(seconds: Double) {
        let date = Date(timeIntervalSince1970: seconds)
        #expect(TokenAPI.timestamp(date) == date.formatted(.iso8601))
    }

    @Test("the token route's timestamps written into its buffer read as timestamp(_:) writes them", arguments: [
        0.0, 1_795_438_377, 1_795_438_377.999, 4_102_444_800, -30_610_224_000, 253_402_300_799, 253_402_300_800, -62_135_596_800,
    ])
    func bufferTimestamps(seconds: Double) {
        let date = Date(timeIntervalSince1970: seconds)
        var buffer = ByteBuffer()
        TokenAPI.writeTimestamp(date, to: &buffer)
        #expect(String(buffer: buffer) == TokenAPI.timestamp(date))
    }

    @Test("the buffer's timestamps agree with the C library's calendar over the years 1000 to 9999")
    func bufferTimestampsAcrossYears() {
        var generator = SystemRandomNumberGenerator()
        var instants: [Double] = [-30_610_224_000, -30_610_223_999, -1, 0, 1, 86_399, 86_400, 951_782_400, 951_868_799, 4_107_542_400]
        instants += (0..<20_000).map { _ in Double(Int.random(in: -30_610_224_000...253_402_300_799, using: &generator)) }
        for seconds in instants {
            let date = Date(timeIntervalSince1970: seconds)
            var buffer = ByteBuffer()
            TokenAPI.writeTimestamp(date, to: &buffer)
            let expected = TokenAPI.calendarTimestamp(date)
            if String(buffer: buffer) != expected {
                Issue.record("\(seconds): \(String(buffer: buffer)) against \(expected)")
                return
            }
        }
    }

    // The check for what needs escaping reads eight bytes at a time: a byte to escape is found
    // in every position of a word and in the tail after the last whole word.
    @Test("a byte to escape is escaped wherever it stands; a text with none is copied as it is", arguments: [
        "\u{0}", "\u{1F}", "\"", "\\", "\n",
    ])
    func escapesAtEveryPosition(special: String) throws {
        for before in 0..<18 {
            for after in [0, 1, 7, 8, 9] {
                let text = String(repeating: "a", count: before) + special + String(repeating: "z", count: after)
                var buffer = ByteBuffer()
                JSONText.writeQuoted(text, to: &buffer)
                #expect(String(buffer: buffer) == JSONText.quoted(text))
                #expect(JSONText.quoted(text) != "\"" + text + "\"", "\(before) \(after): the special byte was not escaped")
                let decoded = try JSONSerialization.jsonObject(with: Data(("[" + JSONText.quoted(text) + "]").utf8)) as? [String]
                #expect(decoded == [text])
            }
        }
        // Plain bytes next to the special ones (0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7F, and UTF-8's high bytes).
        let plain = " !#[]\u{7F}é🚚" + String(repeating: "eyJhbGciOiJSUzI1NiJ9.", count: 3)
        for length in 0...plain.count {
            let text = String(plain.prefix(length))
            var buffer = ByteBuffer()
            JSONText.writeQuoted(text, to: &buffer)
            #expect(String(buffer: buffer) == "\"" + text + "\"")
        }
    }
}
