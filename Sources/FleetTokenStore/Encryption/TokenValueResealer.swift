// Encryption layer: what opening an encrypted store checks and does (refuse a store needing
// keys we lack, seal an older store's plaintext values), and re-keying (`tokenctl rekey`).

public import Logging

/// Checks a store's sealed values against a keyring and rewrites values under its primary key,
/// in batches of one transaction each, so a crash loses no work and the next run goes on.
///
/// Run ``prepare(keyring:)`` once when opening a store for an engine, with a keyring or without.
public struct TokenValueResealer: Sendable {
    /// The store whose values are checked and rewritten.
    public let store: any TokenRepository & TokenSealingStore
    private let logger: Logger
    /// Values rewritten per transaction.
    let batchSize: Int

    /// A resealer of `store`'s values.
    /// - Parameters:
    ///   - store: The store whose values are checked and rewritten.
    ///   - logger: Receives progress and the values that do not open (never a value).
    ///   - batchSize: Values rewritten per transaction.
    public init(store: any TokenRepository & TokenSealingStore, logger: Logger, batchSize: Int = 500) {
        self.store = store
        self.logger = logger
        self.batchSize = max(1, batchSize)
    }

    /// What a rewrite did.
    public struct Report: Sendable, Equatable {
        /// Values rewritten under the primary key, by the key id they were under before
        /// (``plaintextKeyID`` for values that were not sealed).
        public var resealed: [String: Int] = [:]
        /// Values already under the primary key, left as they were.
        public var alreadyPrimary = 0
        /// Values that did not open (altered, or under a key the keyring lacks), left as they were.
        public var unopenable: [String: Int] = [:]
        /// Values refreshed or removed by another process while they were rewritten (already
        /// under that process's key, or gone), left as they were.
        public var changedMeanwhile = 0

        /// Every value rewritten.
        public var resealedTotal: Int { resealed.values.reduce(0, +) }
    }

    /// Opens the store for an engine: refuses it when it holds values sealed with keys
    /// `keyring` lacks (every sealed value, without a keyring), then, with a keyring, seals
    /// the values an older store kept as they were and clears the storage's copies of them.
    /// A clean-up an earlier run owes (cut by a crash or a power cut after its last batch, or
    /// failed: see ``TokenSealingStore/replacedValuesAwaitDiscard()``) is run too, keyring or
    /// not, even when no value is left to seal; when none is owed, checking costs one small
    /// read. A clean-up that fails (a `VACUUM` needs free space of about the store's size) is
    /// logged and stays owed, for the next start: the store serves meanwhile. Returns what was
    /// sealed (nil without a keyring).
    /// - Throws: ``TokenStoreError`` with code ``TokenStoreError/Code/encryptionKeyMissing``
    ///   naming the missing key ids; or when the store cannot be read or written.
    @discardableResult
    public func prepare(keyring: TokenKeyring?) async throws(TokenStoreError) -> Report? {
        try await requireKeys(keyring)
        guard let keyring else {
            try await discardReplacedValues(replacedNow: 0, failing: false)
            return nil
        }
        let ids = try await store.valueKeyIDs()
        guard ids.contains(plaintextKeyID) else {
            try await discardReplacedValues(replacedNow: 0, failing: false)
            return Report()
        }
        logger.notice("sealing the token values this store kept unencrypted", metadata: ["key_id": .string(keyring.primary.id)])
        let report = try await reseal(under: keyring, only: plaintextKeyID)
        try await discardReplacedValues(replacedNow: report.resealedTotal, failing: false)
        logger.notice("sealed the store's unencrypted token values", metadata: [
            "sealed": "\(report.resealedTotal)", "key_id": .string(keyring.primary.id),
        ])
        return report
    }

    /// Refuses the store when it holds values sealed with keys `keyring` lacks.
    /// - Throws: ``TokenStoreError`` with code ``TokenStoreError/Code/encryptionKeyMissing``.
    public func requireKeys(_ keyring: TokenKeyring?) async throws(TokenStoreError) {
        let present = try await store.valueKeyIDs().subtracting([plaintextKeyID])
        let missing = present.filter { keyring?.key(id: $0) == nil }
        guard !missing.isEmpty else { return }
        let counts = try await store.valueKeyCounts()
        throw .encryptionKeyMissing(path: store.storeName, keyIDs: missing.sorted(),
                                    valueCount: missing.reduce(0) { $0 + (counts[$1] ?? 0) },
                                    keyGiven: keyring != nil)
    }

