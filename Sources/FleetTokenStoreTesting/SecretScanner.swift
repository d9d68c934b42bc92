// Test kit layer: a secret scanner. Remembers the tokens a test saw and finds any of them
// (whole, or their payload or signature part) in texts and log entries: tokens are secrets at
// every level.

public import FleetTokenStore
import Synchronization
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The tokens that passed through a test, and where any of them shows up.
///
/// Remember every token a provider answered or a store held (``ScriptedFetcher`` does it when
/// given a scanner), then scan logs, error descriptions, process output: a token may appear
/// nowhere. For a JWT the payload and the signature part are searched too (a log that drops
/// the header still leaks); the header is the same in many tokens and not secret. Parts shorter
/// than 16 characters are not searched, as they would match by chance. The search is bytewise
/// (memchr, memcmp), fast enough for megabytes of trace logs.
///
/// ```swift
/// let leaks = secrets.leaks(in: log) + secrets.leaks(in: String(describing: error), label: "error")
/// #expect(leaks.isEmpty, "\(leaks)")  // names fingerprints, never the token
/// ```
public final class SecretScanner: Sendable {
    private let tokens = Mutex<Set<String>>([])

    /// Creates a scanner that remembers nothing yet.
    public init() {}

    /// Remembers `token` as a secret.
    public func remember(_ token: String) { tokens.withLock { _ = $0.insert(token) } }

    /// Remembers every token in `tokens`.
    public func remember(contentsOf tokens: some Sequence<String>) {
        let new = Array(tokens)
        self.tokens.withLock { $0.formUnion(new) }
    }

    /// How many different tokens are remembered.
    public var count: Int { tokens.withLock { $0.count } }

    /// Where a remembered token, or its payload or signature, appears in `text`.
    /// - Parameters:
    ///   - text: What to search, such as a process's output.
    ///   - label: Names `text` in the findings.
    public func leaks(in text: String, label: String = "text") -> [SecretLeak] {
        leaks(in: [(label, text)])
    }

    /// Where a remembered token, or its payload or signature, appears in any of `texts`.
    public func leaks(in texts: [(label: String, text: String)]) -> [SecretLeak] {
        let haystacks = texts.map { (label: $0.label, bytes: Array($0.text.utf8)) }
        var found: [SecretLeak] = []
        for token in tokens.withLock({ $0 }).sorted() {
            let needles = Self.needles(of: token)
            for haystack in haystacks {
                var parts = Set<SecretLeak.Part>()
                for (part, needle) in needles.reversed() {
                    // A whole token can only be there if its payload is (when that is searched).
                    if part == .token, needles.contains(where: { $0.0 == .payload }), !parts.contains(.payload) { continue }
                    if Self.contains(haystack.bytes, needle) { parts.insert(part) }
                }
                for (part, _) in needles where parts.contains(part) {
                    found.append(SecretLeak(part: part, fingerprint: TokenFingerprint(of: token), label: haystack.label))
                }
            }
        }
        return found
    }

    /// Where a remembered token, or its payload or signature, appears in an entry of `recorder`
    /// (its message, metadata or error), labelled "log".
    public func leaks(in recorder: LogRecorder) -> [SecretLeak] {
        leaks(in: recorder.allText, label: "log")
    }

    /// The whole token and, for a JWT, its payload and signature; each at least 16 bytes.
    private static func needles(of token: String) -> [(SecretLeak.Part, [UInt8])] {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        var needles: [(SecretLeak.Part, Substring)] = [(.token, token[...])]
        if parts.count == 3 { needles += [(.payload, parts[1]), (.signature, parts[2])] }
        return needles.filter { $0.1.utf8.count >= 16 }.map { ($0.0, Array($0.1.utf8)) }
    }

    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard !needle.isEmpty, haystack.count >= needle.count else { return false }
        // memchr for the first byte, memcmp for the rest.
        return haystack.withUnsafeBytes { h in
            needle.withUnsafeBytes { n in
                let base = h.baseAddress!, count = n.count, last = h.count - count
                var offset = 0
                while offset <= last {
                    guard let hit = memchr(base + offset, Int32(n[0]), last - offset + 1) else { return false }
                    if memcmp(hit, n.baseAddress!, count) == 0 { return true }
                    offset = base.distance(to: UnsafeRawPointer(hit)) + 1
                }
                return false
            }
        }
    }
}

/// A remembered token found where it must not be. Names the token by its fingerprint only, so
/// a failure message leaks nothing either.
public struct SecretLeak: Sendable, Hashable, CustomStringConvertible {
    /// Which part of the token was found.
    public enum Part: String, Sendable, Hashable {
        /// The whole token.
        case token
        /// The JWT's payload part (its claims, base64url).
        case payload
        /// The JWT's signature part.
        case signature
    }

    /// Which part of the token was found.
    public let part: Part
    /// The token's fingerprint.
    public let fingerprint: TokenFingerprint
    /// The label of the text it was found in.
    public let label: String

    /// A finding of `part` of the token with `fingerprint` in the text labelled `label`.
    public init(part: Part, fingerprint: TokenFingerprint, label: String) {
        self.part = part
        self.fingerprint = fingerprint
        self.label = label
    }

    /// "the signature of token fp=… appears in agent stderr".
    public var description: String { "the \(part.rawValue) of token fp=\(fingerprint) appears in \(label)" }
}
