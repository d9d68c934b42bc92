// Which options a reload applies while the agent runs, in one table: AgentOption.live is read
// from it, so an option cannot be called live without being copied on a reload.

import FleetTokenStore

extension AgentSettings {
    /// Copies one live option from the proposed settings into those in force.
    typealias LiveCopy = @Sendable (inout AgentSettings, AgentSettings) -> Void

    /// The options a reload applies, by key.
    static let liveCopies: [String: LiveCopy] = [
        "vehicle": { $0.vehicles = $1.vehicles },
        "trip": { $0.trips = $1.trips },
        "delivery-vehicle": { $0.deliveryVehicles = $1.deliveryVehicles },
        "task": { $0.tasks = $1.tasks },
        "subjects-file": { $0.subjectsFile = $1.subjectsFile },
        "header": { $0.headers = $1.headers },
        "header-file": { $0.headerFiles = $1.headerFiles },
        "ca-file": { $0.caFiles = $1.caFiles },
        "extra-ca-file": { $0.extraCAFiles = $1.extraCAFiles },
        "client-cert": { $0.clientCertificate = $1.clientCertificate },
        "client-key": { $0.clientKey = $1.clientKey },
        "log-level": { $0.logLevel = $1.logLevel },
        "allow": { $0.allow = $1.allow },
        "allow-client": { $0.allowClient = $1.allowClient },
    ]

    /// These settings with the live options (and their origins) taken from `proposed`.
    func takingLiveOptions(from proposed: AgentSettings) -> AgentSettings {
        var applied = self
        for (key, copy) in Self.liveCopies {
            copy(&applied, proposed)
            applied.origins.byKey[key] = proposed.origins.byKey[key]
        }
        return applied
    }
}
