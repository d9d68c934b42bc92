// Issue 26: the token API's edge rules as pure values: the normal form of a request target,
// loopback hosts, and byte-for-byte glob matching.

@testable import FleetTokenService
import FleetTokenStore
import NIOHTTP1
import Testing

@Suite("Edge rules (pure): request targets, loopback hosts, byte-for-byte patterns", .paced)
struct EdgeRuleTests {
    @Test("targets in normal form pass", arguments: [
        "/", "/healthz", "/v1/token/vehicle/truck-7", "/v1/token/trip/T%E2%84%AA-9", "/v1/token/vehicle/fleet-a%2Ftruck-7",
        "/v1/subjects?limit=10&after=vehicle/v-1", "/v1/token/vehicle/a.b", "/v1/token/vehicle/..v",
        "/v1/token/vehicle/...", "/v1/token/vehicle/v?a//b/../%zz", "/?", "/v1/token/vehicle/%2f%3A",
    ])
    func normal(target: String) {
        #expect(RequestTarget.problem(target) == nil, "\(target)")
    }

    @Test("targets not in normal form are refused", arguments: [
        "//v1/token/vehicle/v", "/v1//token/vehicle/v", "/./v1/token/vehicle/v", "/v1/token/vehicle/v/", "/v1/../v1/token/vehicle/v",
        "/v1/token/vehicle/..", "/v1/%74oken/vehicle/v", "/v1/token/vehicle/%2E%2E", "/v1/token/vehicle/%zz", "/v1/token/vehicle/%4",
        "v1/token/vehicle/v", "*", "", "http://localhost//v1/token/vehicle/v", "/v1\\token", "//",
        "/v1/token/vehicle/%4/x", "/v1/token/vehicle/%2/", "/v1/token/vehicle/v%2?q", "/v1/token/vehicle/.?q", "/v1/token/%41b",
        "/v1/token/vehicle/v/?q", "?/v1", "/v1/token/vehicle/a\\b?q",
    ])
    func abnormal(target: String) {
        #expect(RequestTarget.problem(target) != nil, "\(target)")
    }

    @Test("an absolute-form target is split into the authority that names the server and an origin-form target; other forms are not", arguments: [
        ("http://127.0.0.1:8787/v1/token/vehicle/v?x=1", "127.0.0.1:8787", "/v1/token/vehicle/v?x=1"),
        ("HTTPS://rebind.attacker.example/v1/subjects", "rebind.attacker.example", "/v1/subjects"),
        ("http://localhost", "localhost", "/"), ("http://localhost?q", "localhost", "/?q"),
        ("http://[::1]:8787//v1/token/vehicle/v", "[::1]:8787", "//v1/token/vehicle/v"),
    ])
    func absoluteForm(target: String, authority: String, originForm: String) {
        let split = RequestTarget.absoluteForm(target)
        #expect(split?.authority == authority && split?.originForm == originForm, "\(target): \(String(describing: split))")
    }

    @Test("targets in other forms are not split", arguments: ["/v1/token/vehicle/v", "/http://x/y", "*", "localhost:8787", "ftp://h/x", "", "v1/token"])
    func notAbsoluteForm(target: String) {
        #expect(RequestTarget.absoluteForm(target) == nil, "\(target)")
    }

    @Test("a request with an absolute-form target gets its authority as Host and an origin-form target; with two Host headers Host is left for the rule to refuse")
    func absoluteFormHead() {
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: "http://rebind.attacker.example/v1/token/vehicle/v")
        head.headers.add(name: "Host", value: "127.0.0.1:8787")
        let named = AbsoluteFormTargetHandler.named(head)
        #expect(named?.uri == "/v1/token/vehicle/v" && named?.headers["host"] == ["rebind.attacker.example"])
        head.headers.add(name: "host", value: "localhost")
        #expect(AbsoluteFormTargetHandler.named(head)?.headers["host"] == ["127.0.0.1:8787", "localhost"])
        #expect(AbsoluteFormTargetHandler.named(HTTPRequestHead(version: .http1_1, method: .GET, uri: "/v1/token/vehicle/v")) == nil)
    }

    @Test("loopback is parsed: names that merely begin like an address are not", arguments: [
        ("localhost", true), ("LocalHost", true), ("127.0.0.1", true), ("127.255.3.4", true), ("::1", true), ("0:0:0:0:0:0:0:1", true),
        ("127.attacker.example", false), ("127.0.0.1.nip.io", false), ("localhost.attacker.example", false), ("128.0.0.1", false),
        ("::2", false), ("::", false), ("127.1", false), ("", false), ("0x7f.0.0.1", false),
    ])
    func loopback(host: String, expected: Bool) {
        #expect(LoopbackHost.isLoopback(host) == expected, "\(host)")
    }

    @Test("Host headers: a loopback host with or without a port, or the listener's own host", arguments: [
        ("localhost", "127.0.0.1", true), ("localhost:8787", "127.0.0.1", true), ("[::1]:8787", "127.0.0.1", true),
        ("127.0.0.1", "127.0.0.1", true), ("rebind.attacker.example:8787", "127.0.0.1", false), ("localhost:", "127.0.0.1", false),
        ("localhost:80:80", "127.0.0.1", false), ("[::1", "127.0.0.1", false), ("", "127.0.0.1", false),
        ("10.1.2.3:8787", "10.1.2.3", true), ("10.1.2.4:8787", "10.1.2.3", false), ("::1", "127.0.0.1", false),
        ("LOCALHOST:1", "127.0.0.1", true), ("localhost:123456", "127.0.0.1", false), ("localhost:12a", "127.0.0.1", false),
        ("localhost:\u{FF11}", "127.0.0.1", false), ("[::1]", "127.0.0.1", true), ("[::1]x", "127.0.0.1", false),
    ])
    func hostHeader(value: String, listen: String, expected: Bool) {
        #expect(LoopbackHost.isAllowedHostHeader(value, listenHost: listen) == expected, "\(value)")
    }

    @Test("patterns match ids byte for byte: a glob of ASCII K does not admit the Kelvin sign")
    func patternBytes() throws {
        let pattern = try SubjectAllowList.Pattern(parsing: "trip:T-K-*")
        #expect(pattern.matches(try .trip("T-K-9")))
        #expect(!pattern.matches(try .trip("T-\u{212A}-9")))
        let accent = try SubjectAllowList.Pattern(parsing: "vehicle:zo\u{00EB}*")
        #expect(accent.matches(try .vehicle("zo\u{00EB}-1")))
        #expect(!accent.matches(try .vehicle("zoe\u{0308}-1")))
        let middle = try SubjectAllowList.Pattern(parsing: "vehicle:*\u{00EB}*x")
        #expect(middle.matches(try .vehicle("a\u{00EB}bx")))
        #expect(!middle.matches(try .vehicle("ae\u{0308}bx")))
        let allowList = SubjectAllowList(subjects: [try .trip("T-K-9")])
        #expect(!allowList.allows(try .trip("T-\u{212A}-9")))
    }
}
