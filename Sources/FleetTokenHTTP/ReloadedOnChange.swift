// Transport layer: a value loaded from files and loaded again when one of them changes on disk
// (rotated certificates), keeping the last good value when a new version cannot be used.

import Synchronization

/// A value built from files, built again when any of them changes (``FileStamp``: inode, size,
/// modification time).
///
/// A rebuild that fails (a rotation half written, an unreadable file, a file another user could
/// have written) keeps the last good value and is reported once per version of the files; the
/// next change is tried afresh. The provider's TLS files and the Fleet Engine proxy's CA file
/// are read through it.
package final class ReloadedOnChange<Value: Sendable, Failure: Error>: Sendable {
    private let paths: [String]
    private let build: @Sendable () throws(Failure) -> Value
    private let state: Mutex<(stamp: String, value: Value, failedStamp: String?)>

    /// Builds the value now.
    /// - Throws: `build`'s error, when the files cannot be used at all.
    package init(paths: [String], build: @escaping @Sendable () throws(Failure) -> Value) throws(Failure) {
        self.paths = paths
        self.build = build
        let stamp = Self.stamp(paths)
        state = Mutex((stamp, try build(), nil))
    }

    /// The last value built that could be used, without looking at the files.
    package var lastGood: Value { state.withLock { $0.value } }

    /// The value for the next use: built again when a file changed since the last call. Calls
    /// `rebuilt` with a new value, `failed` (once per version of the files) when it cannot be
    /// built and the previous one is kept.
    package func current(rebuilt: (Value) -> Void = { _ in }, failed: (Failure) -> Void) -> Value {
        let stamp = Self.stamp(paths)
        let (cached, knownBad, previous) = state.withLock { ($0.stamp == stamp ? $0.value : nil, $0.failedStamp == stamp, $0.value) }
        if let cached { return cached }
        if knownBad { return previous }
        do {
            let value = try build()
            state.withLock { $0 = (stamp, value, nil) }
            rebuilt(value)
            return value
        } catch {
            state.withLock { $0.failedStamp = stamp }
            failed(error)
            return previous
        }
    }

    private static func stamp(_ paths: [String]) -> String {
        paths.map(FileStamp.of).joined(separator: "|")
    }
}
