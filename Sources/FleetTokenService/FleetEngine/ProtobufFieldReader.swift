// Service layer: the one thing the Fleet Engine proxy reads from a gRPC request message, a
// string field at a path of message fields, straight from protobuf's wire format. Pure.

/// Reads a string field out of a protobuf message in wire format, without generated code.
///
/// The proxy needs one value per call, the resource name (`name` = 3 of `GetVehicleRequest`,
/// `name` = 1 inside `task` = 3 of `UpdateTaskRequest`), and must read the value Fleet Engine
/// will read. So the reader follows protobuf's parsing rules: the last occurrence of a string
/// field wins, and repeated occurrences of a message field merge (a `name` in a later `task`
/// wins over one in an earlier). Every field of every message on the path is walked, so a
/// message that is not well-formed protobuf is refused, not half read.
public struct ProtobufFieldReader: Sendable {
    /// Why a message could not be read.
    public enum Failure: Error, Sendable, Equatable, CustomStringConvertible {
        /// The message ends inside a field.
        case truncated
        /// A varint longer than ten bytes, a field number 0 or a wire type protobuf does not
        /// define (6, 7).
        case malformed
        /// A group (wire types 3 and 4): Fleet Engine's messages have none.
        case groupsNotSupported
        /// A field on the path with another wire type than a string or message has (2).
        case unexpectedWireType(field: Int, wireType: Int)
        /// The string at the path is not valid UTF-8 (proto3 requires it).
        case notUTF8

        /// What was wrong, for the caller's error message.
        public var description: String {
            switch self {
            case .truncated: "the message ends inside a field"
            case .malformed: "the message is not protobuf wire format"
            case .groupsNotSupported: "the message holds a group, which no Fleet Engine request has"
            case .unexpectedWireType(let field, let wireType): "field \(field) has wire type \(wireType), not a string or message"
            case .notUTF8: "the name is not UTF-8"
            }
        }
    }

    /// The message's bytes.
    private let message: [UInt8]

    /// A reader over one message (the bytes after gRPC's 5-byte frame header).
    public init(message: [UInt8]) {
        self.message = message
    }

    /// The string at `path` (field numbers from the outer message inwards; every one but the
    /// last names a message field), or nil when the message does not set it.
    /// - Throws: ``Failure`` when any message on the path is not well-formed or the string is
    ///   not UTF-8.
    public func string(atPath path: [Int]) throws(Failure) -> String? {
        precondition(!path.isEmpty, "a path names at least one field")
        guard let bytes = try Self.lastValue(atPath: path[...], in: message[...]) else { return nil }
        guard let text = String(validating: bytes, as: UTF8.self) else { throw .notUTF8 }
        return text
    }

    /// The last value of the length-delimited field at `path`, merging repeated message fields.
    private static func lastValue(atPath path: ArraySlice<Int>, in bytes: ArraySlice<UInt8>) throws(Failure) -> ArraySlice<UInt8>? {
        var cursor = Cursor(bytes: bytes)
        var found: ArraySlice<UInt8>?
        let wanted = path.first!
        while let field = try cursor.nextField() {
            guard field.number == wanted else { continue }
            guard let value = field.lengthDelimited else {
                throw .unexpectedWireType(field: field.number, wireType: field.wireType)
            }
            if path.count == 1 {
                found = value
            } else if let inner = try lastValue(atPath: path.dropFirst(), in: value) {
                found = inner
            }
        }
        return found
    }

    /// One field as read: its number, wire type and, for wire type 2, its bytes.
    private struct Field {
        let number: Int
        let wireType: Int
        let lengthDelimited: ArraySlice<UInt8>?
    }

    /// Walks a message field by field.
    private struct Cursor {
        let bytes: ArraySlice<UInt8>
        var index: Int

        init(bytes: ArraySlice<UInt8>) {
            self.bytes = bytes
            self.index = bytes.startIndex
        }

        /// The next field, or nil at the end of the message.
        mutating func nextField() throws(Failure) -> Field? {
            guard index < bytes.endIndex else { return nil }
            let tag = try varint()
            let number = tag >> 3
            // Field numbers are 1 through 2^29 - 1.
            guard number >= 1, number < 1 << 29 else { throw .malformed }
            let wireType = Int(tag & 7)
            switch wireType {
            case 0: _ = try varint(); return Field(number: Int(number), wireType: 0, lengthDelimited: nil)
            case 1: try skip(8); return Field(number: Int(number), wireType: 1, lengthDelimited: nil)
            case 5: try skip(4); return Field(number: Int(number), wireType: 5, lengthDelimited: nil)
            case 2:
                let length = try varint()
                guard length <= UInt64(bytes.endIndex - index) else { throw .truncated }
                let start = index
                index += Int(length)
                return Field(number: Int(number), wireType: 2, lengthDelimited: bytes[start..<index])
            case 3, 4: throw .groupsNotSupported
            default: throw .malformed
            }
        }

        /// A base-128 varint of at most ten bytes.
        mutating func varint() throws(Failure) -> UInt64 {
            var value: UInt64 = 0
            for shift in stride(from: 0, to: 70, by: 7) {
                guard index < bytes.endIndex else { throw .truncated }
                let byte = bytes[index]
                index += 1
                value |= UInt64(byte & 0x7f) << UInt64(shift)
                if byte & 0x80 == 0 { return value }
            }
            throw .malformed
        }

        mutating func skip(_ count: Int) throws(Failure) {
            guard bytes.endIndex - index >= count else { throw .truncated }
            index += count
        }
    }
}
