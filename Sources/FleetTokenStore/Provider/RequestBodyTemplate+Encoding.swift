// Provider layer: how RequestBodyTemplate writes a value for the body's content type: JSON
// string escaping, form percent-encoding, or as is.

import Foundation

extension RequestBodyTemplate {
    /// Writes `value` for `encoding`.
    static func encode(_ value: String, as encoding: Encoding) -> String {
        switch encoding {
        case .plainText:
            return value
        case .json:
            var escaped = ""
            escaped.unicodeScalars.reserveCapacity(value.unicodeScalars.count)
            for scalar in value.unicodeScalars {
                switch scalar {
                case "\"": escaped += "\\\""
                case "\\": escaped += "\\\\"
                case "\u{00}"..."\u{1F}", "\u{2028}", "\u{2029}":
                    let hex = String(scalar.value, radix: 16, uppercase: true)
                    escaped += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
                default: escaped.unicodeScalars.append(scalar)
                }
            }
            return escaped
        case .form:
            var encoded = ""
            for byte in value.utf8 {
                if isUnreserved(byte) {
                    encoded.unicodeScalars.append(Unicode.Scalar(byte))
                } else {
                    encoded += "%" + hexDigits[Int(byte >> 4)] + hexDigits[Int(byte & 0xF)]
                }
            }
            return encoded
        }
    }

    private static let hexDigits = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "A", "B", "C", "D", "E", "F"]

    private static func isUnreserved(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "~")
    }

    /// The encoding a content type asks for; nil when unsupported.
    static func encoding(of contentType: String) -> Encoding? {
        let mediaType = (contentType.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? "")
            .trimmingCharacters(in: .whitespaces).lowercased()
        let parts = mediaType.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, !parts[0].isEmpty, !parts[1].isEmpty else { return nil }
        if mediaType == "application/json" || parts[1].hasSuffix("+json") { return .json }
        if mediaType == "application/x-www-form-urlencoded" { return .form }
        if mediaType == "text/plain" { return .plainText }
        return nil
    }
}
