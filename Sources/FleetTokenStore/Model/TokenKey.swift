// Model layer: what a token authorizes (its kind) and the key tokens are kept by: kind and
// subject id.

/// What a token authorizes: the kind of Fleet Engine resource named in its `authorization` claim.
///
/// The raw values are what the store records and what `tokenctl` and `token-agent` accept.
public enum TokenKind: String, Sendable, Hashable, CaseIterable, Codable, CustomStringConvertible {
    /// An on-demand-trips vehicle (`authorization.vehicleid`), the Driver SDK's context.
    case vehicle
    /// An on-demand trip (`authorization.tripid`), the Consumer SDK's context.
    case trip
    /// A scheduled-tasks delivery vehicle (`authorization.deliveryvehicleid`).
    case deliveryVehicle
    /// A scheduled task (`authorization.taskid`).
    case task

    /// The JWT `authorization` claim member that names this kind's subject.
    public var authorizationClaim: String {
        switch self {
        case .vehicle: "vehicleid"
        case .trip: "tripid"
        case .deliveryVehicle: "deliveryvehicleid"
        case .task: "taskid"
        }
    }

    /// The raw value, as stored and as typed on the command line.
    public var description: String { rawValue }
}

/// Identifies one token: its kind and the subject (vehicle or trip id) it is minted for.
///
/// Tokens are cached, stored and refreshed per key, as the Fleet Engine SDKs cache them per
/// vehicle ID or trip ID.
///
/// Keys compare, hash and order by the UTF-8 bytes of their ids, as the store, the file sinks
/// and the token provider do: `zoë` written precomposed (NFC) and decomposed (NFD) are two
/// subjects, as they are to Fleet Engine, and never share a token. (Swift's `String` equality
/// would treat canonically equivalent ids as one.)
public struct TokenKey: Hashable, Sendable, Comparable, CustomStringConvertible {
    /// The kind of subject.
    public let kind: TokenKind
    /// The subject's id, e.g. a vehicle ID.
    public let subjectID: String

    /// The longest subject id accepted, in UTF-8 bytes.
    public static let maximumSubjectIDLength = 512

    /// Creates a key, checking the subject id.
    /// - Throws: ``InvalidTokenKey`` when the id is empty, is `.` or `..` or has such a
    ///   `/`-separated segment, is longer than ``maximumSubjectIDLength`` bytes, or contains
    ///   control characters or invisible format characters (bidirectional overrides, zero-width
    ///   characters).
    public init(kind: TokenKind, subjectID: String) throws(InvalidTokenKey) {
        if subjectID.isEmpty { throw .emptySubjectID(kind: kind) }
        if subjectID.utf8.count > Self.maximumSubjectIDLength {
            throw .subjectIDTooLong(kind: kind, length: subjectID.utf8.count)
        }
        // Every API request checks its id: printable ASCII (nearly every real id) is judged in
        // one pass over the bytes, without Unicode property tables (as the rules below judge it).
        switch Self.printableASCIIShape(subjectID) {
        case .acceptable:
            self.kind = kind
            self.subjectID = subjectID
            return
        case .dotSegment: throw .pathSegment(kind: kind, subjectID: subjectID)
        case .other: break
        }
        // Unreserved in URLs, so never percent-encoded: as `{id}` they would be path segments
        // that proxies and servers resolve to another endpoint; inside an id with slashes,
        // `fleet-a/x/../../truck-7` would pass a `fleet-a/*` pattern and name another subject.
        if subjectID.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: false)
            .contains(where: { $0.elementsEqual(".".utf8) || $0.elementsEqual("..".utf8) }) {
            throw .pathSegment(kind: kind, subjectID: subjectID)
        }
        for scalar in subjectID.unicodeScalars {
            switch scalar.properties.generalCategory {
            case .control: throw .controlCharacters(kind: kind)
            // Shown as nothing, or reversing what follows, in logs and tokenctl's output.
            case .format: throw .formatCharacters(kind: kind)
            default: continue
            }
        }
        self.kind = kind
        self.subjectID = subjectID
    }

    /// What one pass over an id's bytes tells: printable ASCII with no `.` or `..` segment,
    /// printable ASCII with one, or anything else (judged by the full rules).
    private enum ASCIIShape { case acceptable, dotSegment, other }

    private static func printableASCIIShape(_ id: String) -> ASCIIShape {
        var id = id
        return id.withUTF8 { bytes in
            // The current `/`-separated segment: its length while it holds only dots.
            var dots = 0
            var onlyDots = true
            for byte in bytes {
                guard byte >= 0x20, byte < 0x7F else { return .other }
                if byte == UInt8(ascii: "/") {
                    if onlyDots && (dots == 1 || dots == 2) { return .dotSegment }
                    dots = 0
                    onlyDots = true
                } else if byte == UInt8(ascii: ".") {
                    dots += 1
                } else {
                    onlyDots = false
                }
            }
            return onlyDots && (dots == 1 || dots == 2) ? .dotSegment : .acceptable
        }
    }

    /// A vehicle's key. - Throws: ``InvalidTokenKey`` for a bad id.
    public static func vehicle(_ id: String) throws(InvalidTokenKey) -> TokenKey {
        try TokenKey(kind: .vehicle, subjectID: id)
    }

    /// A trip's key. - Throws: ``InvalidTokenKey`` for a bad id.
    public static func trip(_ id: String) throws(InvalidTokenKey) -> TokenKey {
        try TokenKey(kind: .trip, subjectID: id)
    }

    /// A delivery vehicle's key (Fleet Engine Deliveries). - Throws: ``InvalidTokenKey`` for a bad id.
    public static func deliveryVehicle(_ id: String) throws(InvalidTokenKey) -> TokenKey {
        try TokenKey(kind: .deliveryVehicle, subjectID: id)
    }

    /// A scheduled task's key (Fleet Engine Deliveries). - Throws: ``InvalidTokenKey`` for a bad id.
    public static func task(_ id: String) throws(InvalidTokenKey) -> TokenKey {
        try TokenKey(kind: .task, subjectID: id)
    }

    /// `kind/subjectID`, e.g. `vehicle/truck-7`.
    public var description: String { "\(kind.rawValue)/\(subjectID)" }

    /// Orders by kind, then the subject id's UTF-8 bytes: the store's listing order.
    public static func < (lhs: TokenKey, rhs: TokenKey) -> Bool {
        if lhs.kind != rhs.kind { return lhs.kind.rawValue < rhs.kind.rawValue }
        return lhs.subjectID.utf8.lexicographicallyPrecedes(rhs.subjectID.utf8)
    }

    /// Equal when the kinds are and the ids' UTF-8 bytes are.
    public static func == (lhs: TokenKey, rhs: TokenKey) -> Bool {
        lhs.kind == rhs.kind && lhs.subjectID.utf8.elementsEqual(rhs.subjectID.utf8)
    }

    /// Hashes the kind and the id's UTF-8 bytes.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(kind)
        var id = subjectID
        id.withUTF8 { hasher.combine(bytes: UnsafeRawBufferPointer($0)) }
        hasher.combine(id.utf8.count)
    }

    /// Builds a key from values already validated (read back from the store).
    package init(uncheckedKind kind: TokenKind, subjectID: String) {
        self.kind = kind
        self.subjectID = subjectID
    }
}

