public import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Which forward proxy, if any, carries a request to the token provider: the agent's reading of
/// `HTTPS_PROXY`, `HTTP_PROXY` and `NO_PROXY` (AsyncHTTPClient does not read the environment),
/// or of its `--proxy URL` / `--no-proxy` flags. A pure value: no I/O, no DNS.
///
/// ```swift
/// let settings = try ProxySettings.fromEnvironment(ProcessInfo.processInfo.environment)
/// if let proxy = settings.proxy(for: providerURL) { /* CONNECT through proxy.host:proxy.port */ }
/// ```
///
/// Its `description` shows proxy credentials as `user:***`, so it can be logged.
public struct ProxySettings: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    /// The proxy for `https` URLs (tunnelled with CONNECT), if any.
    public var httpsProxy: Proxy?
    /// The proxy for plain `http` URLs, if any.
    public var httpProxy: Proxy?
    /// Hosts reached directly, without either proxy.
    public var noProxy: NoProxyList

    /// No proxy at all (`--no-proxy`).
    public static let direct = ProxySettings(httpsProxy: nil, httpProxy: nil, noProxy: NoProxyList(""))

    /// Settings with one proxy per scheme.
    public init(httpsProxy: Proxy?, httpProxy: Proxy?, noProxy: NoProxyList = NoProxyList("")) {
        self.httpsProxy = httpsProxy
        self.httpProxy = httpProxy
        self.noProxy = noProxy
    }

    /// Settings with the same proxy for both schemes (`--proxy URL`).
    public init(proxy: Proxy?, noProxy: NoProxyList = NoProxyList("")) {
        self.init(httpsProxy: proxy, httpProxy: proxy, noProxy: noProxy)
    }

    /// What the agent's flags say instead of the environment's proxy variables.
    public enum Override: Sendable, Equatable {
        /// `--proxy URL`: this proxy for both `https` and `http` URLs; the environment's
        /// `HTTPS_PROXY`/`HTTP_PROXY` are ignored, its `NO_PROXY` still applies.
        case proxy(String)
        /// `--no-proxy`: no proxy for any URL, whatever the environment says.
        case direct
    }

    /// Reads the proxy variables of `environment`, as curl does, or the agent's override.
    ///
    /// - `https_proxy`/`HTTPS_PROXY` for `https` URLs, `http_proxy`/`HTTP_PROXY` for `http`
    ///   URLs, `no_proxy`/`NO_PROXY` for the hosts that bypass both (see ``NoProxyList``).
    /// - When both spellings are set, the lowercase one wins, as in curl. A variable that is
    ///   empty or only whitespace counts as unset. (curl ignores uppercase `HTTP_PROXY`
    ///   entirely, a guard for CGI programs; an agent is not one, so it is read here.)
    /// - `ALL_PROXY` is not read: set `HTTPS_PROXY`, or pass `--proxy`.
    /// - A proxy URL is `[http://][user:password@]host[:port]`; see ``Proxy/init(parsing:source:)``.
    ///
    /// - Throws: ``ProxySettingsError`` naming the variable (or `--proxy`) whose proxy URL is
    ///   invalid, with any password shown as `***`.
    public static func fromEnvironment(_ environment: [String: String],
                                       override: Override? = nil) throws(ProxySettingsError) -> ProxySettings {
        let noProxy = Self.variable(environment, "no_proxy", "NO_PROXY").map { NoProxyList($0.value) } ?? NoProxyList("")
        switch override {
        case .direct:
            return .direct
        case .proxy(let url):
            return ProxySettings(proxy: try Proxy(parsing: url, source: "--proxy"), noProxy: noProxy)
        case nil:
            var https: Proxy?, http: Proxy?
            if let (name, value) = Self.variable(environment, "https_proxy", "HTTPS_PROXY") {
                https = try Proxy(parsing: value, source: name)
            }
            if let (name, value) = Self.variable(environment, "http_proxy", "HTTP_PROXY") {
                http = try Proxy(parsing: value, source: name)
            }
            return ProxySettings(httpsProxy: https, httpProxy: http, noProxy: noProxy)
        }
    }

    /// The proxy for a request to `url`: the `https` or `http` proxy by its scheme; nil for other
    /// schemes, URLs without a host, and hosts ``noProxy`` matches.
    public func proxy(for url: URL) -> Proxy? {
        guard let scheme = url.scheme, let host = url.host, !host.isEmpty else { return nil }
        return proxy(scheme: scheme, host: host, port: url.port)
    }

    /// The proxy for a request to `host` (name or IP address, IPv6 with or without brackets) on
    /// `port` (nil: the scheme's default, 443 or 80) over `scheme` (`https` or `http`).
    public func proxy(scheme: String, host: String, port: Int?) -> Proxy? {
        let chosen: Proxy?
        let defaultPort: Int
        switch asciiLowercased(scheme) {
        case "https": (chosen, defaultPort) = (httpsProxy, 443)
        case "http": (chosen, defaultPort) = (httpProxy, 80)
        default: return nil
        }
        guard let chosen, !noProxy.matches(host: host, port: port ?? defaultPort) else { return nil }
        return chosen
    }

    /// The proxies and `NO_PROXY` list, credentials redacted.
    public var description: String {
        if httpsProxy == nil && httpProxy == nil { return "no proxy" }
        var text = "https via \(httpsProxy?.description ?? "direct"), http via \(httpProxy?.description ?? "direct")"
        if !noProxy.isEmpty { text += ", no proxy for \(noProxy)" }
        return text
    }

    /// The same as ``description``: credentials redacted.
    public var debugDescription: String { description }

    private static func variable(_ environment: [String: String], _ lower: String, _ upper: String) -> (name: String, value: String)? {
        for name in [lower, upper] {
            if let value = environment[name], !value.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty {
                return (name, value)
            }
        }
        return nil
    }
}

