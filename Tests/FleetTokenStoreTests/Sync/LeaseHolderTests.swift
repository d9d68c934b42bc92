// How the engine names itself in refresh leases and judges another holder dead.

import Foundation
import Testing
@testable import FleetTokenStore

@Suite("Refresh lease holders", .paced)
struct LeaseHolderTests {
    @Test("a holder names the host, the process and the machine (boot id and PID namespace)")
    func name() throws {
        let holder = RefreshLeaseHolder.make()
        let machine = try #require(RefreshLeaseHolder.machineIdentity)
        #expect(holder.hasSuffix("@" + machine))
        #expect(holder.contains("/pid-\(getpid())-"))
        #expect(holder.hasPrefix(ProcessInfo.processInfo.hostName.filter { !"/@".contains($0) }.prefix(64) + "/"))
        #expect(!RefreshLeaseHolder.isDeadProcess(holder), "this process is alive")
    }

    @Test("dead only when the named process of this machine is gone; another machine's holder is waited out")
    func judgement() throws {
        let machine = try #require(RefreshLeaseHolder.machineIdentity)
        // A PID that cannot exist (above pid_max's ceiling).
        let gone = "pid-4194305-abcdef12"
        #expect(RefreshLeaseHolder.isDeadProcess("some-host/\(gone)@\(machine)"))
        #expect(RefreshLeaseHolder.isDeadProcess("\(gone)@\(machine)"), "names written before the host was added")
        #expect(!RefreshLeaseHolder.isDeadProcess("other-host/\(gone)@another-boot-id:4026531836"))
        #expect(!RefreshLeaseHolder.isDeadProcess("some-host/pid-\(getpid())-abcdef12@\(machine)"))
        #expect(!RefreshLeaseHolder.isDeadProcess("not a holder name"))
    }
}
