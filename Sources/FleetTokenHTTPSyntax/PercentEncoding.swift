// Provider layer: RFC 3986 percent-encoding of a subject id, shared by the provider URL
// (FleetTokenHTTP) and form bodies, so an id can never change a URL's or a form's structure.

/// Percent-encoding that keeps only RFC 3986's unreserved characters (`A–Z a–z 0–9 - . _ ~`).
package enum PercentEncoding {
    /// `text` as UTF-8 with every byte but the unreserved ones written `%XX` (uppercase hex):
    /// a space is `%20`, `/` is `%2F`, `é` is `%C3%A9`.
    package static func encode(_ text: String) -> String {
        var encoded = ""
        for byte in text.utf8 {
            if isUnreserved(byte) {
                encoded.unicodeScalars.append(Unicode.Scalar(byte))
            } else {
                encoded += "%" + hexDigits[Int(byte >> 4)] + hexDigits[Int(byte & 0xF)]
            }
        }
        return encoded
    }

    private static let hexDigits = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "A", "B", "C", "D", "E", "F"]

    private static func isUnreserved(_ byte: UInt8) -> Bool {
        (byte >= UInt8(ascii: "A") && byte <= UInt8(ascii: "Z")) || (byte >= UInt8(ascii: "a") && byte <= UInt8(ascii: "z"))
            || (byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
            || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "~")
    }
}
