// Service layer: hand-written JSON string literals, used where Foundation's
// serializer costs too much per call (the token route's body, every line of the agent's JSON log).

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
                case _ where scalar.value < 0x20:
                    output += "\\u00" + String(scalar.value >> 4, radix: 16) + String(scalar.value & 0xF, radix: 16)
                default: output.unicodeScalars.append(scalar)
                }
            }
        }
        output += "\""
    }

    /// Whether `text` goes into a literal as it is. Over the string's own bytes where it has
    /// them (a native string always does): through the UTF-8 view's iterator this check was
    /// 2.5% of the token API's CPU time under load (perf, an 830-byte token per answer).
    private static func needsNoEscape(_ text: String) -> Bool {
        @inline(__always) func plain(_ byte: UInt8) -> Bool {
            byte >= 0x20 && byte != UInt8(ascii: "\"") && byte != UInt8(ascii: "\\")
        }
        if let answer = text.utf8.withContiguousStorageIfAvailable({ bytes in bytes.allSatisfy(plain) }) { return answer }
        return text.utf8.allSatisfy(plain)
    }
}