extension ProxySettings {
    /// A forward HTTP proxy: plain HTTP to the proxy, CONNECT tunnels for `https` URLs.
    public struct Proxy: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
        /// The proxy's host name (lowercased) or IP address (IPv6 without brackets).
        public let host: String
        /// The proxy's port.
        public let port: Int
        /// Basic credentials for `Proxy-Authorization`, if the URL had a user.
        public let credentials: Credentials?

        /// The port used when a proxy URL names none: 1080, as curl does. HTTP proxies usually
        /// listen on 3128 or 8080, so give the port.
        public static let defaultPort = 1080

        /// A proxy at `host:port`.
        public init(host: String, port: Int, credentials: Credentials? = nil) {
            self.host = host
            self.port = port
            self.credentials = credentials
        }

        /// Parses `[http://][user[:password]@]host[:port][/]`.
        ///
        /// The scheme is optional and must be `http`; the port defaults to ``defaultPort`` (1080,
        /// curl's default); IPv6 addresses go in brackets. The user information runs up to the
        /// last `@`, splits at its first `:`, and is percent-decoded (`%40` for `@`, `%3A` for `:`).
        ///
        /// - Parameters:
        ///   - text: The proxy URL.
        ///   - source: Where the text came from (`HTTPS_PROXY`, `--proxy`), for the error.
        /// - Throws: ``ProxySettingsError``: an `https://` proxy (TLS to the proxy is not
        ///   supported), another scheme, a bad host or port, a path, or bad percent-encoding. Its
        ///   text shows the URL with the password as `***`.
        public init(parsing text: String, source: String) throws(ProxySettingsError) {
            let parts = ProxyURLParts(text)
            func fail(_ code: ProxySettingsError.Code) -> ProxySettingsError {
                ProxySettingsError(code: code, source: source, value: parts.redacted)
            }
            if parts.hostPort.isEmpty && parts.username == nil && parts.scheme == nil { throw fail(.invalidURL) }
            if text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) { throw fail(.invalidURL) }
            switch parts.scheme.map(asciiLowercased) {
            case nil, "http": break
            case "https": throw fail(.tlsToProxyUnsupported)
            default: throw fail(.unsupportedScheme)
            }
            // ASCII only from here on, so Character and byte views agree.
            guard parts.hostPort.utf8.allSatisfy({ $0 < 0x80 }) else { throw fail(.invalidHost) }
            var hostPort = Substring(parts.hostPort)
            while hostPort.last == "/" { hostPort.removeLast() }
            if hostPort.contains(where: { "/?#".contains($0) }) { throw fail(.pathNotAllowed) }

