// FleetTokenPostgres: the host list of a libpq multi-host URL (`postgres://u@h1:5432,h2:5433/db`)
// and the `host=`/`port=` parameters' lists. Foundation's URLComponents takes one host, so the
// authority's host list is cut out here and the rest of the URL is read with a placeholder host.
import Foundation

/// Reads host lists; pure functions of text. Errors name a host by its position, never by
/// its text: a mistyped URL may have a password where a host should be.
enum PostgresHostList {
    /// The host URLComponents reads in place of the list.
    static let placeholder = "fleet-host-list.invalid"

    /// `url` with its authority's host list replaced by ``placeholder`` (or left alone when it
    /// has none, or no `//`), and the list. Nil when the host list holds characters no host
    /// list has (it may be part of a password).
    static func split(_ url: String) -> (withPlaceholder: String, hostList: String)? {
        guard let schemeEnd = url.range(of: "://") else { return (url, "") }
        let authorityStart = schemeEnd.upperBound
        let authorityEnd = url[authorityStart...].firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? url.endIndex
        let authority = url[authorityStart..<authorityEnd]
        let hostStart = authority.lastIndex(of: "@").map { authority.index(after: $0) } ?? authority.startIndex
        let list = String(authority[hostStart...])
        guard !list.isEmpty else { return (url, "") }
        guard list.unicodeScalars.allSatisfy({ isHostCharacter($0) || $0 == "," || $0 == "[" || $0 == "]" }) else { return nil }
        return (String(url[..<hostStart]) + placeholder + String(url[authorityEnd...]), list)
    }

    /// The hosts of an authority's list (`h1:5432,[::1]:5433,h3`); an empty list is none.
    /// - Throws: ``PostgresURLError`` for an empty entry, a port that is no number or out of
    ///   range, a host with two `:` outside brackets.
    static func hosts(_ list: String) throws(PostgresURLError) -> [PostgresStoreLocation.Host] {
        guard !list.isEmpty else { return [] }
        var hosts: [PostgresStoreLocation.Host] = []
        for (index, entry) in list.split(separator: ",", omittingEmptySubsequences: false).enumerated() {
            let number = index + 1
            let name: Substring, port: Substring?
            if entry.hasPrefix("[") {
                guard let close = entry.firstIndex(of: "]") else { throw .malformed("host \(number) has no ']' after its IPv6 address") }
                name = entry[entry.index(after: entry.startIndex)..<close]
                let rest = entry[entry.index(after: close)...]
                guard rest.isEmpty || rest.hasPrefix(":") else { throw .malformed("host \(number) has text after its ']'") }
                port = rest.isEmpty ? nil : rest.dropFirst()
            } else {
                let parts = entry.split(separator: ":", omittingEmptySubsequences: false)
                guard parts.count <= 2 else { throw .malformed("host \(number) has more than one ':' (write an IPv6 address in brackets)") }
                name = parts[0]
                port = parts.count == 2 ? parts[1] : nil
            }
            guard !name.isEmpty else { throw .malformed("host \(number) of the host list is empty") }
            guard name.unicodeScalars.allSatisfy(isHostCharacter) else { throw .malformed("host \(number) is not a host name") }
            var value = 5432
            if let port, !port.isEmpty {
                guard port.unicodeScalars.allSatisfy({ ("0"..."9").contains($0) }), port.count <= 9, let parsed = Int(port) else {
                    throw .malformed("the port of host \(number) is not a number")
                }
                guard (1...65535).contains(parsed) else { throw .malformed("port \(parsed) of host \(number) is out of range") }
                value = parsed
            }
            hosts.append(.init(name: String(name), port: value))
        }
        return hosts
    }

    /// Whether each entry of an authority's list has a host's shape (`name`, `name:digits`,
    /// `[address]`, `[address]:digits`), a port's range aside: what ``PostgresStoreLocation/redacted(_:)`` shows.
    static func hasHostShape(_ list: String) -> Bool {
        list.split(separator: ",", omittingEmptySubsequences: false).allSatisfy { entry in
            var rest = entry
            if entry.hasPrefix("[") {
                guard let close = entry.firstIndex(of: "]") else { return false }
                rest = entry[entry.index(after: close)...]
                guard rest.isEmpty || rest.hasPrefix(":") else { return false }
            } else {
                guard !entry.isEmpty else { return false }
                rest = entry[(entry.firstIndex(of: ":") ?? entry.endIndex)...]
            }
            return rest.isEmpty || rest.dropFirst().unicodeScalars.allSatisfy { ("0"..."9").contains($0) }
        }
    }

    /// The names of a `host=` value (`db1,db2`), nil unless each is a plain host name or address.
    static func names(_ value: String) -> [String]? {
        let names = value.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
        guard names.allSatisfy({ !$0.isEmpty && $0.unicodeScalars.allSatisfy(isHostCharacter) }) else { return nil }
        return names
    }

    /// The ports of a `port=` value (`5432,5433`), nil unless each is a number from 1 to 65535.
    static func ports(_ value: String) -> [Int]? {
        var ports: [Int] = []
        for text in value.split(separator: ",", omittingEmptySubsequences: false) {
            guard !text.isEmpty, text.count <= 5, text.unicodeScalars.allSatisfy({ ("0"..."9").contains($0) }),
                  let port = Int(text), (1...65535).contains(port) else { return nil }
            ports.append(port)
        }
        return ports
    }

    /// Letters, digits, `.`, `-`, `_`, and `:` (IPv6; outside brackets only in `host=`).
    static func isHostCharacter(_ scalar: Unicode.Scalar) -> Bool {
        ("a"..."z").contains(scalar) || ("A"..."Z").contains(scalar) || ("0"..."9").contains(scalar)
            || scalar == "." || scalar == "-" || scalar == "_" || scalar == ":"
    }
}