    /// Rewrites every value not under `keyring`'s primary key under it (`tokenctl rekey`),
    /// then clears the storage's copies of the values it replaced (plaintext ones, and those
    /// sealed with the keys being retired), and any clean-up an earlier run owes. Values that
    /// do not open are counted and left alone.
    /// - Throws: ``TokenStoreError`` when the store cannot be read or written, or the clean-up
    ///   fails (it stays owed, for the next start or rekey); batches written before stay
    ///   written.
    public func rekey(_ keyring: TokenKeyring) async throws(TokenStoreError) -> Report {
        let before = try await store.valueKeyCounts()[keyring.primary.id] ?? 0
        var report = try await reseal(under: keyring, only: nil)
        report.alreadyPrimary = before
        try await discardReplacedValues(replacedNow: report.resealedTotal, failing: true)
        return report
    }

    /// Clears the storage's copies of replaced values when this run replaced some
    /// (`replacedNow`), or when the store records a clean-up owed since an earlier run; when
    /// neither, it costs one small read and rewrites nothing. A clean-up that fails is logged
    /// with what to do and stays owed; it is thrown only when `failing` (rekey: the operator
    /// asked for it and waits for its outcome; a start goes on serving instead).
    /// - Throws: ``TokenStoreError`` when the store cannot be read, or, when `failing`, the
    ///   clean-up fails.
    private func discardReplacedValues(replacedNow: Int, failing: Bool) async throws(TokenStoreError) {
        if replacedNow == 0 {
            guard try await store.replacedValuesAwaitDiscard() else { return }
            logger.notice("clearing the store's old copies of replaced token values: an earlier run's clean-up did not finish",
                          metadata: ["store": .string(store.storeName)])
        }
        do throws(TokenStoreError) {
            try await store.discardReplacedValues()
        } catch {
            let hint = error.code == .diskFull ? ": first free space on its disk of about the store's size" : ""
            logger.error("could not clear the store's old copies of replaced token values (they may remain in its free space and log); the next start or rekey tries again\(hint)",
                         metadata: ["store": .string(store.storeName), "error": .string(error.description)])
            if failing { throw error }
        }
    }

    /// Rewrites under the primary key the values under `only` (every other key id when nil).
    private func reseal(under keyring: TokenKeyring, only keyID: String?) async throws(TokenStoreError) -> Report {
        var report = Report()
        var after: TokenKey?
        while true {
            let keys = try await store.tokenKeys(valueKeyID: keyID ?? keyring.primary.id, matching: keyID != nil,
                                                 after: after, limit: batchSize)
            guard let last = keys.last else { break }
            after = last
            let entries = try await store.entries(for: keys)
            var replacements: [TokenValueReplacement] = []
            var previousKeyID: [TokenKey: String] = [:]
            for key in keys {
                guard let stored = entries[key]?.token?.value else { report.changedMeanwhile += 1; continue }
                let from: String
                let value: String
                switch SealedTokenValue.open(stored, for: key, with: keyring) {
                case .plaintext(let plain): (from, value) = (plaintextKeyID, plain)
                case .opened(let plain, let id) where id != keyring.primary.id: (from, value) = (id, plain)
                case .opened: report.changedMeanwhile += 1; continue
                case .missingKey(let id), .failed(let id):
                    report.unopenable[id, default: 0] += 1
                    logger.error("stored token does not open: left as it is", metadata: ["key": "\(key)", "key_id": .string(id)])
                    continue
                }
                replacements.append(TokenValueReplacement(
                    key: key, old: stored, new: SealedTokenValue.seal(value, for: key, with: keyring.primary)))
                previousKeyID[key] = from
            }
            let replaced = try await store.replaceValues(replacements)
            for (key, from) in previousKeyID {
                if replaced.contains(key) { report.resealed[from, default: 0] += 1 } else { report.changedMeanwhile += 1 }
            }
        }
        return report
    }
}
