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
        if equalsIgnoringASCIICase(host, "localhost") { return true }
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
        // Byte searches: every request to a TCP listener meets this rule.
        if value.utf8.first == UInt8(ascii: "[") {
            guard let close = value.utf8.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            let rest = value[value.index(after: close)...]
            guard rest.isEmpty || isPort(rest) else { return nil }
            return String(value[value.index(after: value.startIndex)..<close])
        }
        guard let colon = value.utf8.firstIndex(of: UInt8(ascii: ":")) else { return value.isEmpty ? nil : value }
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

    /// `:` followed by one to five ASCII digits.
    private static func isPort(_ text: Substring) -> Bool {
        let bytes = text.utf8
        return bytes.first == UInt8(ascii: ":") && (2...6).contains(bytes.count)
            && bytes.dropFirst().allSatisfy { (UInt8(ascii: "0")...UInt8(ascii: "9")).contains($0) }
    }

    /// True when `text` and `other` are equal but for the case of ASCII letters, as header
    /// values and host names compare (no Unicode case mapping, nothing allocated).
    package static func equalsIgnoringASCIICase(_ text: some StringProtocol, _ other: some StringProtocol) -> Bool {
        text.utf8.elementsEqual(other.utf8) { asciiLowercased($0) == asciiLowercased($1) }
    }

    @inline(__always) private static func asciiLowercased(_ byte: UInt8) -> UInt8 {
        (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) ? byte | 0x20 : byte
    }
}
