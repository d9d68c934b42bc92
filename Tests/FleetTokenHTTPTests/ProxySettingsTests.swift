import Foundation
import Testing
@testable import FleetTokenHTTP
@testable import FleetTokenHTTPSyntax
@testable import FleetTokenStore

@Suite("Proxy settings: HTTPS_PROXY, HTTP_PROXY, NO_PROXY and the agent's overrides", .paced)
struct ProxySettingsTests {
    let https = URL(string: "https://tokens.example.com/token")!
    let http = URL(string: "http://tokens.example.com/token")!

    func settings(_ environment: [String: String], override: ProxySettings.Override? = nil) throws -> ProxySettings {
        try ProxySettings.fromEnvironment(environment, override: override)
    }

    func noProxy(_ list: String, _ host: String, port: Int = 443) -> Bool {
        NoProxyList(list).matches(host: host, port: port)
    }

    // MARK: Variables and precedence

    @Test("HTTPS_PROXY for https URLs, HTTP_PROXY for http URLs, nothing for other schemes")
    func perScheme() throws {
        let chosen = try settings(["HTTPS_PROXY": "http://secure-proxy:3128", "HTTP_PROXY": "plain-proxy:8080"])
        #expect(chosen.proxy(for: https) == ProxySettings.Proxy(host: "secure-proxy", port: 3128))
        #expect(chosen.proxy(for: http) == ProxySettings.Proxy(host: "plain-proxy", port: 8080))
        #expect(chosen.proxy(for: URL(string: "ftp://tokens.example.com/")!) == nil)
        #expect(chosen.proxy(scheme: "HTTPS", host: "a", port: nil)?.host == "secure-proxy")

        let onlyHTTPS = try settings(["HTTPS_PROXY": "proxy:3128"])
        #expect(onlyHTTPS.proxy(for: http) == nil)
        #expect(try settings([:]) == .direct)
    }

    @Test("lowercase variables win over uppercase ones, as in curl")
    func lowercaseWins() throws {
        let chosen = try settings([
            "https_proxy": "lower:1", "HTTPS_PROXY": "upper:2",
            "http_proxy": "lower:3", "HTTP_PROXY": "upper:4",
            "no_proxy": "lower.example", "NO_PROXY": "tokens.example.com",
        ])
        #expect(chosen.httpsProxy?.port == 1)
        #expect(chosen.httpProxy?.port == 3)
        #expect(chosen.noProxy.entries == ["lower.example"])
        #expect(chosen.proxy(for: https)?.host == "lower")
    }

    @Test("an empty or blank variable counts as unset; uppercase applies then")
    func emptyIsUnset() throws {
        let chosen = try settings(["https_proxy": "  ", "HTTPS_PROXY": "upper:2", "no_proxy": "", "NO_PROXY": "tokens.example.com"])
        #expect(chosen.httpsProxy?.host == "upper")
        #expect(chosen.proxy(for: https) == nil)
    }

    @Test("--proxy replaces both variables but NO_PROXY still applies")
    func proxyOverride() throws {
        let environment = ["HTTPS_PROXY": "env-proxy:1", "HTTP_PROXY": "env-proxy:2", "NO_PROXY": "internal.example"]
        let chosen = try settings(environment, override: .proxy("http://flag-proxy:3128"))
        let flag = ProxySettings.Proxy(host: "flag-proxy", port: 3128)
        #expect(chosen.proxy(for: https) == flag)
        #expect(chosen.proxy(for: http) == flag)
        #expect(chosen.proxy(for: URL(string: "https://a.internal.example/")!) == nil)
        #expect(chosen == ProxySettings(proxy: flag, noProxy: NoProxyList("internal.example")))
        // An invalid environment variable does not matter when the flag replaces it.
        #expect(try settings(["HTTPS_PROXY": "socks5://x:1"], override: .proxy("p:1")).httpsProxy?.host == "p")
    }

    @Test("--no-proxy means no proxy, whatever the environment says (even invalid)")
    func directOverride() throws {
        let chosen = try settings(["HTTPS_PROXY": "https://bad", "HTTP_PROXY": "p:1"], override: .direct)
        #expect(chosen == .direct)
        #expect(chosen.proxy(for: https) == nil && chosen.proxy(for: http) == nil)
        #expect(chosen.description == "no proxy")
    }

    // MARK: Proxy URLs

