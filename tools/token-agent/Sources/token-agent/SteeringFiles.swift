// The files besides the config file that steer the agent: the subjects file, header files, CA
// files, the client certificate and key. Each is refused when another user could have written
// it or replaced it (FleetTokenStore.SteeringFileCheck), at start (a usage error) and on every
// reload (the reload is refused, the settings in force stay). This check names the option; the
// readers judge again what they read, from the same open file (SteeringFileCheck.read). The
// config file itself is judged where it is read (AgentConfigFile.load); the encryption key
// files have stricter rules of their own.

import FleetTokenStore

/// A file an option names, from which the agent takes settings or provider credentials.
struct SteeringFile: Equatable, Sendable {
    let path: String
    /// How messages name it: `subjects file`, `Authorization header file`, `CA file`, ….
    let role: String
    /// The option that names it.
    let key: String
}

/// A steering file refused, with the option that named it as the operator gave it.
struct SteeringFileRefusal: Error, CustomStringConvertible {
    let file: SteeringFile
    let error: SteeringFileReadError
    /// `--subjects-file`, `TOKEN_AGENT_CA_FILE`, `/etc/token-agent.yaml:4 (header-file)`.
    let option: String

    var description: String { "\(option): \(error)" }
}

extension AgentSettings {
    /// Every file these settings read settings or provider credentials from, but the config
    /// file and the encryption key files.
    var steeringFiles: [SteeringFile] {
        var files: [SteeringFile] = []
        if let subjectsFile = self.subjectsFile { files.append(SteeringFile(path: subjectsFile, role: "subjects file", key: "subjects-file")) }
        for argument in self.headerFiles {
            guard let (name, path) = HeaderArgument.parseHeaderFile(argument) else { continue }
            files.append(SteeringFile(path: path, role: "\(name) header file", key: "header-file"))
        }
        files += self.caFiles.map { SteeringFile(path: $0, role: "CA file", key: "ca-file") }
        files += self.extraCAFiles.map { SteeringFile(path: $0, role: "extra CA file", key: "extra-ca-file") }
        if let clientCertificate = self.clientCertificate { files.append(SteeringFile(path: clientCertificate, role: "client certificate", key: "client-cert")) }
        if let clientKey = self.clientKey { files.append(SteeringFile(path: clientKey, role: "client key", key: "client-key")) }
        return files
    }

    /// Refuses the first steering file that another user could have written or replaced, or
    /// that cannot be examined. A missing file passes here: reading it says so.
    func checkSteeringFiles() throws(SteeringFileRefusal) {
        for file in steeringFiles {
            do { try SteeringFileCheck.check(path: file.path, role: file.role) } catch {
                throw SteeringFileRefusal(file: file, error: error, option: origins.name(file.key))
            }
        }
    }
}
