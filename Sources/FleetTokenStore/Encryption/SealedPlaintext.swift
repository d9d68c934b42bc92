// Encryption layer: the bytes a token is sealed as. A JWT goes in as the bytes its three
// base64url segments encode, a quarter shorter than its text, so its sealed form (base64 again)
// is about as long as the token itself: on SQLite a longer row spilled to an overflow page.

/// The plaintext of a sealed value: a tag byte, then a JWT's decoded segments (with the first
/// two lengths) or any other token's UTF-8 text. Decoding gives back the exact token text.
enum SealedPlaintext {
    private static let textTag: UInt8 = 0
    private static let jwtTag: UInt8 = 1

    /// `value` as sealed: packed when it is a JWT whose segments are canonical base64url.
    static func pack(_ value: String) -> [UInt8] {
        if let packed = packJWT(value) { return packed }
        return [textTag] + Array(value.utf8)
    }

    /// The token text of `bytes`, or nil when they are not a packed token.
    static func unpack(_ bytes: [UInt8]) -> String? {
        guard let tag = bytes.first else { return nil }
        switch tag {
        case textTag:
            return String(validating: bytes.dropFirst(), as: UTF8.self)
        case jwtTag:
            guard bytes.count >= 5 else { return nil }
            let first = Int(bytes[1]) << 8 | Int(bytes[2]), second = Int(bytes[3]) << 8 | Int(bytes[4])
            guard bytes.count >= 5 + first + second else { return nil }
            let header = bytes[5..<(5 + first)], payload = bytes[(5 + first)..<(5 + first + second)]
            let signature = bytes[(5 + first + second)...]
            return Base64URL.encode(header) + "." + Base64URL.encode(payload) + "." + Base64URL.encode(signature)
        default:
            return nil
        }
    }

    private static func packJWT(_ value: String) -> [UInt8]? {
        var value = value
        return value.withUTF8 { text -> [UInt8]? in
            guard let firstDot = text.firstIndex(of: UInt8(ascii: ".")),
                  let secondDot = text[(firstDot + 1)...].firstIndex(of: UInt8(ascii: ".")),
                  text[(secondDot + 1)...].firstIndex(of: UInt8(ascii: ".")) == nil,
                  let header = Base64URL.decode(UnsafeBufferPointer(rebasing: text[..<firstDot])),
                  let payload = Base64URL.decode(UnsafeBufferPointer(rebasing: text[(firstDot + 1)..<secondDot])),
                  let signature = Base64URL.decode(UnsafeBufferPointer(rebasing: text[(secondDot + 1)...])),
                  header.count <= 0xFFFF, payload.count <= 0xFFFF
            else { return nil }
            var packed: [UInt8] = [jwtTag, UInt8(header.count >> 8), UInt8(header.count & 0xFF),
                                   UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
            packed.reserveCapacity(5 + header.count + payload.count + signature.count)
            packed += header
            packed += payload
            packed += signature
            return packed
        }
    }
}

/// Unpadded base64url (RFC 4648 §5), canonical only: decoding refuses padding, other
/// characters and stray low bits, so encoding what it decoded gives back the same text.
enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, character) in alphabet.enumerated() { table[Int(character)] = UInt8(index) }
        return table
    }()

    static func decode(_ characters: UnsafeBufferPointer<UInt8>) -> [UInt8]? {
        let count = characters.count, whole = count / 4 * 4, tail = count - whole
        guard tail != 1 else { return nil }
        let outputCount = whole / 4 * 3 + (tail == 0 ? 0 : tail - 1)
        var valid = true
        let bytes = values.withUnsafeBufferPointer { table in
                [UInt8](unsafeUninitializedCapacity: outputCount) { output, initialized in
                    var index = 0, written = 0
                    while index < whole {
                        let a = table[Int(characters[index])], b = table[Int(characters[index + 1])]
                        let c = table[Int(characters[index + 2])], d = table[Int(characters[index + 3])]
                        if (a | b | c | d) & 0xC0 != 0 { valid = false; break }
                        let group = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6 | UInt32(d)
                        output[written] = UInt8(truncatingIfNeeded: group >> 16)
                        output[written + 1] = UInt8(truncatingIfNeeded: group >> 8)
                        output[written + 2] = UInt8(truncatingIfNeeded: group)
                        index += 4
                        written += 3
                    }
                    if valid && tail > 0 {
                        let a = table[Int(characters[whole])], b = table[Int(characters[whole + 1])]
                        let c = tail == 3 ? table[Int(characters[whole + 2])] : 0
                        // Leftover bits must be zero, or another text decodes to the same bytes.
                        if (a | b | c) & 0xC0 != 0 || (tail == 2 ? b & 0x0F : c & 0x03) != 0 {
                            valid = false
                        } else {
                            let group = UInt32(a) << 18 | UInt32(b) << 12 | UInt32(c) << 6
                            output[written] = UInt8(truncatingIfNeeded: group >> 16)
                            written += 1
                            if tail == 3 {
                                output[written] = UInt8(truncatingIfNeeded: group >> 8)
                                written += 1
                            }
                        }
                    }
                    initialized = valid ? written : 0
                }
        }
        return valid ? bytes : nil
    }

    static func encode(_ bytes: some Collection<UInt8>) -> String {
        let input = Array(bytes)
        let count = input.count, whole = count / 3 * 3, tail = count - whole
        let length = whole / 3 * 4 + (tail == 0 ? 0 : tail + 1)
        return alphabet.withUnsafeBufferPointer { symbols in
            input.withUnsafeBufferPointer { source in
                String(unsafeUninitializedCapacity: length) { text in
                    var index = 0, written = 0
                    while index < whole {
                        let group = UInt32(source[index]) << 16 | UInt32(source[index + 1]) << 8 | UInt32(source[index + 2])
                        text[written] = symbols[Int(group >> 18)]
                        text[written + 1] = symbols[Int(group >> 12 & 0x3F)]
                        text[written + 2] = symbols[Int(group >> 6 & 0x3F)]
                        text[written + 3] = symbols[Int(group & 0x3F)]
                        index += 3
                        written += 4
                    }
                    if tail > 0 {
                        let group = UInt32(source[whole]) << 16 | (tail == 2 ? UInt32(source[whole + 1]) << 8 : 0)
                        text[written] = symbols[Int(group >> 18)]
                        text[written + 1] = symbols[Int(group >> 12 & 0x3F)]
                        written += 2
                        if tail == 2 {
                            text[written] = symbols[Int(group >> 6 & 0x3F)]
                            written += 1
                        }
                    }
                    return written
                }
            }
        }
    }
}
