// libFuzzer harness for `RequestBodyTemplate`: `init(_:contentType:)` on fuzzed templates and
// content types, and `render(for:)` on fuzzed ids.
//
// Input: byte 0 picks the configuration; the rest is the template, the subject id and a content
// type, separated by 0xFF.
//   byte 0, bits 0-2: content type: application/json, application/problem+json; charset=utf-8,
//                     application/x-www-form-urlencoded, text/plain, APPLICATION/JSON,
//                     Application/X-WWW-Form-Urlencoded; charset=utf-8, text/plain; charset=utf-8,
//                     or the third field
//           bit 3: use the encoding's fixed template (below) instead of the first field
//           bits 4-5: kind (vehicle, trip, deliveryVehicle, task)
//
// Properties: no crash; an error's text stays short and never quotes a long template; a JSON
// body from an accepted template parses, and a string in it contains the id (the fixed
// template gives it back exactly); a form body gets no `&`, `=`, `+` or space from the id, and
// the fixed template's field decodes back to the id; a plain-text body contains the id.

// @testable: the harness reads bodies with the library's own JSON reader, JSONValue, which is
// package-only (the fuzz build is a debug build, so testing is enabled).
import FleetTokenHTTPSyntax
@testable import FleetTokenStore
import Foundation
import FuzzSupport

let contentTypes = [
    "application/json", "application/problem+json; charset=utf-8", "application/x-www-form-urlencoded", "text/plain",
    "APPLICATION/JSON", "Application/X-WWW-Form-Urlencoded; charset=utf-8", "text/plain; charset=utf-8",
]
let fixedTemplates: [RequestBodyTemplate.Encoding: String] = [
    .json: #"{"id":"{id}","kind":"{kind}","nested":{"path":["vehicles/{id}"]}}"#,
    .form: "id={id}&kind={kind}",
    .plainText: "{kind}/{id}",
]
let kinds: [TokenKind] = [.vehicle, .trip, .deliveryVehicle, .task]

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzBodyTemplate(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    let input = FuzzInput(data, size)
    let configuration = Int(input.selector(0))
    var fields = input.payload(after: 1).split(separator: 0xFF, maxSplits: 2, omittingEmptySubsequences: false)
        .map { String(decoding: $0, as: UTF8.self) }
    while fields.count < 3 { fields.append("") }
    let contentType = configuration & 7 < contentTypes.count ? contentTypes[configuration & 7] : fields[2]
    let useFixed = configuration & 8 != 0
    let kind = kinds[configuration >> 4 & 3]

    var templateText = fields[0]
    if useFixed, let encoding = encodingOf(contentType) {
        templateText = fixedTemplates[encoding]!
    }

    let template: RequestBodyTemplate
    do {
        template = try RequestBodyTemplate(templateText, contentType: contentType)
    } catch {
        checkError(error, template: templateText, contentType: contentType)
        return 0
    }
    require(template == (try? RequestBodyTemplate(templateText, contentType: contentType)), "init is not deterministic")
    require(template.template == templateText && template.contentType == contentType, "the template or content type changed")

    // An id a key accepts (control characters, as TokenKey refuses them, become spaces).
    let id = String(String.UnicodeScalarView(fields[1].unicodeScalars.map { $0.properties.generalCategory == .control ? " " : $0 }))
    guard let key = try? TokenKey(kind: kind, subjectID: id), let plain = try? TokenKey(kind: kind, subjectID: "x") else { return 0 }
    let body = template.render(for: key)
    let hasID = contains(templateText, "{id}")
    let fixed = templateText == fixedTemplates[template.encoding]

    switch template.encoding {
    case .json:
        guard let document = JSONValue.parse(Data(body.utf8)) else {
            require(false, "an accepted JSON template rendered invalid JSON for id \(String(reflecting: id)): \(body)")
            return 0
        }
        if hasID { require(strings(in: document).contains { contains($0, id) }, "the id is in no JSON string: \(body)") }
        if fixed {
            let object = document.objectValue
            require(object?["id"] == .string(id) && object?["kind"] == .string(kind.rawValue), "the id did not round-trip: \(body)")
        }
    case .form:
        let reference = template.render(for: plain)
        for delimiter in ["&", "=", "+", " "] {
            let byte = delimiter.utf8.first!
            require(body.utf8.count(where: { $0 == byte }) == reference.utf8.count(where: { $0 == byte }),
                    "the id put a raw \(delimiter) into the form body: \(body)")
        }
        if fixed {
            let value = body.split(separator: "&").first.map { String($0.dropFirst(3)) }
            require(value?.removingPercentEncoding == id, "the id did not round-trip: \(body)")
        }
    case .plainText:
        if hasID { require(contains(body, id), "the id is not in the text body") }
        if fixed { require(body == "\(kind.rawValue)/\(id)", "plain text was not substituted as is: \(body)") }
    }
    return 0
}

func encodingOf(_ contentType: String) -> RequestBodyTemplate.Encoding? {
    (try? RequestBodyTemplate("", contentType: contentType))?.encoding
        ?? ((try? RequestBodyTemplate(#""""#, contentType: contentType))?.encoding)
}

/// Errors are short and quote at most the placeholder or content type at fault.
func checkError(_ error: RequestBodyTemplateError, template: String, contentType: String) {
    let text = error.description
    require(text.count <= 400, "an error of \(text.count) characters")
    require(!text.contains("\n"), "a multi-line error")
    // Messages have no run of 64 non-space characters: finding the template there is an echo
    // (unless the content type, which an error does quote, contains it). Byte search: Foundation's
    // String.contains skips NULs, so a template of "s" and 84 NULs was "found" in any message.
    if template.utf8.count > 64, !template.contains(where: \.isWhitespace), !contains(contentType, template) {
        require(!contains(text, template), "the error quotes the template")
    }
}

func strings(in value: JSONValue) -> [String] {
    switch value {
    case .string(let text): [text]
    case .array(let items): items.flatMap(strings)
    case .object(let members): members.flatMap { [$0.key] + strings(in: $0.value) }
    default: []
    }
}

/// Substring search on UTF-8 bytes (a Character search would miss an id starting with a
/// combining mark after the template's text).
func contains(_ text: String, _ part: String) -> Bool {
    let haystack = Array(text.utf8), needle = Array(part.utf8)
    guard needle.count <= haystack.count else { return false }
    return (0...(haystack.count - needle.count)).contains { haystack[$0..<($0 + needle.count)].elementsEqual(needle) }
}
