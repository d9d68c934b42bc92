// Service layer: what `/readyz` says, decided from plain values. The token API gathers the
// facts (the store's write problem, the configured subjects without a usable token).

import FleetTokenStore

/// The reasons `/readyz` gives for not being ready, bounded whatever the number of subjects.
///
/// At most ``namedLimit`` subjects are named; the others are counted in one reason. An agent of
/// 100,000 subjects with its provider down once answered every probe with 100,000 reasons
/// (megabytes of JSON). With client rules (`namesSubjects` false) none is named: any caller may
/// ask `/readyz`, and it must not learn subject ids.
struct ReadinessReport: Equatable {
    /// Most subjects named in one answer.
    static let namedLimit = 10

    let namesSubjects: Bool
    private(set) var named: [String] = []
    private var storeProblem: String?
    private var unusable = 0

    /// A report that names subjects or only counts them, with the store's write problem if any.
    init(storeProblem: String?, namesSubjects: Bool) {
        self.storeProblem = storeProblem
        self.namesSubjects = namesSubjects
    }

    /// A configured subject has no usable token; `cause` (its last error) is built only when
    /// the subject is named.
    mutating func addUnusable(_ key: TokenKey, cause: () -> String) {
        unusable += 1
        guard namesSubjects, named.count < Self.namedLimit else { return }
        named.append("\(key) has no usable token\(cause())")
    }

    /// Ready: the store takes writes and every configured subject has a usable token.
    var isReady: Bool { storeProblem == nil && unusable == 0 }

    /// Why not ready, in order: the store, the subjects named, then the count of the others.
    var reasons: [String] {
        var reasons = storeProblem.map { ["the store cannot be written: \($0)"] } ?? []
        reasons += named
        let others = unusable - named.count
        if others > 0 {
            let count = named.isEmpty ? "\(others)" : "and \(others) more"
            let what = others == 1 ? "configured subject has" : "configured subjects have"
            reasons.append("\(count) \(what) no usable token (see /v1/subjects, or the agent's log)")
        }
        return reasons
    }
}
