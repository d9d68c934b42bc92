// Provider layer: the byte-level rules of host names, schemes and ports that proxy URLs and
// `NO_PROXY` entries share. ASCII only: hosts are compared as written, never case-folded by
// Unicode rules.

/// ASCII rules for the parts of a proxy URL and of a `NO_PROXY` entry.
enum HostSyntax {
    /// `text` with only `A`–`Z` lowercased.
    static func asciiLowercased(_ text: some StringProtocol) -> String {
        String(decoding: text.utf8.map { $0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z") ? $0 + 32 : $0 }, as: UTF8.self)
    }

    static func isHexDigit(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "f"))
            || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "F"))
    }

    /// Letters, digits, `-`, `.` and `_` (seen in internal names).
    static func isHostNameByte(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
            || byte == UInt8(ascii: "_")
    }

    static func isSchemeByte(_ byte: UInt8) -> Bool {
        isHostNameByte(byte) && byte != UInt8(ascii: "_") || byte == UInt8(ascii: "+")
    }

    /// 1...65535 from ASCII digits only.
    static func parsePort(_ text: some StringProtocol) -> Int? {
        guard !text.isEmpty, text.utf8.count <= 5, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }),
              let number = Int(text), (1...65535).contains(number)
        else { return nil }
        return number
    }
}
