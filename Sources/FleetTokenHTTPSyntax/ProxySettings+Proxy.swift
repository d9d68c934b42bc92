// Provider layer: one forward proxy, as a proxy URL names it
// (`[http://][user:password@]host[:port]`), and its credentials, which no description, dump or
// error ever shows.

import Foundation

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
            switch parts.scheme.map(HostSyntax.asciiLowercased) {
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
                host = HostSyntax.asciiLowercased(address)
                let rest = hostPort[hostPort.index(after: close)...]
                if !rest.isEmpty {
                    guard rest.first == ":" else { throw fail(.invalidHost) }
                    portText = rest.dropFirst()
                }
            } else {
                let pieces = hostPort.split(separator: ":", omittingEmptySubsequences: false)
                guard pieces.count <= 2 else { throw fail(.invalidHost) }
                let name = pieces[0]
                guard !name.isEmpty, name.utf8.allSatisfy(HostSyntax.isHostNameByte) else { throw fail(.invalidHost) }
                host = HostSyntax.asciiLowercased(name)
                portText = pieces.count == 2 ? pieces[1] : nil
            }
            if let portText {
                guard let number = HostSyntax.parsePort(portText) else { throw fail(.invalidPort) }
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
