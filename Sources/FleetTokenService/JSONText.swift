// Service layer: hand-written JSON string literals, used where Foundation's
// serializer costs too much per call (the token route's body, every line of the agent's JSON log).

import NIOCore

/// JSON string literals without Foundation's serializer.
package enum JSONText {
    /// `text` as a JSON string literal (RFC 8259: quote and backslash escaped, control
    /// characters as `\u00XX`; the rest as UTF-8).
    package static func quoted(_ text: String) -> String {
        var result = ""
        result.reserveCapacity(text.utf8.count + 2)
        appendQuoted(text, to: &result)
        return result
    }

    /// Appends `text` to `output` as a JSON string literal, escaped as ``quoted(_:)`` does.
    ///
    /// A Swift `String` always holds valid Unicode (invalid UTF-8 or a lone UTF-16 surrogate
    /// became U+FFFD when the string was decoded), so the result is always valid JSON.
    package static func appendQuoted(_ text: String, to output: inout String) {
        output += "\""
        // Tokens are base64url and dots, most log text is plain: nothing to escape, one copy.
        if needsNoEscape(text) {
            output += text
        } else {
            for scalar in text.unicodeScalars {
                switch scalar {
                case "\"": output += "\\\""
                case "\\": output += "\\\\"
                case "\n": output += "\\n"
                case "\r": output += "\\r"
                case "\t": output += "\\t"
                case "\u{08}": output += "\\b"
                case "\u{0C}": output += "\\f"
                case _ where scalar.value < 0x20:
                    output += "\\u00" + String(scalar.value >> 4, radix: 16) + String(scalar.value & 0xF, radix: 16)
                default: output.unicodeScalars.append(scalar)
                }
            }
        }
        output += "\""
    }

    /// Writes `text` to `buffer` as a JSON string literal, escaped as ``quoted(_:)`` does; a
    /// text with nothing to escape is copied once, straight into the buffer.
    static func writeQuoted(_ text: String, to buffer: inout ByteBuffer) {
        guard needsNoEscape(text) else {
            buffer.writeString(quoted(text))
            return
        }
        buffer.writeInteger(UInt8(ascii: "\""))
        buffer.writeString(text)
        buffer.writeInteger(UInt8(ascii: "\""))
    }

    /// Whether `text` goes into a literal as it is. Over the string's own bytes where it has
    /// them (a native string always does): through the UTF-8 view's iterator this check was
    /// 2.5% of the token API's CPU time under load (perf, an 830-byte token per answer), and
    /// byte by byte still 1.6%.
    private static func needsNoEscape(_ text: String) -> Bool {
        if let answer = text.utf8.withContiguousStorageIfAvailable(isPlain) { return answer }
        return text.utf8.allSatisfy(isPlain)
    }

    @inline(__always) private static func isPlain(_ byte: UInt8) -> Bool {
        byte >= 0x20 && byte != UInt8(ascii: "\"") && byte != UInt8(ascii: "\\")
    }

    /// Whether every byte is plain, eight at a time: a word has a byte below 0x20 when
    /// `(w - 0x20…20) & ~w & 0x80…80` is not zero, and a byte equal to `b` when `w ^ b…b` has a
    /// zero byte (the same test with 0x01). Neither misses a byte; a borrow can only add bits
    /// above a byte already found.
    private static func isPlain(_ bytes: UnsafeBufferPointer<UInt8>) -> Bool {
        let raw = UnsafeRawBufferPointer(bytes)
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        @inline(__always) func hasByteBelow(_ limit: UInt64, _ word: UInt64) -> Bool {
            (word &- ones &* limit) & ~word & highs != 0
        }
        var offset = 0
        while offset + 8 <= raw.count {
            let word = raw.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
            if hasByteBelow(0x20, word) || hasByteBelow(1, word ^ (ones &* 0x22)) || hasByteBelow(1, word ^ (ones &* 0x5C)) {
                return false
            }
            offset += 8
        }
        while offset < raw.count {
            guard isPlain(raw[offset]) else { return false }
            offset += 1
        }
        return true
    }
}
