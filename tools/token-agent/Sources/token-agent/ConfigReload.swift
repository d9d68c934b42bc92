// Reloading while running: SIGHUP, or a change of the config file (noticed by
// swift-configuration's ReloadingFileProvider), re-reads the config file and the subjects file
// and applies what can change live: subjects, allow patterns, headers and header files, TLS
// files, the log level. Other options keep their old value until a restart, and say so. A
// reload that fails a check changes nothing and says why.

import Configuration
import FleetTokenHTTP
import FleetTokenService
import FleetTokenStore
import Foundation
import Logging
import Metrics
import ServiceLifecycle
import SystemPackage
import UnixSignals

/// Runs in the service group after the engine, so it is stopped first on graceful shutdown
/// (it ends by itself then) and never tracks into a stopped engine.
struct ConfigReloadService: Service {
    /// Trapped before the engine starts, so that an early SIGHUP never kills the agent.
    let hangups: UnixSignalsSequence
    var reloader: AgentReloader
    /// How often the config file is checked for changes.
    static let pollInterval: Duration = .seconds(5)

    /// Traps SIGHUP now (from here on it no longer ends the process) for a service run later.
    static func trappingHangups(_ reloader: AgentReloader) async -> ConfigReloadService {
        ConfigReloadService(hangups: await UnixSignalsSequence(trapping: .sighup), reloader: reloader)
    }

    func run() async {
        let (start, hangups) = (reloader, self.hangups)
        let (triggers, trigger) = AsyncStream.makeStream(of: ReloadTrigger.self)
        let watched = await watchedFile()
        await cancelWhenGracefulShutdown {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await _ in hangups { trigger.yield(.hangup) }
                }
                if let watched {
                    group.addTask { try? await watched.run() }
                    group.addTask {
                        // The first snapshot is the file as loaded; each later one is a change.
                        try? await watched.watchSnapshot { updates in
                            for try await _ in updates.dropFirst() { trigger.yield(.fileChanged) }
                        }
                    }
                }
                var reloader = start
                for await reason in triggers { await reloader.reload(reason) }
                group.cancelAll()
            }
        }
        trigger.finish()
    }

    /// The config file as swift-configuration's reloading provider follows it; nil without a
    /// file, or when it cannot be followed (SIGHUP still reloads it). Its snapshots are
    /// ``ConfigFileChange``s, which any bytes make: a change that does not parse reaches the
    /// reloader too, which says what is wrong with it (a YAML snapshot would fail to load and
    /// the provider would only log that at debug level).
    private func watchedFile() async -> ReloadingFileProvider<ConfigFileChange>? {
        guard let path = reloader.sources.file?.path else { return nil }
        // Its own log lines (every check at debug level) are not the operator's business.
        var quiet = reloader.logger
        quiet.logLevel = .warning
        do {
            return try await ReloadingFileProvider<ConfigFileChange>(
                filePath: FilePath(path), allowMissing: true, pollInterval: Self.pollInterval, logger: quiet,
                metrics: NOOPMetricsHandler.instance)
        } catch {
            reloader.logger.warning("the config file cannot be followed for changes; SIGHUP still reloads it",
                                    metadata: ["path": "\(path)", "error": "\(error)"])
            return nil
        }
    }
}

// ServiceLifecycle logs each service with `String(describing:)` at debug level: these hold the
// settings (header values) and the whole environment, so they describe themselves by name only.
extension ConfigReloadService: CustomStringConvertible {
    var description: String { "ConfigReloadService(config file: \(reloader.sources.file?.path ?? "none"))" }
}

/// The config file's bytes as the reloading provider saw them; it answers no value (the agent
/// reads the file itself on each change, with line numbers) and never fails to load.
struct ConfigFileChange: FileConfigSnapshot {
    struct ParsingOptions: FileParsingOptions {
        static var `default`: ParsingOptions { ParsingOptions() }
    }

    let providerName: String
    let size: Int

    init(data: RawSpan, providerName: String, parsingOptions: ParsingOptions) throws {
        self.providerName = providerName
        size = data.byteCount
    }

    func value(forKey key: AbsoluteConfigKey, type: ConfigType) throws -> LookupResult {
        LookupResult(encodedKey: key.description, value: nil)
    }

    var description: String { "\(providerName)[\(size) bytes]" }
    var debugDescription: String { description }
}

/// Why a reload runs.
enum ReloadTrigger: Sendable {
    /// SIGHUP: everything is read again, the CA bundles included.
    case hangup
    /// The config file changed on disk.
    case fileChanged
}