            var portText: Substring?
            if hostPort.hasPrefix("[") {
                guard let close = hostPort.firstIndex(of: "]") else { throw fail(.invalidHost) }
                let address = hostPort[hostPort.index(after: hostPort.startIndex)..<close]
                guard IPAddress(address)?.bytes.count == 16 else { throw fail(.invalidHost) }
                host = asciiLowercased(address)
                let rest = hostPort[hostPort.index(after: close)...]
                if !rest.isEmpty {
                    guard rest.first == ":" else { throw fail(.invalidHost) }
                    portText = rest.dropFirst()
                }
            } else {
                let pieces = hostPort.split(separator: ":", omittingEmptySubsequences: false)
                guard pieces.count <= 2 else { throw fail(.invalidHost) }
                let name = pieces[0]
                guard !name.isEmpty, name.utf8.allSatisfy(isHostNameByte) else { throw fail(.invalidHost) }
                host = asciiLowercased(name)
                portText = pieces.count == 2 ? pieces[1] : nil
            }
            if let portText {
                guard let number = parsePort(portText) else { throw fail(.invalidPort) }
                port = number
            } else {
                port = Self.defaultPort
            }

            if let user = parts.username {
                guard let username = user.removingPercentEncoding,
                      let password = (parts.password ?? "").removingPercentEncoding
                else { throw fail(.invalidCredentials) }
                credentials = username.isEmpty && password.isEmpty ? nil : Credentials(username: username, password: password)
            } else {
                credentials = nil
            }
        }

        /// `http://user:***@host:port`: the password never shows.
        public var description: String {
            let user = credentials.map { "\($0)@" } ?? ""
            let shownHost = host.contains(":") ? "[\(host)]" : host
            return "http://\(user)\(shownHost):\(port)"
        }

        /// The same as ``description``: the password never shows.
        public var debugDescription: String { description }
    }

    /// Proxy credentials. The password shows as `***` in every description and mirror.
    public struct Credentials: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
        /// The user name, percent-decoded.
        public let username: String
        /// The password, percent-decoded; empty when the URL gave none.
        public let password: String

        /// Credentials for basic proxy authentication.
        public init(username: String, password: String) {
            self.username = username
            self.password = password
        }

        /// `user:***`.
        public var description: String { "\(username):***" }
        /// `user:***`.
        public var debugDescription: String { description }
        /// Only the user name, so `dump` shows no password.
        public var customMirror: Mirror { Mirror(self, children: ["username": username, "password": "***"]) }
    }
}

/// Hosts that bypass the proxy: the value of `NO_PROXY`, following curl's rules.
///
/// Entries are separated by commas and/or ASCII whitespace and compared without regard to ASCII
/// case. Matching looks at the URL's host as written (internationalized names in their `xn--`
/// form); entries with other than ASCII characters never match.
/// - `*` (as a whole entry) matches every host.
/// - A host name matches itself and its subdomains: `example.com`, `.example.com` and
///   `*.example.com` all match `example.com` and `a.example.com`, never `notexample.com`
///   (curl strips a leading dot; the `*.` form, which curl does not know, is read the same way).
///   A trailing dot on either side is ignored.
/// - An IPv4 or IPv6 address (brackets optional: `::1`, `[::1]`) matches that address, however
///   written; a CIDR block (`10.0.0.0/8`, `fd00::/8`, `[fd00::]/8`) matches addresses in it.
///   Addresses match only URLs whose host is an address literal: names are never resolved.
/// - `entry:port` (`[v6]:port` for IPv6) matches only requests to that port (443/80 when the URL
///   names none).
/// - Loopback is not exempt by itself, as in curl: add `localhost,127.0.0.0/8,::1` when wanted.
///
/// Entries that fit none of these (a URL, a bad CIDR or port) never match; they are kept in
/// ``ignoredEntries`` so that an agent can warn about them.
public struct NoProxyList: Sendable, Equatable, CustomStringConvertible {
    enum Rule: Sendable, Equatable {
        case everything
        case domain(String, port: Int?)
        case network(IPAddress, prefixLength: Int, port: Int?)
    }

