// Shared by the test targets: the repository contract's checks added by issue 27: a failure
// keeps the digest of the provider configuration that failed (item 7), and the store says when
// its earliest row died, for the retention sweep's schedule (item 8).

import FleetTokenStore
import Foundation
import Testing

extension RepositoryContract {
    func failureConfigurationDigest(_ store: any ContractRepository) async throws {
        let key = try TokenKey.vehicle("v-tls"), unbound = try TokenKey.vehicle("v-old")
        let digest = String(repeating: "ab", count: 32)
        var failure = Self.failure(2, retryIn: 30, kind: "tlsCertificate", message: "TLS certificate problem")
        failure.configurationDigest = digest
        try await store.recordFailure(failure, for: key)
        #expect(try await store.entry(for: key)?.failure?.configurationDigest == digest)
        #expect(try await store.entries(for: [key])[key]?.failure == failure)
        // A later failure replaces it, digest included (none: an older build's or a fetcher's without one).
        let without = Self.failure(3, retryIn: 60, kind: "tlsCertificate")
        try await store.recordFailure(without, for: key)
        #expect(try await store.entry(for: key)?.failure == without)
        try await store.recordFailure(Self.failure(1, retryIn: 5), for: unbound)
        #expect(try await store.entry(for: unbound)?.failure?.configurationDigest == nil)
        // A success clears it with the rest of the failure state.
        try await store.recordFailure(failure, for: key)
        try await store.upsert(token(key, expiresIn: 600), clearFailure: true)
        try await store.recordFailure(Self.failure(1, retryIn: 5), for: key)
        #expect(try await store.entry(for: key)?.failure?.configurationDigest == nil)
    }

    func earliestDeath(_ store: any ContractRepository) async throws {
        #expect(try await store.earliestDeath(notBefore: nil) == nil)
        let expired = try TokenKey.trip("expired"), valid = try TokenKey.trip("valid")
        let failing = try TokenKey.trip("failing"), failureOnly = try TokenKey.trip("failure-only")
        try await store.upsert([token(expired, expiresIn: -600), token(valid, expiresIn: 300), token(failing, expiresIn: -900)])
        // Died when its retry is planned (later than its token's expiry and its last failure).
        try await store.recordFailure(Self.failure(2, retryIn: 120, at: -30), for: failing)
        try await store.recordFailure(Self.failure(1, retryIn: 900, at: -10), for: failureOnly)
        #expect(try await store.earliestDeath(notBefore: nil) == Self.now - 600)
        #expect(try await store.earliestDeath(notBefore: Self.now - 599) == Self.now + 120)
        #expect(try await store.earliestDeath(notBefore: Self.now + 120) == Self.now + 120)
        #expect(try await store.earliestDeath(notBefore: Self.now + 121) == Self.now + 300)
        #expect(try await store.earliestDeath(notBefore: Self.now + 301) == Self.now + 900)
        #expect(try await store.earliestDeath(notBefore: Self.now + 901) == nil)
        // The death it reports is what the sweep's cutoff is compared with: just past it, retired.
        #expect(try await store.retiredKeys(before: Self.now - 600, after: nil, limit: 10) == [])
        #expect(try await store.retiredKeys(before: Self.now - 599, after: nil, limit: 10) == [expired])
    }
}
