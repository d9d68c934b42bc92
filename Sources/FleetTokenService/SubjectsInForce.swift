// Service layer: the token API's allow list and readiness subjects, which a reload replaces.

import FleetTokenStore
import Synchronization

/// The allow list, client rules and readiness subjects in force, shared by every copy of a
/// ``TokenAPI`` (the router's closures hold copies) so that a reload reaches them all.
final class SubjectsInForce: Sendable {
    let state: Mutex<(allowList: SubjectAllowList, readiness: [TokenKey], clients: ClientAccessPolicy)>

    init(allowList: SubjectAllowList, readiness: [TokenKey], clients: ClientAccessPolicy) {
        state = Mutex((allowList, readiness, clients))
    }
}