    @Test("a proxy URL: scheme optional, default port 1080 (curl's), host lowercased, trailing slash allowed",
          arguments: [
              ("http://proxy.corp:3128", "proxy.corp", 3128),
              ("proxy.corp:3128", "proxy.corp", 3128),
              ("HTTP://Proxy.Corp", "proxy.corp", 1080),
              ("proxy.corp", "proxy.corp", 1080),
              ("http://proxy.corp:8080/", "proxy.corp", 8080),
              ("  http://10.1.2.3:3128  ", "10.1.2.3", 3128),
              ("http://[fd00::1]:3128", "fd00::1", 3128),
              ("[::1]", "::1", 1080),
          ])
    func proxyURLs(text: String, host: String, port: Int) throws {
        let proxy = try ProxySettings.Proxy(parsing: text, source: "--proxy")
        #expect(proxy.host == host && proxy.port == port && proxy.credentials == nil)
    }

    @Test("credentials are percent-decoded; a user without a password has an empty one")
    func credentials() throws {
        let proxy = try ProxySettings.Proxy(parsing: "http://agent%40corp:p%40ss%3Aw%2Frd@proxy:3128", source: "HTTPS_PROXY")
        #expect(proxy.credentials == ProxySettings.Credentials(username: "agent@corp", password: "p@ss:w/rd"))
        // Up to the last @, split at the first colon: unencoded @ and : in a password work.
        let raw = try ProxySettings.Proxy(parsing: "user:p@ss:w@proxy:3128", source: "HTTPS_PROXY")
        #expect(raw.credentials == ProxySettings.Credentials(username: "user", password: "p@ss:w"))
        #expect(try ProxySettings.Proxy(parsing: "user@proxy:1", source: "x").credentials == .init(username: "user", password: ""))
        #expect(try ProxySettings.Proxy(parsing: "@proxy:1", source: "x").credentials == nil)
    }

    @Test("descriptions, debug descriptions and dumps never show the password")
    func redaction() throws {
        let password = "s3cr3t-Pa55word"
        let chosen = try settings(["HTTPS_PROXY": "http://agent:\(password)@proxy:3128", "NO_PROXY": "localhost"])
        let proxy = try #require(chosen.httpsProxy)
        #expect(proxy.description == "http://agent:***@proxy:3128")
        #expect(chosen.description == "https via http://agent:***@proxy:3128, http via direct, no proxy for localhost")
        var dumped = ""
        dump(chosen, to: &dumped)
        for text in [chosen.description, String(reflecting: chosen), "\(proxy)", String(reflecting: proxy),
                     String(reflecting: proxy.credentials!), "\(proxy.credentials!)", dumped] {
            #expect(!text.contains(password), "\(text)")
        }
        #expect(ProxySettings.Proxy(host: "fd00::1", port: 3128).description == "http://[fd00::1]:3128")
    }

    @Test("bad proxy URLs throw a typed error naming the source, what is wrong and the fix",
          arguments: [
              ("https://proxy:3128", ProxySettingsError.Code.tlsToProxyUnsupported, "CONNECT"),
              ("socks5://proxy:1080", .unsupportedScheme, "SOCKS"),
              ("http://:3128", .invalidHost, "host"),
              ("http://proxy host:3128", .invalidHost, "host"),
              ("http://fd00::1:3128", .invalidHost, "brackets"),
              ("http://[fd00::zz]:3128", .invalidHost, "host"),
              ("http://[::1]x", .invalidHost, "host"),
              ("http://proxy:0", .invalidPort, "65535"),
              ("http://proxy:65536", .invalidPort, "65535"),
              ("http://proxy:", .invalidPort, "65535"),
              ("http://proxy:31a", .invalidPort, "65535"),
              ("http://proxy:3128/path", .pathNotAllowed, "path"),
              ("http://proxy:3128?x=1", .pathNotAllowed, "path"),
              ("http://us%zzer:pw@proxy:3128", .invalidCredentials, "%40"),
              ("", .invalidURL, "http://"),
              ("http://proxy\n:3128", .invalidURL, "http://"),
          ])
    func badProxyURLs(text: String, code: ProxySettingsError.Code, hint: String) {
        let error = #expect(throws: ProxySettingsError.self) { try settings(["https_proxy": text.isEmpty ? "x" : text], override: text.isEmpty ? .proxy("") : nil) }
        #expect(error?.code == code)
        let description = error?.description ?? ""
        #expect(description.hasPrefix(text.isEmpty ? "the proxy override is" : "https_proxy is"), "\(description)")
        #expect(description.contains(hint), "\(description)")
        #expect(!description.contains("\n"))
    }

