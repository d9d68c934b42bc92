// Provider layer: the hosts that bypass the proxy (`NO_PROXY`), parsed once into rules and
// matched per request without DNS.

import Foundation

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
            let entry = HostSyntax.asciiLowercased(raw)
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
        let normalized = HostSyntax.asciiLowercased(name)
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
                guard let number = HostSyntax.parsePort(rest.dropFirst()) else { return nil }
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
                guard let number = HostSyntax.parsePort(hostPart[hostPart.index(after: colon)...]) else { return nil }
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
        guard !hostPart.isEmpty, hostPart.utf8.allSatisfy(HostSyntax.isHostNameByte), !hostPart.hasPrefix(".") else { return nil }
        return .domain(String(hostPart), port: port)
    }
}
