// Property checks shared by the harnesses. A violated property traps with a message, which
// libFuzzer reports as a crash and saves the input as a reproducer.

import Foundation

/// Stops the run when a property does not hold.
public func require(_ condition: Bool, _ message: @autoclosure () -> String,
                    file: StaticString = #fileID, line: UInt = #line) {
    guard !condition else { return }
    fatalError("fuzz property violated: \(message())", file: file, line: line)
}

/// True when `secret` is distinctive enough that finding it in `text` means it leaked. Short
/// strings, or strings with spaces, could also be words of an error message itself ("1
/// segments, a JWT has 3"); ISO 8601 dates that messages quote are 20 bytes. Real tokens are
/// hundreds of bytes without whitespace.
public func isLeakCheckable(_ secret: String) -> Bool {
    guard secret.utf8.count > 20 else { return false }
    // Printable ASCII without space is the common case; Unicode properties only beyond it.
    if secret.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) { return true }
    return !secret.unicodeScalars.contains { $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7F }
}

/// Requires that `text` (an error description, a log line) does not quote `secret`.
public func requireNoLeak(of secret: String, in text: String, _ what: String,
                          file: StaticString = #fileID, line: UInt = #line) {
    guard isLeakCheckable(secret) else { return }
    require(!text.contains(secret), "\(what) quotes the token: \(text)", file: file, line: line)
}

/// Encodes bytes as unpadded base64url, or padded when `padded`.
public func base64URL(_ bytes: some Sequence<UInt8>, padded: Bool = false) -> String {
    let base64 = Data(bytes).base64EncodedData()
    var encoded = [UInt8]()
    encoded.reserveCapacity(base64.count)
    for byte in base64 {
        switch byte {
        case UInt8(ascii: "+"): encoded.append(UInt8(ascii: "-"))
        case UInt8(ascii: "/"): encoded.append(UInt8(ascii: "_"))
        case UInt8(ascii: "="): if padded { encoded.append(byte) }
        default: encoded.append(byte)
        }
    }
    return String(decoding: encoded, as: UTF8.self)
}

/// Reads a fuzz input: a few leading selector bytes, then the payload.
public struct FuzzInput {
    /// All bytes.
    public let bytes: [UInt8]

    /// Wraps libFuzzer's buffer (copied: libFuzzer owns it).
    public init(_ data: UnsafePointer<UInt8>?, _ count: Int) {
        bytes = data.map { Array(UnsafeBufferPointer(start: $0, count: count)) } ?? []
    }

    /// The selector byte at `index`, 0 when the input is shorter.
    public func selector(_ index: Int) -> UInt8 {
        index < bytes.count ? bytes[index] : 0
    }

    /// The bytes after the first `count` selector bytes.
    public func payload(after count: Int) -> ArraySlice<UInt8> {
        bytes.dropFirst(count)
    }
}