    @Test("an error never contains the password, raw or decoded, whatever is wrong",
          arguments: ["https://agent:Sup3r%2FSecret@proxy:3128", "http://agent:Sup3r%2FSecret@proxy:99999",
                      "http://agent:Sup3r%2FSecret@proxy/path", "socks5://agent:Sup3r%2FSecret@proxy",
                      "http://agent:Sup3r%2FSecret%zz@proxy:1", "http://agent:Sup3r/Secret@@[bad]:1"])
    func errorsRedactPasswords(text: String) {
        let error = #expect(throws: ProxySettingsError.self) { try settings(["HTTPS_PROXY": text]) }
        let description = error?.description ?? ""
        #expect(!description.contains("Sup3r") && !description.contains("Secret"), "\(description)")
        #expect(description.contains("agent:***@"), "\(description)")
        #expect(error?.source == "HTTPS_PROXY")
    }

    // Delimiters are found in UTF-8 bytes: as Characters, "@" followed by a combining mark is no
    // "@", and the whole user information (password included) would have been shown as the host.
    @Test("a combining mark after @ or : neither hides the password nor glues NO_PROXY entries")
    func delimitersAreBytes() {
        for text in ["http://agent:Sup3rSecret@\u{301}proxy:1", "http://agent:\u{301}Sup3rSecret@proxy:1x"] {
            let error = #expect(throws: ProxySettingsError.self) { try ProxySettings.Proxy(parsing: text, source: "--proxy") }
            #expect(error?.description.contains("Sup3rSecret") == false, "\(error?.description ?? "")")
        }
        #expect(NoProxyList("a.example\u{600},*").matchesEverything)
        #expect(NoProxyList("a.example,\u{301}b.example").entries == ["a.example"])
    }

