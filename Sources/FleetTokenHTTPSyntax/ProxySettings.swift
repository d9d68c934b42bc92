// Provider layer: which forward proxy carries a request to the token provider, read from the
// environment as curl reads it, or from the agent's flags. The proxy URL, `NO_PROXY` and the
// errors are in the files beside it.

public import Foundation

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
    /// - Throws: ``ProxySettingsError`` naming the variable (or `the proxy override`) whose
    ///   proxy URL is invalid, with any password shown as `***`.
    public static func fromEnvironment(_ environment: [String: String],
                                       override: Override? = nil) throws(ProxySettingsError) -> ProxySettings {
        let noProxy = Self.variable(environment, "no_proxy", "NO_PROXY").map { NoProxyList($0.value) } ?? NoProxyList("")
        switch override {
        case .direct:
            return .direct
        case .proxy(let url):
            // Named in library terms; a program names it as its operator gave it.
            return ProxySettings(proxy: try Proxy(parsing: url, source: "the proxy override"), noProxy: noProxy)
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
        switch HostSyntax.asciiLowercased(scheme) {
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
