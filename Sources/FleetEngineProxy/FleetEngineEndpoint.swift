// Where the Fleet Engine proxy sends calls (`--fleet-engine-url`), parsed and judged, and the
// proxy's set-up errors.

import Foundation
import FleetTokenService

/// Fleet Engine's address as the proxy reaches it: `https://fleetengine.googleapis.com` by
/// default; plain `http://` only to a loopback host (a test's fake, a local relay).
public struct FleetEngineEndpoint: Sendable, Equatable, CustomStringConvertible {
    /// Fleet Engine's own address.
    public static let defaultURL = "https://fleetengine.googleapis.com"

    /// True for `https`: TLS, HTTP/2 negotiated by ALPN. False: HTTP/2 with prior knowledge.
    public let secure: Bool
    /// The host name or address (no brackets).
    public let host: String
    /// The port (443 or 80 unless given).
    public let port: Int

    /// Parses `https://HOST[:PORT]` or, to loopback only, `http://HOST[:PORT]`; a trailing `/` is
    /// allowed, nothing else after the authority.
    /// - Throws: ``FleetEngineProxyError`` saying what to write instead.
    public init(parsing text: String) throws(FleetEngineProxyError) {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "https" || scheme == "http",
              let host = url.host(percentEncoded: false), !host.isEmpty else {
            throw FleetEngineProxyError(.invalidURL, "--fleet-engine-url \"\(text)\": write https://HOST[:PORT], e.g. \(Self.defaultURL)")
        }
        guard url.path.isEmpty || url.path == "/", url.query == nil, url.fragment == nil, url.user == nil, url.password == nil else {
            throw FleetEngineProxyError(.invalidURL, "--fleet-engine-url \"\(text)\": give the scheme, host and port only (the proxy keeps each call's path)")
        }
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        guard scheme == "https" || LoopbackHost.isLoopback(bare) else {
            throw FleetEngineProxyError(.plainHTTP, "--fleet-engine-url \"\(text)\": plain http would send every token in clear; use https (plain http is for a loopback host only)")
        }
        secure = scheme == "https"
        self.host = bare
        port = url.port ?? (secure ? 443 : 80)
    }

    /// `host`, or `host:port` when the port is not the scheme's default (IPv6 in brackets): the
    /// `:authority` of every call sent.
    public var authority: String {
        let name = host.contains(":") ? "[\(host)]" : host
        return port == (secure ? 443 : 80) ? name : "\(name):\(port)"
    }

    /// `https://authority`.
    public var description: String { "\(secure ? "https" : "http")://\(authority)" }
}

/// A Fleet Engine proxy set-up problem, said for an operator.
public struct FleetEngineProxyError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong. More codes may come: match them with `==`, keep a `default`.
    package struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable {
            case invalidURL, plainHTTP, caFile
        }

        fileprivate let value: Value

        /// `--fleet-engine-url` is not an http(s) URL of a host.
        package static let invalidURL = Code(value: .invalidURL)
        /// Plain `http://` to a host off loopback.
        package static let plainHTTP = Code(value: .plainHTTP)
        /// `--fleet-engine-ca-file` cannot be read or holds no certificate.
        package static let caFile = Code(value: .caFile)

        /// The code's name.
        package var description: String { value.rawValue }
    }

    /// What is wrong.
    package let code: Code
    /// What is wrong and what to do.
    public let description: String

    init(_ code: Code, _ description: String) {
        self.code = code
        self.description = description
    }
}
