// The repository contract (TestSupportKit's RepositoryContract) against PostgreSQL: two
// repositories (two connection pools, as two hosts would have) on a fresh database each check.

import FleetTokenPostgres
import FleetTokenStore
import Logging
import Testing
import TestSupportKit

/// A subject id the schema's CHECK refuses (empty), which `TokenKey` never builds.
private let refusedKey = TokenKey(uncheckedKind: .vehicle, subjectID: "")

private let postgres = RepositoryContract.Subject(name: "PostgresTokenRepository", refusedKey: refusedKey) { body in
    let (server, database, configuration) = try await freshDatabase()
    let logger = Logger(label: "contract")
    try await reportingServerState(server, database) {
        try await PostgresTokenRepository.withRepository(configuration, logger: logger) { store in
            try await PostgresTokenRepository.withRepository(configuration, logger: logger) { other in
                try await body(RepositoryContract.Fixture(store: store, otherProcess: other, tearDown: {}))
            }
        }
    }
}

@Suite("The repository contract against PostgreSQL", .paced, .enabled(if: PostgresServer.testsEnabled))
struct PostgresContractTests {
    @Test("contract", arguments: [postgres], RepositoryContract.Check.allCases)
    func contract(subject: RepositoryContract.Subject, check: RepositoryContract.Check) async throws {
        try await RepositoryContract(subject).run(check)
    }
}
