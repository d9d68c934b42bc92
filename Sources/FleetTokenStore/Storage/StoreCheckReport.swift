// Storage layer: the result of checking a store's health (`TokenStoreAdmin.check()`,
// `tokenctl check`): structured facts plus the problems worded for the operator.

/// What a health check of a store found: integrity, schema version, files, and every problem
/// worded for the operator who must fix it. The store is healthy when ``problems`` is empty.
///
/// Never carries a token value.
public struct StoreCheckReport: Sendable, Equatable {
    /// The store checked: its path as given (a file store) or another description of where it
    /// lives. Never a credential.
    public var storePath: String
    /// The schema version this build of the library migrates stores to.
    public var buildSchemaVersion: Int
    /// The schema version recorded in the store; nil when it could not be read.
    public var schemaVersion: Int?
    /// What the integrity check found: empty when the store is sound, nil when it did not run
    /// (the store could not be opened or read).
    public var integrityProblems: [String]?
    /// Damage found earlier by the store's background integrity check, if any.
    public var backgroundIntegrityFinding: String?
    /// The store's files (owners, modes, what is wrong with them), judged before opening; nil
    /// for a store without files.
    package var files: StoreFileReport?
    /// Everything wrong, worded for the operator: file problems first, then what opening,
    /// reading or the integrity checks found. Empty when the store is healthy.
    public var problems: [String]

    /// Creates a report.
    package init(storePath: String, buildSchemaVersion: Int, schemaVersion: Int?, integrityProblems: [String]?,
                backgroundIntegrityFinding: String?, files: StoreFileReport?, problems: [String]) {
        self.storePath = storePath
        self.buildSchemaVersion = buildSchemaVersion
        self.schemaVersion = schemaVersion
        self.integrityProblems = integrityProblems
        self.backgroundIntegrityFinding = backgroundIntegrityFinding
        self.files = files
        self.problems = problems
    }

    /// The report on a store that could not be opened: its files as judged, and `error`
    /// unless a file problem already says it.
    init(unopened storePath: String, files: StoreFileReport, buildSchemaVersion: Int, error: TokenStoreError) {
        var problems = files.problems.map(\.description)
        if !problems.contains(error.description) { problems.append(error.description) }
        self.init(storePath: storePath, buildSchemaVersion: buildSchemaVersion, schemaVersion: nil, integrityProblems: nil,
                  backgroundIntegrityFinding: nil, files: files, problems: problems)
    }

    /// True when nothing is wrong.
    public var isHealthy: Bool { problems.isEmpty }

    /// The operator's problem line for what the integrity check found.
    static func integrityProblem(_ findings: [String]) -> String {
        "integrity_check failed: \(findings.prefix(3).joined(separator: "; ")); stop the agent and move the file aside (the agent starts a fresh store and refetches)"
    }

    /// The operator's problem line for damage the background check found.
    static func backgroundProblem(_ finding: String) -> String {
        "the background integrity check found damage (\(finding)): restart the agent; the next start moves the store aside and starts a fresh one (tokens will be refetched)"
    }
}
