// Provider layer: why a request body template cannot be used, worded for the operator, never
// quoting the template.

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
