// libFuzzer harness for `ProxySettings`: `fromEnvironment(_:override:)` on proxy URLs built from
// fuzzed parts, `proxy(scheme:host:port:)` / `proxy(for:)`, and `NoProxyList` matching.
//
// Input: byte 0 picks the configuration; the rest is up to seven fields separated by 0xFF:
//   scheme, user, password, host, port, NO_PROXY, request host.
// The proxy URL is `scheme://user:password@host:port` (each separator only when its parts are
// non-empty).
//   byte 0, bit 0: percent-encode user and password (else raw)
//           bits 1-2: where the URL goes: HTTPS_PROXY, https_proxy (HTTPS_PROXY then holds a
//                     decoy), HTTP_PROXY, --proxy
//           bit 3: --no-proxy
//           bit 4: request scheme https (else http)
//           bits 5-6: request port: none, 443, 80, 8080
//           bit 7: append ",*" to NO_PROXY
//
// Properties: no crash; no description, debug description, dump or error text quotes the
// password (raw or decoded) unless it quotes it as well with another password in its place (the
// password then also is another part of the input); encoded credentials round-trip; a URL made of
// a plain host and a valid port is accepted; the proxy chosen is the scheme's unless NO_PROXY
// matches; `*` and `--no-proxy` always go direct; matching ignores ASCII case; a host listed
// in NO_PROXY matches itself.

import FleetTokenHTTPSyntax
import FleetTokenStore
import Foundation
import FuzzSupport

let requestPorts: [Int?] = [nil, 443, 80, 8080]
let unreserved = CharacterSet(charactersIn: "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzProxySettings(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let configuration = input.selector(0)
    var fields = input.payload(after: 1).split(separator: 0xFF, maxSplits: 6, omittingEmptySubsequences: false)
        .map { String(decoding: $0, as: UTF8.self) }
    while fields.count < 7 { fields.append("") }
    let (scheme, user, password, host, port, noProxy, requestHost) = (fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6])
    let encoded = configuration & 1 != 0
    let placement = Int(configuration >> 1 & 3)
    let direct = configuration & 8 != 0
    let requestScheme = configuration & 16 != 0 ? "https" : "http"
    let requestPort = requestPorts[Int(configuration >> 5 & 3)]
    let star = configuration & 128 != 0

    let outcome = evaluate(scheme: scheme, user: user, password: password, host: host, port: port, noProxy: noProxy,
                           encoded: encoded, placement: placement, direct: direct, star: star)
    checkLeaks(outcome, password: password, encoded: encoded) { replacement in
        evaluate(scheme: scheme, user: user, password: replacement, host: host, port: port, noProxy: noProxy,
                 encoded: encoded, placement: placement, direct: direct, star: star)
    }

    switch outcome.result {
    case .success(let settings):
        checkChoice(settings, scheme: requestScheme, host: requestHost, port: requestPort, direct: direct, star: star)
        if !direct, placement != 2, let proxy = settings.httpsProxy {
            checkParsed(proxy, scheme: scheme, user: user, password: password, host: host, port: port, encoded: encoded)
        }
    case .failure(let error):
        require(!direct, "--no-proxy threw: \(error)")
        checkRefusal(error, scheme: scheme, user: user, password: password, host: host, port: port, encoded: encoded)
    }
    checkNoProxyList(noProxy, host: requestHost, port: requestPort ?? 443)
    return 0
}

struct Outcome {
    let url: String
    let result: Result<ProxySettings, ProxySettingsError>
    /// Every text an agent could log about it.
    let texts: [String]
}

func proxyURL(scheme: String, user: String, password: String, host: String, port: String, encoded: Bool) -> String {
    func encode(_ text: String) -> String {
        encoded ? text.addingPercentEncoding(withAllowedCharacters: unreserved) ?? text : text
    }
    var url = scheme.isEmpty ? "" : scheme + "://"
    if !user.isEmpty || !password.isEmpty { url += encode(user) + ":" + encode(password) + "@" }
    url += host
    if !port.isEmpty { url += ":" + port }
    return url
}

func evaluate(scheme: String, user: String, password: String, host: String, port: String, noProxy: String,
              encoded: Bool, placement: Int, direct: Bool, star: Bool) -> Outcome {
    let url = proxyURL(scheme: scheme, user: user, password: password, host: host, port: port, encoded: encoded)
    var environment = ["NO_PROXY": star ? noProxy + ",*" : noProxy]
    var override: ProxySettings.Override? = direct ? .direct : nil
    switch placement {
    case 0: environment["HTTPS_PROXY"] = url
    case 1: (environment["https_proxy"], environment["HTTPS_PROXY"]) = (url, "decoy-proxy:1")
    case 2: environment["HTTP_PROXY"] = url
    default: if !direct { override = .proxy(url) }
    }
    do {
        let settings = try ProxySettings.fromEnvironment(environment, override: override)
        var dumped = ""
        dump(settings, to: &dumped)
        var texts = [settings.description, String(reflecting: settings), dumped]
        for proxy in [settings.httpsProxy, settings.httpProxy].compactMap({ $0 }) {
            texts += [proxy.description, String(reflecting: proxy), proxy.credentials.map { "\($0)" } ?? ""]
        }
        return Outcome(url: url, result: .success(settings), texts: texts)
    } catch {
        return Outcome(url: url, result: .failure(error), texts: [error.description, error.value, "\(error)"])
    }
}