    @Test("a very long proxy value is shortened in the error")
    func longValueShortened() {
        let error = #expect(throws: ProxySettingsError.self) {
            try ProxySettings.Proxy(parsing: "http://" + String(repeating: "a", count: 5000) + ":0", source: "--proxy")
        }
        #expect((error?.value.count ?? 0) <= 201)
    }

    // MARK: NO_PROXY

    @Test("* matches every host, alone or among other entries")
    func star() {
        for host in ["tokens.example.com", "10.0.0.1", "::1", "[::1]", "localhost", ""] {
            #expect(noProxy("*", host))
            #expect(noProxy("a.example, *", host))
        }
        #expect(NoProxyList("x,*").matchesEverything)
        #expect(!noProxy("*.", "example.com") && !noProxy("*x", "x"))
    }

    @Test("a host name matches itself and its subdomains, with or without a leading dot or *.")
    func domains() {
        for entry in ["example.com", ".example.com", "*.example.com", "EXAMPLE.com", "example.com."] {
            #expect(noProxy(entry, "example.com"), "\(entry)")
            #expect(noProxy(entry, "a.example.com"), "\(entry)")
            #expect(noProxy(entry, "A.B.Example.COM."), "\(entry)")
            #expect(!noProxy(entry, "notexample.com"), "\(entry)")
            #expect(!noProxy(entry, "example.com.evil"), "\(entry)")
            #expect(!noProxy(entry, "com"), "\(entry)")
        }
        #expect(noProxy("localhost", "localhost"))
        #expect(!noProxy("localhost", "127.0.0.1"), "names are never resolved")
    }

    @Test("entries are separated by commas and whitespace; empty entries are skipped")
    func separators() {
        let list = NoProxyList(" a.example ,, b.example\tc.example\n d.example ,")
        #expect(list.entries == ["a.example", "b.example", "c.example", "d.example"])
        #expect(list.ignoredEntries.isEmpty)
        #expect(list.matches(host: "x.c.example", port: 443))
        #expect(NoProxyList(" , ").isEmpty)
    }

    @Test("IP literals match the same address however written, never a name")
    func addresses() {
        #expect(noProxy("10.1.2.3", "10.1.2.3"))
        #expect(!noProxy("10.1.2.3", "10.1.2.4"))
        #expect(noProxy("::1", "::1") && noProxy("::1", "[::1]") && noProxy("[::1]", "0:0:0:0:0:0:0:1"))
        #expect(noProxy("FD00::A", "fd00:0::a"))
        #expect(!noProxy("::1", "127.0.0.1"), "no mapping between families")
        #expect(!noProxy("10.1.2.3", "host-10.1.2.3"))
    }

    @Test("CIDR blocks, IPv4 and IPv6, including /0, /32 and /128 edges")
    func cidr() {
        #expect(noProxy("10.0.0.0/8", "10.255.255.255") && noProxy("10.0.0.0/8", "10.0.0.0"))
        #expect(!noProxy("10.0.0.0/8", "11.0.0.0") && !noProxy("10.0.0.0/8", "9.255.255.255"))
        #expect(noProxy("192.168.1.128/25", "192.168.1.200") && !noProxy("192.168.1.128/25", "192.168.1.127"))
        #expect(noProxy("0.0.0.0/0", "203.0.113.9") && !noProxy("0.0.0.0/0", "::1") && !noProxy("0.0.0.0/0", "example.com"))
        #expect(noProxy("203.0.113.9/32", "203.0.113.9") && !noProxy("203.0.113.9/32", "203.0.113.8"))
        #expect(noProxy("fd00::/8", "fd12:3456::1") && !noProxy("fd00::/8", "fe80::1"))
        #expect(noProxy("[fd00::]/8", "fdff::1") && noProxy("[fd00::/8]", "fdff::1"))
        #expect(noProxy("::/0", "2001:db8::1") && !noProxy("::/0", "10.0.0.1"))
        #expect(noProxy("2001:db8::1/128", "2001:db8::1") && !noProxy("2001:db8::1/128", "2001:db8::2"))
        #expect(noProxy("2001:db8::/33", "2001:db8:7fff::1") && !noProxy("2001:db8::/33", "2001:db8:8000::1"))
    }

    @Test("an optional :port restricts an entry to that port (443/80 when the URL names none)")
    func ports() throws {
        #expect(noProxy("example.com:8443", "a.example.com", port: 8443))
        #expect(!noProxy("example.com:8443", "a.example.com", port: 443))
        #expect(noProxy("10.0.0.0/8:443", "10.1.1.1", port: 443) && !noProxy("10.0.0.0/8:443", "10.1.1.1", port: 80))
        #expect(noProxy("[::1]:8080", "::1", port: 8080) && !noProxy("[::1]:8080", "::1", port: 8081))
        #expect(noProxy("[fd00::]/8:8080", "fd00::5", port: 8080))
        let chosen = try settings(["HTTPS_PROXY": "p:1", "HTTP_PROXY": "p:1", "NO_PROXY": "tokens.example.com:443"])
        #expect(chosen.proxy(for: https) == nil)
        #expect(chosen.proxy(for: http) != nil)
        #expect(chosen.proxy(for: URL(string: "https://tokens.example.com:8443/")!) != nil)
        #expect(chosen.proxy(for: URL(string: "http://tokens.example.com:443/")!) == nil)
    }

    @Test("URL hosts: IPv6 in brackets, uppercase and trailing dots")
    func urlHosts() throws {
        let chosen = try settings(["HTTPS_PROXY": "p:1", "NO_PROXY": "::1,fd00::/8,tokens.example.com"])
        #expect(chosen.proxy(for: URL(string: "https://[::1]:8443/token")!) == nil)
        #expect(chosen.proxy(for: URL(string: "https://[fd00::7]/token")!) == nil)
        #expect(chosen.proxy(for: URL(string: "https://[::2]/token")!) != nil)
        #expect(chosen.proxy(for: URL(string: "https://TOKENS.Example.com./token")!) == nil)
    }

    @Test("loopback is not exempt unless listed, as in curl")
    func loopbackNotImplicit() throws {
        let chosen = try settings(["HTTPS_PROXY": "p:1", "HTTP_PROXY": "p:1"])
        #expect(chosen.proxy(for: URL(string: "http://127.0.0.1:8080/")!) != nil)
        #expect(chosen.proxy(for: URL(string: "http://localhost:8080/")!) != nil)
        #expect(chosen.proxy(for: URL(string: "https://[::1]/")!) != nil)
    }

    @Test("entries that can never match are ignored and reported",
          arguments: ["10.0.0.0/33", "fd00::/129", "10.0.0.0/", "10.0.0.0/x", "example.com/8", "example.com:0",
                      "example.com:x", "[::1", "[::1]x", "[example.com]", "http://example.com", "<local>", ".", "*.", "..a",
                      "fd00::1:zz", "10.0.0.0/-1"])
    func ignoredEntries(entry: String) {
        let list = NoProxyList("good.example,\(entry)")
        #expect(list.ignoredEntries == [entry])
        #expect(list.entries == ["good.example"])
        for host in ["example.com", "10.0.0.1", "::1", "fd00::1", "local"] {
            #expect(!list.matches(host: host, port: 443), "\(entry) matched \(host)")
        }
    }
}
