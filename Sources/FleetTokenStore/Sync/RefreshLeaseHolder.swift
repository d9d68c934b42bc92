// Sync layer: how the engine names itself in refresh leases, and its judgement that a lease's
// holder has died (so the lease is taken over at once, through RefreshLeaseStore's take-over).
import Foundation
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Names a process in refresh leases, so that another process on the same machine can tell
/// when a lease's holder has died.
///
/// Why: a lease expires after ``RefreshPolicy/leaseDuration`` (30 s), but an agent killed in the
/// middle of a fetch (kill -9, OOM, power cut of a container) leaves its leases behind, and its
/// restarted successor — a different holder — would wait out all of them before refetching those
/// keys. With short-lived tokens that wait is longer than the time left before the floor.
///
/// The name is `<host>/pid-<pid>-<random>@<machine>`: `<host>` is the host name, for the
/// operator reading a shared database's leases; `<machine>` is the kernel's boot id and the PID
/// namespace, so a PID is only ever judged in the namespace it was taken in, and a holder on
/// another host (another boot id) is never judged dead: its lease is waited out. The store only
/// keeps lease records: the engine judges a holder with ``isDeadProcess(_:)`` and then asks the
/// store to take the lease over from exactly that holder.
enum RefreshLeaseHolder {
    /// A new holder name for this process.
    static func make() -> String {
        let host = ProcessInfo.processInfo.hostName.filter { !"/@".contains($0) }
        let base = (host.isEmpty ? "" : host.prefix(64) + "/") + "pid-\(getpid())-\(UUID().uuidString.prefix(8))"
        guard let machine = machineIdentity else { return base }
        return base + "@" + machine
    }

    /// True only when `holder` names a process of this machine and PID namespace that no longer
    /// exists. Anything else (another machine or namespace, an older name without a machine,
    /// a live process, a PID already reused) counts as alive: the lease is then waited for.
    static func isDeadProcess(_ holder: String) -> Bool {
        guard let machine = machineIdentity,
              let at = holder.lastIndex(of: "@"), holder[holder.index(after: at)...] == machine else { return false }
        // Older names have no `<host>/` in front.
        let process = holder[..<at].split(separator: "/").last ?? ""
        let parts = process.split(separator: "-")
        guard parts.count >= 3, parts[0] == "pid", let pid = pid_t(parts[1]), pid > 0, pid != getpid() else { return false }
        return kill(pid, 0) != 0 && errno == ESRCH
    }

    /// `<boot id>:<pid namespace inode>`, or nil where either cannot be read (not Linux).
    static let machineIdentity: String? = {
        guard let boot = try? String(contentsOfFile: "/proc/sys/kernel/random/boot_id", encoding: .utf8)
            .trimmingCharacters(in: .whitespacesAndNewlines), !boot.isEmpty,
            let namespace = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/pid"),
            !namespace.isEmpty else { return nil }
        // "pid:[4026531836]" -> "4026531836"
        let inode = namespace.filter(\.isNumber)
        return inode.isEmpty ? nil : "\(boot):\(inode)"
    }()
}
