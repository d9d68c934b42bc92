// Transport layer: how HTTPTokenFetcher words a failed exchange. AsyncHTTPClient, NIO and TLS
// errors become TokenProviderErrors an operator can act on, quoting no header value.

import AsyncHTTPClient
import FleetTokenStore
import NIOCore
import NIOSSL

extension HTTPTokenFetcher {
    /// What a failed exchange means for the engine, worded for the operator.
    func mapTransportError(_ error: any Error) -> TokenProviderError {
        if let error = error as? HTTPClientError {
            let via = proxy.map { " (through the proxy \($0.host):\($0.port))" } ?? ""
            switch error {
            case .proxyAuthenticationRequired:
                return .unreachable(detail: "the proxy \(proxy.map { "\($0.host):\($0.port)" } ?? "") asked for credentials (HTTP 407): check the user and password in HTTPS_PROXY, HTTP_PROXY or the proxy setting")
            case .invalidProxyResponse:
                // Some proxies answer a wrong password with 401 rather than 407, which lands here too.
                let credentials = proxy?.credentials == nil ? "" : "check the user and password in HTTPS_PROXY, HTTP_PROXY or the proxy setting, and "
                return .unreachable(detail: "the proxy \(proxy.map { "\($0.host):\($0.port)" } ?? "") refused to open a tunnel to the provider: \(credentials)check that it allows CONNECT to the provider's host and port, or list the host in NO_PROXY")
            case .httpProxyHandshakeTimeout:
                return .timeout(seconds: configuration.connectTimeout)
            case .connectTimeout: return .timeout(seconds: configuration.connectTimeout)
            case .deadlineExceeded, .readTimeout, .writeTimeout: return .timeout(seconds: configuration.totalTimeout)
            // shortDescription: the full description can quote header values (our credential).
            default: return .unreachable(detail: error.shortDescription + via)
            }
        }
        if error is NIOTooManyBytesError { return .bodyTooLarge(limitBytes: configuration.maximumBodyBytes) }
        if error is NIOSSLError || error is NIOSSLExtraError || error is BoringSSLError {
            let text = Self.safeText(String(describing: error))
            // Certificate verification, hostname and the server's certificate-related alerts
            // (a missing or refused client certificate) are configuration problems, said so.
            let markers = ["CERTIFICATE", "certificate", "hostname", "HANDSHAKE_FAILURE", "UNKNOWN_CA", "BAD_CERTIFICATE"]
            if markers.contains(where: text.contains) { return .tlsCertificate(detail: text) }
            return .unreachable(detail: "TLS: " + text)
        }
        if error is CancellationError { return .other(detail: "cancelled") }
        let via = proxy.map { " (through the proxy \($0.host):\($0.port))" } ?? ""
        return .unreachable(detail: String(describing: type(of: error)) + ": " + Self.safeText(String(describing: error)) + via)
    }

    /// Error text from the transport, cut short and stripped of control characters.
    static func safeText(_ text: String) -> String {
        String(text.unicodeScalars.filter { !$0.properties.isWhitespace || $0 == " " }.prefix(200).map(Character.init))
    }
}
