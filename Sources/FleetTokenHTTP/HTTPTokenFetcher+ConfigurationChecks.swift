// Transport layer: HTTPTokenFetcher's checks of its configuration before any request is sent:
// the URL template, method and body, TLS material on http, and every header.

import FleetTokenStore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

extension HTTPTokenFetcher {
    /// Refuses a configuration the fetcher cannot use safely.
    static func check(_ configuration: HTTPTokenFetcherConfiguration) throws(HTTPFetcherConfigurationError) {
        let template = configuration.urlTemplate
        guard template.contains("{id}") || configuration.body?.template.contains("{id}") == true else {
            throw .missingIDPlaceholder(template)
        }
        if configuration.body != nil && configuration.method == .get {
            throw .request("a body template needs the POST method")
        }
        let probe = probeURL(template)
        guard let url = URL(string: probe), let scheme = url.scheme?.lowercased(), ["http", "https"].contains(scheme),
              let host = url.host, !host.isEmpty else {
            throw .invalidURL(template)
        }
        let loopback = isLoopback(host)
        if scheme == "http" && !loopback && !configuration.allowInsecureHTTP { throw .insecureHTTP(host: host) }
        if scheme == "http" && !configuration.tls.isDefault {
            throw .tls("CA files and client certificates apply to https:// provider URLs, not \(template)")
        }
        for header in configuration.headers {
            try checkHeader(name: header.name, value: header.value)
        }
        for file in configuration.headerFiles {
            try checkHeader(name: file.name, value: "")
        }
    }

    /// The template with sample values, to check it and choose its proxy.
    static func probeURL(_ template: String) -> String {
        template.replacingOccurrences(of: "{kind}", with: "vehicle").replacingOccurrences(of: "{id}", with: "x")
    }

    /// Checks one header as the fetcher would send it (for a header file, pass an empty value:
    /// the file is read at each request).
    /// - Throws: ``HTTPFetcherConfigurationError/invalidHeader(_:)``, whose text never quotes
    ///   the value, nor a name that is not a valid header name (a misplaced colon can put a
    ///   credential there: `Authorization Bearer abc: x`).
    public static func checkHeader(name: String, value: String) throws(HTTPFetcherConfigurationError) {
        let tokenCharacters = CharacterSet(charactersIn: "!#$%&'*+-.^_`|~").union(.alphanumerics)
        guard !name.isEmpty, name.unicodeScalars.allSatisfy({ $0.isASCII && tokenCharacters.contains($0) }) else {
            throw .invalidHeader("the header name is not valid (only letters, digits and !#$%&'*+-.^_`|~ are allowed; not shown, since a misplaced colon can put a credential in it)")
        }
        guard isValidHeaderValue(value) else {
            throw .invalidHeader("the value of \(name) contains a control character (CR, LF, NUL, DEL...)")
        }
    }

    /// RFC 9110 field values: visible bytes, spaces and tabs; no CR, LF, NUL or DEL. Checked on
    /// bytes, because Swift compares "\r\n" as one character.
    static func isValidHeaderValue(_ value: String) -> Bool {
        value.utf8.allSatisfy { $0 == 0x09 || ($0 >= 0x20 && $0 != 0x7F) }
    }

    /// Loopback only when the host is literally an IPv4 127/8 address, `::1` or `localhost`
    /// (`127.example.com` is a name that can resolve anywhere).
    static func isLoopback(_ host: String) -> Bool {
        let bare = host.trimmingCharacters(in: CharacterSet(charactersIn: "[]"))
        if bare == "localhost" || bare == "::1" { return true }
        var address = in_addr()
        return inet_pton(AF_INET, bare, &address) == 1 && bare.hasPrefix("127.")
    }
}
