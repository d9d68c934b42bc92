// Provider layer: why a proxy URL cannot be used, worded for the operator, never showing the
// password.

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
