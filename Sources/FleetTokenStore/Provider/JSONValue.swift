// Provider layer: any JSON value, for the provider's answers and JWT payloads, whose field names
// are configured at run time or vary. Internal: the library's own reader, not an API.

package import Foundation

/// Any JSON value, for reading documents whose field names are configured at run time (provider
/// answers) or whose claims vary (JWT payloads). Numbers are `Double`, as JSON defines them.
package enum JSONValue: Sendable, Equatable, Codable {
    /// `null`.
    case null
    /// `true` / `false`.
    case bool(Bool)
    /// A number.
    case number(Double)
    /// A string.
    case string(String)
    /// An array.
    case array([JSONValue])
    /// An object.
    case object([String: JSONValue])

    /// Decodes any JSON value.
    package init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() {
            self = .null
        } else if let value = try? container.decode(Bool.self) {
            self = .bool(value)
        } else if let value = try? container.decode(Double.self) {
            self = .number(value)
        } else if let value = try? container.decode(String.self) {
            self = .string(value)
        } else if let value = try? container.decode([JSONValue].self) {
            self = .array(value)
        } else {
            self = .object(try container.decode([String: JSONValue].self))
        }
    }

    /// Encodes the value.
    package func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let value): try container.encode(value)
        case .number(let value): try container.encode(value)
        case .string(let value): try container.encode(value)
        case .array(let value): try container.encode(value)
        case .object(let value): try container.encode(value)
        }
    }

    /// Parses a JSON document; nil when it is not valid JSON.
    package static func parse(_ data: Data) -> JSONValue? {
        try? JSONDecoder().decode(JSONValue.self, from: data)
    }

    /// The members of an object, else nil.
    package var objectValue: [String: JSONValue]? {
        if case .object(let members) = self { return members }
        return nil
    }

    /// The string, else nil.
    package var stringValue: String? {
        if case .string(let value) = self { return value }
        return nil
    }

    /// The number, else nil.
    package var numberValue: Double? {
        if case .number(let value) = self { return value }
        return nil
    }
}