    let rules: [Rule]
    /// The entries kept, as written (lowercased).
    public let entries: [String]
    /// The entries that can never match (not a host name, address or CIDR block; bad port).
    public let ignoredEntries: [String]

    /// Parses a `NO_PROXY` value.
    public init(_ text: String) {
        var rules: [Rule] = [], entries: [String] = [], ignored: [String] = []
        // Bytes, not Characters: a combining mark or prepend character must not glue entries.
        let separators: (UInt8) -> Bool = { $0 == UInt8(ascii: ",") || $0 == 0x20 || (0x09...0x0D).contains($0) }
        for bytes in text.utf8.split(whereSeparator: separators) {
            let raw = String(decoding: bytes, as: UTF8.self)
            let entry = asciiLowercased(raw)
            if bytes.allSatisfy({ $0 < 0x80 }), let rule = Self.rule(entry) {
                rules.append(rule)
                entries.append(entry)
            } else {
                ignored.append(String(raw))
            }
        }
        self.rules = rules
        self.entries = entries
        self.ignoredEntries = ignored
    }

    /// True when there is no usable entry.
    public var isEmpty: Bool { rules.isEmpty }

    /// True when the list contains `*`.
    public var matchesEverything: Bool { rules.contains(.everything) }

    /// True when a request to `host` on `port` goes direct.
    public func matches(host: String, port: Int) -> Bool {
        var name = Substring(host)
        if name.hasPrefix("["), name.hasSuffix("]"), name.count >= 2 { name = name.dropFirst().dropLast() }
        if name.hasSuffix(".") { name = name.dropLast() }
        let normalized = asciiLowercased(name)
        let address = IPAddress(normalized)
        for rule in rules {
            switch rule {
            case .everything:
                return true
            case .domain(let domain, let rulePort):
                guard address == nil, rulePort == nil || rulePort == port else { continue }
                let name = normalized.utf8, suffix = domain.utf8
                if name.elementsEqual(suffix) { return true }
                if name.count > suffix.count, name.suffix(suffix.count).elementsEqual(suffix),
                   name.dropLast(suffix.count).last == UInt8(ascii: ".") { return true }
            case .network(let network, let prefixLength, let rulePort):
                guard let address, rulePort == nil || rulePort == port else { continue }
                if address.isIn(network, prefixLength: prefixLength) { return true }
            }
        }
        return false
    }

    /// The usable entries, comma-separated.
    public var description: String { entries.joined(separator: ",") }

    /// The rule for one lowercased entry; nil when it can never match.
    private static func rule(_ entry: String) -> Rule? {
        if entry == "*" { return .everything }
        var hostPart = Substring(entry)
        var port: Int?
        var mustBeAddress = false
        if hostPart.hasPrefix("[") {
            guard let close = hostPart.firstIndex(of: "]") else { return nil }
            var rest = hostPart[hostPart.index(after: close)...]
            var inside = hostPart[hostPart.index(after: hostPart.startIndex)..<close]
            if rest.hasPrefix("/") {
                let end = rest.firstIndex(of: ":") ?? rest.endIndex
                inside = Substring(String(inside) + rest[..<end])
                rest = rest[end...]
            }
            if rest.hasPrefix(":") {
                guard let number = parsePort(rest.dropFirst()) else { return nil }
                port = number
            } else if !rest.isEmpty {
                return nil
            }
            hostPart = inside
            mustBeAddress = true
        } else if hostPart.filter({ $0 == ":" }).count >= 2 {
            mustBeAddress = true      // an unbracketed IPv6 address or block, no port
        } else {
            if let colon = hostPart.firstIndex(of: ":") {
                guard let number = parsePort(hostPart[hostPart.index(after: colon)...]) else { return nil }
                port = number
                hostPart = hostPart[..<colon]
            }
            // As for hosts, before telling addresses from names: `10.0.0.1.` is an address.
            if hostPart.count > 1, hostPart.hasSuffix("."), !hostPart.hasSuffix("..") { hostPart = hostPart.dropLast() }
        }
        if let slash = hostPart.firstIndex(of: "/") {
            let bits = hostPart[hostPart.index(after: slash)...]
            guard let network = IPAddress(hostPart[..<slash]), !bits.isEmpty, bits.count <= 3,
                  bits.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
                  let prefixLength = Int(bits), prefixLength <= network.bytes.count * 8
            else { return nil }
            return .network(network, prefixLength: prefixLength, port: port)
        }
        if let address = IPAddress(hostPart) {
            return .network(address, prefixLength: address.bytes.count * 8, port: port)
        }
        if mustBeAddress { return nil }
        if hostPart.hasPrefix("*.") { hostPart = hostPart.dropFirst(2) } else if hostPart.hasPrefix(".") { hostPart = hostPart.dropFirst() }
        if hostPart.hasSuffix(".") { hostPart = hostPart.dropLast() }
        guard !hostPart.isEmpty, hostPart.utf8.allSatisfy(isHostNameByte), !hostPart.hasPrefix(".") else { return nil }
        return .domain(String(hostPart), port: port)
    }
}

