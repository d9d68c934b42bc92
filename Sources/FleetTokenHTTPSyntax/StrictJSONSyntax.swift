// Provider layer: a strict RFC 8259 syntax check, for JSON body templates that stricter servers
// than Foundation's parser will read.

/// RFC 8259 syntax, strictly: Foundation's parser also takes trailing commas (`{"a":1,}`), which
/// stricter servers refuse. Nesting deeper than 512 counts as invalid.
enum StrictJSONSyntax {
    static func isValid(_ bytes: [UInt8]) -> Bool {
        var index = 0
        func peek() -> UInt8? { index < bytes.count ? bytes[index] : nil }
        func skipSpace() { while let byte = peek(), byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D { index += 1 } }
        func take(_ byte: UInt8) -> Bool {
            guard peek() == byte else { return false }
            index += 1
            return true
        }
        func digits() -> Int {
            let start = index
            while let byte = peek(), byte >= 0x30, byte <= 0x39 { index += 1 }
            return index - start
        }
        func literal(_ word: String) -> Bool { word.utf8.allSatisfy { take($0) } }
        func string() -> Bool {
            guard take(UInt8(ascii: "\"")) else { return false }
            while let byte = peek() {
                index += 1
                switch byte {
                case UInt8(ascii: "\""): return true
                case 0x00..<0x20: return false
                case UInt8(ascii: "\\"):
                    guard let escaped = peek() else { return false }
                    index += 1
                    if escaped == UInt8(ascii: "u") {
                        for _ in 0..<4 {
                            guard let hex = peek(), (0x30...0x39).contains(hex) || (0x41...0x46).contains(hex) || (0x61...0x66).contains(hex)
                            else { return false }
                            index += 1
                        }
                    } else if !"\"\\/bfnrt".utf8.contains(escaped) {
                        return false
                    }
                default: break
                }
            }
            return false
        }
        func number() -> Bool {
            _ = take(UInt8(ascii: "-"))
            if take(UInt8(ascii: "0")) {} else if digits() == 0 { return false }
            if take(UInt8(ascii: ".")), digits() == 0 { return false }
            if take(UInt8(ascii: "e")) || take(UInt8(ascii: "E")) {
                _ = take(UInt8(ascii: "+")) || take(UInt8(ascii: "-"))
                if digits() == 0 { return false }
            }
            return true
        }
        func value(depth: Int) -> Bool {
            guard depth < 512 else { return false }
            skipSpace()
            let valid: Bool
            switch peek() {
            case UInt8(ascii: "{"):
                index += 1
                skipSpace()
                if take(UInt8(ascii: "}")) { valid = true; break }
                repeat {
                    skipSpace()
                    guard string() else { return false }
                    skipSpace()
                    guard take(UInt8(ascii: ":")), value(depth: depth + 1) else { return false }
                    skipSpace()
                } while take(UInt8(ascii: ","))
                valid = take(UInt8(ascii: "}"))
            case UInt8(ascii: "["):
                index += 1
                skipSpace()
                if take(UInt8(ascii: "]")) { valid = true; break }
                repeat {
                    guard value(depth: depth + 1) else { return false }
                    skipSpace()
                } while take(UInt8(ascii: ","))
                valid = take(UInt8(ascii: "]"))
            case UInt8(ascii: "\""): valid = string()
            case UInt8(ascii: "t"): valid = literal("true")
            case UInt8(ascii: "f"): valid = literal("false")
            case UInt8(ascii: "n"): valid = literal("null")
            default: valid = number()
            }
            skipSpace()
            return valid
        }
        return value(depth: 0) && index == bytes.count
    }
}
