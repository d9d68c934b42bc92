// Which options a reload applies while the agent runs: those the option table marks reloadable
// (AgentOptionTable.swift). Any other change waits for a restart, and a reload says so.

extension AgentSettings {
    /// These settings with the live options (and their origins) taken from `proposed`.
    func takingLiveOptions(from proposed: AgentSettings) -> AgentSettings {
        var applied = self
        for option in AgentOption.all where option.live {
            option.copy(&applied, proposed)
            applied.origins.byKey[option.key] = proposed.origins.byKey[option.key]
        }
        return applied
    }

    /// The options whose values differ between these settings and `other`, in table order.
    func differingOptions(from other: AgentSettings) -> [AgentOption] {
        AgentOption.all.filter { !$0.same(self, other) }
    }
}