/// Why a proxy URL cannot be used. Its text names where the URL came from and shows it with the
/// password as `***`; it never contains the password.
public struct ProxySettingsError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong; more codes may come.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short, stable name.
        public let name: String
        /// Empty, control characters, or otherwise not a URL.
        public static let invalidURL = Code(name: "invalidURL")
        /// `https://`: TLS to the proxy itself is not supported.
        public static let tlsToProxyUnsupported = Code(name: "tlsToProxyUnsupported")
        /// A scheme other than `http` (e.g. `socks5`).
        public static let unsupportedScheme = Code(name: "unsupportedScheme")
        /// The host is missing or not a host name or (bracketed IPv6) address.
        public static let invalidHost = Code(name: "invalidHost")
        /// The port is not a number from 1 to 65535.
        public static let invalidPort = Code(name: "invalidPort")
        /// The user name or password is not valid percent-encoded UTF-8.
        public static let invalidCredentials = Code(name: "invalidCredentials")
        /// The URL has a path, query or fragment.
        public static let pathNotAllowed = Code(name: "pathNotAllowed")
        /// The name.
        public var description: String { name }
    }

    /// What is wrong.
    public let code: Code
    /// Where the URL came from: `HTTPS_PROXY`, `https_proxy`, `--proxy`...
    public let source: String
    /// The URL as given, with the password replaced by `***` (and shortened when long).
    public let value: String

    /// Creates the error; `value` must already be redacted.
    public init(code: Code, source: String, value: String) {
        self.code = code
        self.source = source
        self.value = value
    }

    /// What is wrong and what to do.
    public var description: String {
        let problem: String = switch code {
        case .tlsToProxyUnsupported:
            "a proxy reached over TLS (https://) is not supported; the fetcher speaks plain HTTP to the proxy and tunnels TLS to the provider through CONNECT, so the provider's certificate is still verified end to end: write http://HOST:PORT"
        case .unsupportedScheme:
            "only HTTP proxies (http://) are supported, not SOCKS or others: give an HTTP proxy as http://HOST:PORT"
        case .invalidHost:
            "the proxy host is missing or is not a host name or IP address: write http://HOST:PORT, with IPv6 addresses in brackets (http://[fd00::1]:3128)"
        case .invalidPort:
            "the proxy port is not a number from 1 to 65535: write http://HOST:PORT"
        case .invalidCredentials:
            "the user name or password is not valid percent-encoding: percent-encode reserved characters (% as %25, @ as %40, : as %3A)"
        case .pathNotAllowed:
            "a proxy URL names only a host and port: remove the path, query or fragment"
        default:
            "it is not a proxy URL: write http://[USER:PASSWORD@]HOST:PORT"
        }
        return "\(source) is \"\(value)\": \(problem)"
    }
}

/// A proxy URL split into scheme, user information and host/port, without validation; shared by
/// the parser and the redaction so that both agree on where the password is. Split on UTF-8
/// bytes, not Characters: a combining mark after `@` or `:` must not hide the delimiter.
struct ProxyURLParts {
    /// Before the first `://`, when that is a plausible scheme.
    var scheme: String?
    /// Before the last `@`, up to its first `:` (raw, percent-encoded).
    var username: String?
    /// After that `:` (raw); nil without a colon.
    var password: String?
    /// After the last `@`.
    var hostPort: String

