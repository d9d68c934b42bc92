// Service layer: which host names and addresses are loopback, parsed (never prefix-matched),
// for listen addresses and for the Host header of requests to a TCP listener. Pure rules.

#if canImport(Glibc)
import Glibc
#endif

/// Loopback hosts: `localhost`, an IPv4 literal in `127.0.0.0/8`, or the IPv6 literal `::1`.
package enum LoopbackHost {
    /// True when `host` (without brackets or port) is `localhost` or a loopback address literal.
    /// `127.attacker.example` is a name, not an address, and is not loopback.
    package static func isLoopback(_ host: String) -> Bool {
        if host.lowercased() == "localhost" { return true }
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            return UInt32(bigEndian: v4.s_addr) >> 24 == 127
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 {
            return withUnsafeBytes(of: &v6) { bytes in bytes.dropLast().allSatisfy { $0 == 0 } && bytes.last == 1 }
        }
        return false
    }

    /// True when `host` is an IPv4 or IPv6 address literal (not a name).
    package static func isAddressLiteral(_ host: String) -> Bool {
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, host, &v4) == 1 || inet_pton(AF_INET6, host, &v6) == 1
    }

    /// The host part of a Host header value (`name`, `name:port`, `[v6]`, `[v6]:port`), or nil
    /// when it is not of that form.
    static func hostOfHeader(_ value: String) -> String? {
        if value.hasPrefix("[") {
            guard let close = value.firstIndex(of: "]") else { return nil }
            let rest = value[value.index(after: close)...]
            guard rest.isEmpty || isPort(rest) else { return nil }
            return String(value[value.index(after: value.startIndex)..<close])
        }
        guard let colon = value.firstIndex(of: ":") else { return value.isEmpty ? nil : value }
        guard isPort(value[colon...]) else { return nil }
        let host = value[..<colon]
        return host.isEmpty ? nil : String(host)
    }

    /// True when a request to a TCP listener bound to `listenHost` may carry this Host header:
    /// loopback names and literals, or the listener's own host as given to `--listen` (a
    /// non-loopback listener that an operator allowed).
    package static func isAllowedHostHeader(_ value: String, listenHost: String) -> Bool {
        guard let host = hostOfHeader(value) else { return false }
        return isLoopback(host) || host.lowercased() == listenHost.lowercased()
    }

    /// `:` followed by one to five digits.
    private static func isPort(_ text: Substring) -> Bool {
        let digits = text.dropFirst()
        return text.first == ":" && (1...5).contains(digits.count) && digits.allSatisfy { $0.isASCII && $0.isNumber }
    }
}