/// A subject id that cannot name a token: thrown by ``TokenKey/init(kind:subjectID:)`` and the
/// per-kind constructors.
///
/// Check ``code`` against the static values of ``Code`` (`error.code == .subjectIDTooLong`).
public struct InvalidTokenKey: Error, Sendable, Equatable, CustomStringConvertible {
    /// What is wrong with the id. More codes may come: match them with `==`, keep a `default`.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        fileprivate enum Value: String, Sendable { case emptySubjectID, subjectIDTooLong, controlCharacters, pathSegment, formatCharacters }

        fileprivate let value: Value

        /// The id is empty.
        public static let emptySubjectID = Code(value: .emptySubjectID)
        /// The id is longer than ``TokenKey/maximumSubjectIDLength`` bytes.
        public static let subjectIDTooLong = Code(value: .subjectIDTooLong)
        /// The id contains control characters (newlines, tabs, NUL...).
        public static let controlCharacters = Code(value: .controlCharacters)
        /// The id is `.` or `..`, or has such a `/`-separated segment, which a provider URL or a
        /// pattern would take as a relative path.
        public static let pathSegment = Code(value: .pathSegment)
        /// The id contains invisible format characters (Unicode category Cf: bidirectional
        /// overrides, zero-width characters), which make it read as another id.
        public static let formatCharacters = Code(value: .formatCharacters)

        /// The code's name, e.g. `emptySubjectID`.
        public var description: String { value.rawValue }
    }

    /// What is wrong with the id.
    public let code: Code
    /// The kind of key the id was given for.
    public let kind: TokenKind
    /// The id's length in UTF-8 bytes (``Code/subjectIDTooLong``).
    public let length: Int?
    /// The id itself (``Code/pathSegment``: `.` or `..`); other codes leave it out, as it may
    /// be long or hold control characters.
    public let subjectID: String?

    private init(_ code: Code, kind: TokenKind, length: Int? = nil, subjectID: String? = nil) {
        self.code = code
        self.kind = kind
        self.length = length
        self.subjectID = subjectID
    }

    /// The id is empty.
    package static func emptySubjectID(kind: TokenKind) -> Self { Self(.emptySubjectID, kind: kind) }
    /// The id is longer than ``TokenKey/maximumSubjectIDLength`` bytes.
    package static func subjectIDTooLong(kind: TokenKind, length: Int) -> Self { Self(.subjectIDTooLong, kind: kind, length: length) }
    /// The id contains control characters (newlines, tabs, NUL...).
    package static func controlCharacters(kind: TokenKind) -> Self { Self(.controlCharacters, kind: kind) }
    /// The id is `.` or `..`, or has such a `/`-separated segment.
    package static func pathSegment(kind: TokenKind, subjectID: String) -> Self { Self(.pathSegment, kind: kind, subjectID: subjectID) }
    /// The id contains invisible format characters (Unicode category Cf).
    package static func formatCharacters(kind: TokenKind) -> Self { Self(.formatCharacters, kind: kind) }

    /// What is wrong and what to do.
    public var description: String {
        switch code.value {
        case .emptySubjectID:
            "the \(kind) id is empty: give the id the token is minted for"
        case .subjectIDTooLong:
            "the \(kind) id is \(length ?? 0) bytes long, more than the \(TokenKey.maximumSubjectIDLength) allowed: check the id"
        case .controlCharacters:
            "the \(kind) id contains control characters (newline, tab, NUL...): check how the id was read"
        case .pathSegment:
            "the \(kind) id \"\(subjectID ?? "")\" is or holds a relative path segment (. or ..), which proxies, servers and allow patterns would resolve to another id: give the real \(kind) id"
        case .formatCharacters:
            "the \(kind) id contains invisible format characters (a bidirectional override or a zero-width character), which make it read as another id: check how the id was read"
        }
    }
}