    init(_ text: String) {
        let bytes = Array(text.trimmingCharacters(in: .whitespacesAndNewlines).utf8)
        func string(_ slice: ArraySlice<UInt8>) -> String { String(decoding: slice, as: UTF8.self) }
        var rest = bytes[...]
        if let separator = (0..<max(0, bytes.count - 2)).first(where: { bytes[$0] == UInt8(ascii: ":") && bytes[$0 + 1] == UInt8(ascii: "/") && bytes[$0 + 2] == UInt8(ascii: "/") }),
           separator > 0, bytes[..<separator].allSatisfy(isSchemeByte) {
            scheme = string(bytes[..<separator])
            rest = bytes[(separator + 3)...]
        }
        if let at = rest.lastIndex(of: UInt8(ascii: "@")) {
            let userInfo = rest[..<at]
            if let colon = userInfo.firstIndex(of: UInt8(ascii: ":")) {
                username = string(userInfo[..<colon])
                password = string(userInfo[(colon + 1)...])
            } else {
                username = string(userInfo)
            }
            rest = rest[(at + 1)...]
        }
        hostPort = string(rest)
    }

    /// The URL with the password as `***`, control characters as `?`, at most 200 characters.
    var redacted: String {
        var text = scheme.map { "\($0)://" } ?? ""
        if let username { text += password == nil ? "\(username)@" : "\(username):***@" }
        text += hostPort
        let shown = String(String.UnicodeScalarView(text.unicodeScalars.map {
            $0.properties.generalCategory == .control ? "?" : $0
        }))
        return shown.count > 200 ? String(shown.prefix(200)) + "…" : shown
    }
}

/// An IPv4 (4 bytes) or IPv6 (16 bytes) address, parsed with `inet_pton`.
struct IPAddress: Sendable, Equatable {
    let bytes: [UInt8]

    init?(_ text: some StringProtocol) {
        // inet_pton reads a C string: refuse anything else before it could cut at a NUL.
        guard !text.isEmpty, text.utf8.count <= 45, text.utf8.allSatisfy({ isHexDigit($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: ":") })
        else { return nil }
        let string = String(text)
        var v4 = in_addr()
        if inet_pton(AF_INET, string, &v4) == 1 {
            bytes = withUnsafeBytes(of: &v4) { Array($0) }
            return
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, string, &v6) == 1 {
            bytes = withUnsafeBytes(of: &v6) { Array($0) }
            return
        }
        return nil
    }

    /// True when this address is in `network`/`prefixLength` (same family only).
    func isIn(_ network: IPAddress, prefixLength: Int) -> Bool {
        guard bytes.count == network.bytes.count, prefixLength >= 0, prefixLength <= bytes.count * 8 else { return false }
        let whole = prefixLength / 8
        if bytes[..<whole] != network.bytes[..<whole] { return false }
        let remaining = prefixLength % 8
        guard remaining > 0 else { return true }
        let mask = UInt8(0xFF) << (8 - remaining)
        return bytes[whole] & mask == network.bytes[whole] & mask
    }
}

private func asciiLowercased(_ text: some StringProtocol) -> String {
    String(decoding: text.utf8.map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 + 32 : $0 }, as: UTF8.self)
}

private func isHexDigit(_ byte: UInt8) -> Bool {
    (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
        || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "F"))
}

/// Letters, digits, `-`, `.` and `_` (seen in internal names).
private func isHostNameByte(_ byte: UInt8) -> Bool {
    (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
        || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
        || byte == UInt8(ascii: "_")
}

private func isSchemeByte(_ byte: UInt8) -> Bool {
    isHostNameByte(byte) && byte != UInt8(ascii: "_") || byte == UInt8(ascii: "+")
}

/// 1...65535 from ASCII digits only.
private func parsePort(_ text: some StringProtocol) -> Int? {
    guard !text.isEmpty, text.utf8.count <= 5, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
          let number = Int(text), (1...65535).contains(number)
    else { return nil }
    return number
}