/// No text quotes the password, raw or decoded, unless it does so as well when another password
/// takes its place (then the password also is, or is in, another part of the input or message).
/// The stand-in is plain letters, valid in any position, so that a URL the parser accepted stays
/// accepted: a stand-in that made it invalid would drop the other parts' texts (a NO_PROXY entry
/// equal to the password, say) and blame the password for them.
func checkLeaks(_ outcome: Outcome, password: String, encoded: Bool, replacing: (String) -> Outcome) {
    let forms = Set([password, password.removingPercentEncoding ?? password].filter(isLeakCheckable))
    guard !forms.isEmpty else { return }
    let other = replacing("QQQQ")
    for form in forms {
        for text in outcome.texts where text.contains(form) {
            require(other.texts.contains { $0.contains(form) }, "the password shows in \(text)")
        }
    }
}

/// A parsed proxy's credentials are the percent-decoded user and password.
func checkParsed(_ proxy: ProxySettings.Proxy, scheme: String, user: String, password: String, host: String, port: String, encoded: Bool) {
    let unambiguous = scheme.utf8.allSatisfy { isSchemeByte($0) } && !host.contains("@") && !port.contains("@")
    guard encoded, unambiguous, host.utf8.first.map({ $0 > 0x20 }) ?? true else { return }
    if user.isEmpty && password.isEmpty {
        require(proxy.credentials == nil, "credentials without user or password")
    } else {
        require(proxy.credentials?.username == user && proxy.credentials?.password == password,
                "credentials did not round-trip: \(String(reflecting: proxy))")
    }
}

/// A URL made of an http scheme (or none), a host name or IPv4 address, and a port from 1 to
/// 65535 (or none) is accepted.
func checkRefusal(_ error: ProxySettingsError, scheme: String, user: String, password: String, host: String, port: String, encoded: Bool) {
    let plainHost = !host.isEmpty && host.utf8.allSatisfy { isHostNameByte($0) }
    let goodPort = port.isEmpty || (port.utf8.count <= 5 && port.utf8.allSatisfy { $0 >= 48 && $0 <= 57 } && (1...65535).contains(Int(port) ?? 0))
    let goodScheme = scheme.isEmpty || scheme.lowercased() == "http"
    require(!(encoded && plainHost && goodPort && goodScheme), "a valid proxy URL was refused: \(error)")
}

/// The chosen proxy is the request scheme's, or none when NO_PROXY matches; `*` and --no-proxy
/// always go direct.
func checkChoice(_ settings: ProxySettings, scheme: String, host: String, port: Int?, direct: Bool, star: Bool) {
    let chosen = settings.proxy(scheme: scheme, host: host, port: port)
    if direct || star { require(chosen == nil, "a proxy was chosen despite \(direct ? "--no-proxy" : "*")") }
    let expected = scheme == "https" ? settings.httpsProxy : settings.httpProxy
    let bypass = settings.noProxy.matches(host: host, port: port ?? (scheme == "https" ? 443 : 80))
    require(chosen == (bypass ? nil : expected), "proxy(scheme:host:port:) chose \(String(describing: chosen))")
    require(settings.proxy(scheme: "ftp", host: host, port: port) == nil, "a proxy for ftp")
    if let url = URL(string: "\(scheme)://\(host)/"), url.host != nil {
        _ = settings.proxy(for: url)
    }
}

/// `*` matches everything; ASCII case does not matter; a host listed matches itself.
func checkNoProxyList(_ text: String, host: String, port: Int) {
    let list = NoProxyList(text)
    let matches = list.matches(host: host, port: port)
    require(list.matchesEverything ? matches : true, "* did not match \(host)")
    require(NoProxyList(text + ",*").matches(host: host, port: port), "* did not match \(host)")
    require(NoProxyList(asciiUppercased(text)).matches(host: asciiUppercased(host), port: port) == matches,
            "matching depends on case: \(text) / \(host)")
    require(NoProxyList(text + "," + host).matches(host: host, port: port) || !matches && !listsItself(host),
            "adding an entry removed a match, or \(host) does not match itself")
}

/// True for a host that, written as a NO_PROXY entry, names exactly that host.
func listsItself(_ host: String) -> Bool {
    let entry = NoProxyList(host)
    guard entry.ignoredEntries.isEmpty, entry.entries.count == 1 else { return false }
    // A name, or an IPv6 address (one colon would be read as `host:port`).
    let colons = host.utf8.filter { $0 == UInt8(ascii: ":") }.count
    return host.utf8.allSatisfy { isHostNameByte($0) || (colons >= 2 && $0 == UInt8(ascii: ":")) }
}

func asciiUppercased(_ text: String) -> String {
    String(decoding: text.utf8.map { $0 >= 97 && $0 <= 122 ? $0 - 32 : $0 }, as: UTF8.self)
}

func isHostNameByte(_ byte: UInt8) -> Bool {
    (byte >= 97 && byte <= 122) || (byte >= 65 && byte <= 90) || (byte >= 48 && byte <= 57) || byte == 45 || byte == 46 || byte == 95
}

func isSchemeByte(_ byte: UInt8) -> Bool {
    (byte >= 97 && byte <= 122) || (byte >= 65 && byte <= 90) || (byte >= 48 && byte <= 57) || byte == 45 || byte == 46 || byte == 43
}
