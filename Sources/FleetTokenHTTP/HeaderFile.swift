// Transport layer: a request header whose value lives in a file (a rotated credential), for
// HTTPTokenFetcher.

import FleetTokenStore
import Foundation
import Synchronization

/// A header whose value lives in a file, re-read whenever the file's modification time or size
/// changes. A file another user could have written or replaced (`SteeringFileCheck`) is
/// refused at each re-read: the request fails, naming the file and the fix. The value sent is
/// read from the file that was judged (one open descriptor).
final class HeaderFile: Sendable {
    let name: String
    let path: String
    private let cache = Mutex<(stamp: String, value: String)?>(nil)

    init(name: String, path: String) {
        self.name = name
        self.path = path
    }

    func value() throws(TokenProviderError) -> String {
        let stamp = FileStamp.of(path)
        if let cached = cache.withLock({ $0 }), cached.stamp == stamp { return cached.value }
        // A credential another user could have written is not sent (judged on every re-read,
        // on the open file whose bytes are sent).
        let data: Data
        do { data = try SteeringFileCheck.read(path: path, role: "\(name) header file") } catch {
            switch error.code {
            case .missing, .unreadable:
                throw .other(detail: "cannot read the \(name) header file \(path): check that it exists and is readable")
            default:
                throw .other(detail: error.description)
            }
        }
        let value = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        guard HTTPTokenFetcher.isValidHeaderValue(value) else {
            throw .other(detail: "the \(name) header file \(path) holds more than one line or a control character")
        }
        cache.withLock { $0 = (stamp, value) }
        return value
    }
}
