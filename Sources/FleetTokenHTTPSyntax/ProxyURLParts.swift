// Provider layer: a proxy URL split into its parts without validation, shared by the parser
// and the redaction so that both agree on where the password is.

import Foundation

/// A proxy URL split into scheme, user information and host/port, without validation; shared by
/// the parser and the redaction so that both agree on where the password is. Split on UTF-8
/// bytes, not Characters: a combining mark after `@` or `:` must not hide the delimiter.
struct ProxyURLParts {
    /// Before the first `://`, when that is a plausible scheme.
    var scheme: String?
    /// Before the last `@`, up to its first `:` (raw, percent-encoded).
    var username: String?
    /// After that `:` (raw); nil without a colon.
    var password: String?
    /// After the last `@`.
    var hostPort: String

    init(_ text: String) {
        let bytes = Array(text.trimmingCharacters(in: .whitespacesAndNewlines).utf8)
        func string(_ slice: ArraySlice<UInt8>) -> String { String(decoding: slice, as: UTF8.self) }
        var rest = bytes[...]
        if let separator = (0..<max(0, bytes.count - 2)).first(where: { bytes[$0] == UInt8(ascii: ":") && bytes[$0 + 1] == UInt8(ascii: "/") && bytes[$0 + 2] == UInt8(ascii: "/") }),
           separator > 0, bytes[..<separator].allSatisfy(HostSyntax.isSchemeByte) {
            scheme = string(bytes[..<separator])
            rest = bytes[(separator + 3)...]
        }
        if let at = rest.lastIndex(of: UInt8(ascii: "@")) {
            let userInfo = rest[..<at]
            if let colon = userInfo.firstIndex(of: UInt8(ascii: ":")) {
                username = string(userInfo[..<colon])
                password = string(userInfo[(colon + 1)...])
            } else {
                username = string(userInfo)
            }
            rest = rest[(at + 1)...]
        }
        hostPort = string(rest)
    }

    /// The URL with the password as `***`, control characters as `?`, at most 200 characters.
    var redacted: String {
        var text = scheme.map { "\($0)://" } ?? ""
        if let username { text += password == nil ? "\(username)@" : "\(username):***@" }
        text += hostPort
        let shown = String(String.UnicodeScalarView(text.unicodeScalars.map {
            $0.properties.generalCategory == .control ? "?" : $0
        }))
        return shown.count > 200 ? String(shown.prefix(200)) + "…" : shown
    }
}
