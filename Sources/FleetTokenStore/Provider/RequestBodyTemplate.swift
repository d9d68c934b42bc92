import Foundation

/// The body of a POST to the token provider, with `{kind}` and `{id}` filled in per key
/// (`--body-template '{"vehicleId":"{id}"}' --content-type application/json`). A pure value.
///
/// How a value is written depends on the content type (parameters such as `charset` aside):
/// - JSON (`application/json`, any `…+json`): escaped as the inside of a JSON string (RFC 8259:
///   `"` and `\` backslash-escaped, U+0000–U+001F, U+2028 and U+2029 as `\uXXXX`; other
///   characters as UTF-8). Each placeholder must therefore sit inside a JSON string of the
///   template, e.g. `{"vehicleId":"{id}","kind":"{kind}"}`; this is checked at init.
/// - Form (`application/x-www-form-urlencoded`): percent-encoded UTF-8, keeping only RFC 3986
///   unreserved characters (`A–Z a–z 0–9 - . _ ~`); a space becomes `%20` (not `+`, which every
///   form decoder also reads as a space), so `&`, `=`, `+` and `%` in an id stay data.
/// - `text/plain`: the value as is.
///
/// Only the exact placeholders `{kind}` (``TokenKind``'s raw value, e.g. `deliveryVehicle`) and
/// `{id}` are replaced, in one pass: an id containing `{kind}` stays as it is.
public struct RequestBodyTemplate: Sendable, Equatable {
    /// How placeholders are written into the body.
    public enum Encoding: String, Sendable, Equatable {
        /// JSON string escaping.
        case json
        /// `application/x-www-form-urlencoded` percent-encoding.
        case form
        /// Raw substitution (`text/plain`).
        case plainText
    }

    enum Segment: Sendable, Equatable {
        case literal(String)
        case kind
        case id
    }

    /// The template as given.
    public let template: String
    /// The content type as given, for the request's `Content-Type` header.
    public let contentType: String
    /// How placeholders are written, from ``contentType``.
    public let encoding: Encoding
    let segments: [Segment]

    /// Checks a template for a content type.
    ///
    /// - Throws: ``RequestBodyTemplateError``: a content type other than JSON, form or
    ///   `text/plain`; a `{name}` that is not `{kind}` or `{id}` (a misspelt placeholder); a JSON
    ///   template that is not valid JSON once filled in (strict RFC 8259: a trailing comma,
    ///   which Foundation's own parser lets through, is refused), or has a placeholder outside
    ///   a string.
    ///   The error quotes neither the template nor more of it than the placeholder at fault.
    public init(_ template: String, contentType: String) throws(RequestBodyTemplateError) {
        guard let encoding = Self.encoding(of: contentType) else {
            let mediaType = contentType.split(separator: ";", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            throw RequestBodyTemplateError(code: .unsupportedContentType, detail: shortened(mediaType.trimmingCharacters(in: .whitespaces)))
        }
        self.template = template
        self.contentType = contentType
        self.encoding = encoding
        self.segments = try Self.segments(of: template)
        if encoding == .json { try validateJSON() }
    }

    /// The body for `key`.
    public func render(for key: TokenKey) -> String {
        render(kind: key.kind.rawValue, id: key.subjectID)
    }

    /// The body with `kind` and `id` encoded for ``encoding``; any strings (tests and the init's
    /// check use ids that ``TokenKey`` would refuse).
    func render(kind: String, id: String) -> String {
        let encodedKind = Self.encode(kind, as: encoding), encodedID = Self.encode(id, as: encoding)
        var body = ""
        for segment in segments {
            switch segment {
            case .literal(let text): body += text
            case .kind: body += encodedKind
            case .id: body += encodedID
            }
        }
        return body
    }

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

    /// Splits the template at `{kind}` and `{id}`; any other `{identifier}` is refused. Scans
    /// UTF-8 bytes: as Characters, a prepend character before `{` would hide a placeholder.
    private static func segments(of template: String) throws(RequestBodyTemplateError) -> [Segment] {
        let bytes = Array(template.utf8)
        func isNameByte(_ byte: UInt8) -> Bool {
            (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z")) || (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z"))
                || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9")) || byte == UInt8(ascii: "_")
        }
        var segments: [Segment] = []
        var literalStart = 0, index = 0
        while index < bytes.count {
            guard bytes[index] == UInt8(ascii: "{") else { index += 1; continue }
            var end = index + 1
            while end < bytes.count, isNameByte(bytes[end]) { end += 1 }
            let name = bytes[(index + 1)..<end]
            guard let first = name.first, !(first >= UInt8(ascii: "0") && first <= UInt8(ascii: "9")),
                  end < bytes.count, bytes[end] == UInt8(ascii: "}")
            else { index += 1; continue }
            let placeholder: Segment
            switch String(decoding: name, as: UTF8.self) {
            case "kind": placeholder = .kind
            case "id": placeholder = .id
            case let other: throw RequestBodyTemplateError(code: .unknownPlaceholder, detail: shortened("{\(other)}"))
            }
            if literalStart < index { segments.append(.literal(String(decoding: bytes[literalStart..<index], as: UTF8.self))) }
            segments.append(placeholder)
            index = end + 1
            literalStart = index
        }
        if literalStart < bytes.count { segments.append(.literal(String(decoding: bytes[literalStart...], as: UTF8.self))) }
        return segments
    }

