// Provider layer: the body of a POST to the token provider, checked once when configured and
// filled in per key. How values are written is in RequestBodyTemplate+Encoding.swift.

public import FleetTokenStore
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
/// Only the exact placeholders `{kind}` (`TokenKind`'s raw value, e.g. `deliveryVehicle`) and
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
    /// landing inside a string (a value or a member name), for every kind: `\u00{kind}` is a
    /// valid escape with `deliveryVehicle` ("de" are hex digits) and invalid with the others.
    private func validateJSON() throws(RequestBodyTemplateError) {
        for kind in TokenKind.allCases { try validateJSON(sampleKind: kind.rawValue) }
    }

    private func validateJSON(sampleKind: String) throws(RequestBodyTemplateError) {
        // Starts with a letter that is neither hex nor an escape: "\u00{id}" or "\{id}" fails.
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
