// Test kit layer: a scripted provider. A `TokenFetcher` whose answer the test sets and changes,
// which counts calls per key, can hold fetches at a gate, and hands every token it answers to a
// secret scanner.

public import FleetTokenStore
public import Foundation
import Synchronization

/// A `TokenFetcher` whose answers a test scripts.
///
/// The answer is a closure of the key and the call's number for that key (1 for the first);
/// ``setAnswer(_:)`` changes it mid-test (a provider that starts failing, or recovers). Calls
/// are counted per key. ``close()`` holds every fetch at a gate until ``open()``, to test what
/// callers do while a fetch is in flight; a held fetch gives up when its task is cancelled, as
/// a real client does. With a ``SecretScanner`` every token value answered is remembered, so
/// the test can check that none reached a log.
///
/// ```swift
/// let fetcher = ScriptedFetcher.minting(time, secrets: secrets)
/// fetcher.setAnswer { _, _ throws(TokenProviderError) in throw .httpStatus(code: 503, retryAfter: nil) }
/// ```
public final class ScriptedFetcher: TokenFetcher, Sendable {
    /// An answer: the key, and the number of this call for the key (1 for the first).
    public typealias Answer = @Sendable (TokenKey, Int) async throws(TokenProviderError) -> FetchedToken

    /// The answer in a struct: a bare closure type read out of a `Mutex` at -Onone is wrapped in
    /// one more pair of reabstraction thunks, stored back, on every read (swiftlang/swift#91348),
    /// so every fetch would walk every earlier one. A struct's stored closure is not re-wrapped.
    private struct Script: Sendable {
        let answer: Answer
    }

    private let calls = Mutex<[TokenKey: Int]>([:])
    private let script: Mutex<Script>
    private let gate = Mutex<[(UUID, CheckedContinuation<Void, Never>)]?>(nil)
    private let secrets: SecretScanner?

    /// Creates a fetcher that answers with `answer`.
    /// - Parameters:
    ///   - secrets: Remembers every token value answered, when given.
    ///   - answer: The first script; ``setAnswer(_:)`` replaces it.
    public init(secrets: SecretScanner? = nil, _ answer: @escaping Answer) {
        self.secrets = secrets
        self.script = Mutex(Script(answer: answer))
    }

    /// A fetcher minting valid Fleet Engine-shaped JWTs (``TestJWT``) of `lifetime` seconds,
    /// issued at `time`'s wall clock when asked.
    public static func minting(_ time: TestTime, lifetime: TimeInterval = 3600, secrets: SecretScanner? = nil) -> ScriptedFetcher {
        ScriptedFetcher(secrets: secrets) { key, _ in FetchedToken(value: TestJWT.make(for: key, issuedAt: time.now, lifetime: lifetime)) }
    }

    /// Replaces the script for every later call.
    public func setAnswer(_ answer: @escaping Answer) { script.withLock { $0 = Script(answer: answer) } }

    /// Holds every later fetch at the gate until ``open()``.
    public func close() { gate.withLock { $0 = $0 ?? [] } }

    /// Lets every held fetch go on, and later ones pass.
    public func open() {
        let waiters = gate.withLock { state -> [(UUID, CheckedContinuation<Void, Never>)] in
            defer { state = nil }
            return state ?? []
        }
        waiters.forEach { $0.1.resume() }
    }

    /// How many fetches the closed gate holds now.
    public var waitingAtGate: Int { gate.withLock { $0?.count ?? 0 } }

    /// How many times `key` was fetched.
    public func count(_ key: TokenKey) -> Int { calls.withLock { $0[key] ?? 0 } }

    /// How many fetches there were, over every key.
    public var total: Int { calls.withLock { $0.values.reduce(0, +) } }

    /// Counts the call, waits at the gate if it is closed, then answers as scripted.
    /// - Throws: What the script throws; `TokenProviderError.other(detail:)` when the
    ///   calling task was cancelled before the answer.
    public func fetchToken(for key: TokenKey) async throws(TokenProviderError) -> FetchedToken {
        let n = calls.withLock { calls in
            calls[key, default: 0] += 1
            return calls[key]!
        }
        let id = UUID()
        await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let held = gate.withLock { state -> Bool in
                    guard state != nil, !Task.isCancelled else { return false }
                    state!.append((id, continuation))
                    return true
                }
                if !held { continuation.resume() }
            }
        } onCancel: {
            let waiter = gate.withLock { state -> CheckedContinuation<Void, Never>? in
                guard let index = state?.firstIndex(where: { $0.0 == id }) else { return nil }
                return state?.remove(at: index).1
            }
            waiter?.resume()
        }
        if Task.isCancelled { throw .other(detail: "cancelled") }
        let script = self.script.withLock { $0 }
        let fetched = try await script.answer(key, n)
        secrets?.remember(fetched.value)
        return fetched
    }
}
