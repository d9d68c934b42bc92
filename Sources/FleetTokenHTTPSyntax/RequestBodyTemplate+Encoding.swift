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
            return PercentEncoding.encode(value)
        }
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
