// Provider layer: an IP address literal and CIDR membership, for proxy hosts and `NO_PROXY`
// entries. Names are never resolved.

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// An IPv4 (4 bytes) or IPv6 (16 bytes) address, parsed with `inet_pton`.
struct IPAddress: Sendable, Equatable {
    let bytes: [UInt8]

    init?(_ text: some StringProtocol) {
        // inet_pton reads a C string: refuse anything else before it could cut at a NUL.
        guard !text.isEmpty, text.utf8.count <= 45, text.utf8.allSatisfy({ HostSyntax.isHexDigit($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: ":") })
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