    /// A JSON template must give valid JSON with values that need escaping, each placeholder
    /// landing inside a string (a value or a member name).
    private func validateJSON() throws(RequestBodyTemplateError) {
        let sampleKind = TokenKind.deliveryVehicle.rawValue
        let sampleID = "sample \"id\" \\ 1\u{0A}é"
        let sample = render(kind: sampleKind, id: sampleID)
        guard StrictJSONSyntax.isValid(Array(sample.utf8)), let document = JSONValue.parse(Data(sample.utf8)) else {
            // Valid with each placeholder as a whole JSON string: they were left unquoted.
            let quoted = segments.map { segment in
                switch segment {
                case .literal(let text): text
                case .kind: "\"k\""
                case .id: "\"i\""
                }
            }.joined()
            if segments.contains(where: { $0 == .kind || $0 == .id }), StrictJSONSyntax.isValid(Array(quoted.utf8)) {
                let names = [(Segment.id, "{id}"), (.kind, "{kind}")].filter { segments.contains($0.0) }.map(\.1)
                throw RequestBodyTemplateError(code: .placeholderOutsideString, detail: names.joined(separator: " and "))
            }
            throw RequestBodyTemplateError(code: .invalidJSON, detail: "")
        }
        var strings: [String] = []
        Self.collectStrings(document, into: &strings)
        let placeholders: [(Segment, String, String)] = [(.id, "{id}", sampleID), (.kind, "{kind}", sampleKind)]
        for (segment, name, sample) in placeholders where segments.contains(segment) {
            guard strings.contains(where: { containsUTF8($0, sample) }) else {
                throw RequestBodyTemplateError(code: .placeholderOutsideString, detail: name)
            }
        }
    }

    private static func collectStrings(_ value: JSONValue, into strings: inout [String]) {
        switch value {
        case .string(let text): strings.append(text)
        case .array(let items): for item in items { collectStrings(item, into: &strings) }
        case .object(let members):
            for (name, member) in members {
                strings.append(name)
                collectStrings(member, into: &strings)
            }
        default: break
        }
    }
}

/// Why a request body template cannot be used: a usage error, raised before any request.
///
/// Its text names the placeholder or content type at fault, never the whole template.
public struct RequestBodyTemplateError: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong; more codes may come.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        /// A short, stable name.
        public let name: String
        /// The content type is not JSON, form or `text/plain`.
        public static let unsupportedContentType = Code(name: "unsupportedContentType")
        /// A `{name}` other than `{kind}` and `{id}`.
        public static let unknownPlaceholder = Code(name: "unknownPlaceholder")
        /// A JSON template that is not valid JSON once filled in.
        public static let invalidJSON = Code(name: "invalidJSON")
        /// A JSON template with a placeholder outside any JSON string.
        public static let placeholderOutsideString = Code(name: "placeholderOutsideString")
        /// The name.
        public var description: String { name }
    }

    /// What is wrong.
    public let code: Code
    /// The content type or placeholder at fault (shortened), or empty.
    public let detail: String

    /// Creates the error.
    public init(code: Code, detail: String) {
        self.code = code
        self.detail = detail
    }

    /// What is wrong and what to do.
    public var description: String {
        switch code {
        case .unsupportedContentType:
            "the body's content type \"\(detail)\" is not supported: use application/json (or a +json type), application/x-www-form-urlencoded, or text/plain"
        case .unknownPlaceholder:
            "the body template contains \(detail), which is not a placeholder: use {id} (the subject id) and {kind} (vehicle, trip, deliveryVehicle or task)"
        case .invalidJSON:
            "the body template is not valid JSON once {id} and {kind} are filled in: put each placeholder inside a JSON string, e.g. {\"vehicleId\":\"{id}\"}, and check quotes and braces"
        case .placeholderOutsideString:
            "\(detail) in the JSON body template must be inside a JSON string, where it is filled in escaped: quote it, e.g. {\"vehicleId\":\"{id}\"}"
        default:
            "the body template cannot be used (\(code))"
        }
    }
}

/// At most 60 characters of `text`, control characters as `?`.
private func shortened(_ text: some StringProtocol) -> String {
    let clean = String(String.UnicodeScalarView(text.unicodeScalars.map { $0.properties.generalCategory == .control ? "?" : $0 }))
    return clean.count > 60 ? String(clean.prefix(60)) + "…" : clean
}

/// Substring search on UTF-8 bytes: a Character search misses the sample when the template puts
/// a combining mark right after the placeholder.
private func containsUTF8(_ text: String, _ part: String) -> Bool {
    let haystack = Array(text.utf8), needle = Array(part.utf8)
    guard needle.count <= haystack.count else { return false }
    return (0...(haystack.count - needle.count)).contains { haystack[$0..<($0 + needle.count)].elementsEqual(needle) }
}

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
