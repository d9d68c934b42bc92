// Checks of the effective settings and the parts built from them (subjects, fetcher, API
// addresses). Every message names the option as the operator gave it: a flag, a variable or
// a config file line.

import FleetTokenHTTP
import FleetEngineProxy
import FleetTokenService
import FleetTokenStore
import Foundation
#if canImport(Glibc)
import Glibc
#endif

extension AgentSettings {
    /// Everything that can be checked before the agent starts; the first problem is thrown.
    func check(environment: [String: String]) throws(UsageError) {
        // Header values hold credentials: errors name the option (and a valid header name),
        // never the value.
        for (index, header) in self.headers.enumerated() {
            let name = HeaderArgument.flag(origins.name("header"), index, of: self.headers.count)
            guard let (headerName, value) = HeaderArgument.parseHeader(header) else {
                throw UsageError("\(name) is not 'Name: value' (the value is not shown: it may hold a credential)")
            }
            try HeaderArgument.check(name, name: headerName, value: value)
        }
        for (index, file) in self.headerFiles.enumerated() {
            let name = HeaderArgument.flag(origins.name("header-file"), index, of: self.headerFiles.count)
            guard let (headerName, _) = HeaderArgument.parseHeaderFile(file) else {
                throw UsageError("\(name) is not 'Name:PATH' (the value is not shown: it may hold a credential)")
            }
            try HeaderArgument.check(name, name: headerName, value: "")
        }
        _ = try subjectKeys()
        for key in ["connect-timeout", "request-timeout"] {
            let value = key == "connect-timeout" ? self.connectTimeout : self.requestTimeout
            guard (0.001...3600).contains(value) else { throw UsageError("\(origins.name(key)) must be between 0.001 and 3600 seconds") }
        }
        guard (10...3600).contains(self.demoLifetime) else { throw UsageError("\(origins.name("demo-lifetime")) must be between 10 and 3600") }
        guard (0.1...3600).contains(self.leaseDuration) else { throw UsageError("\(origins.name("lease-duration")) must be between 0.1 and 3600 seconds") }
        guard (1...86_400).contains(self.idleWindow) else { throw UsageError("\(origins.name("idle-window")) must be between 1 and 86400 seconds") }
        if let failureBackoff = self.failureBackoff, !(0.1...3600).contains(failureBackoff) {
            throw UsageError("\(origins.name("failure-backoff")) must be between 0.1 and 3600 seconds")
        }
        guard (0...10_000_000).contains(self.maxEventLines) else {
            throw UsageError("\(origins.name("max-event-lines")) must be between 0 (no limit) and 10000000")
        }
        guard (1...3600).contains(self.eventLineWindow) else { throw UsageError("\(origins.name("event-line-window")) must be between 1 and 3600 seconds") }
        guard (1...10_000_000).contains(self.maxDynamicSubjects) else {
            throw UsageError("\(origins.name("max-dynamic-subjects")) must be between 1 and 10000000")
        }
        for (key, value) in [("max-api-connections", self.maxAPIConnections), ("max-api-connections-per-peer", self.maxAPIConnectionsPerPeer)] {
            if let value, !(1...1_000_000).contains(value) { throw UsageError("\(origins.name(key)) must be between 1 and 1000000") }
        }
        guard (1...1000).contains(self.permanentErrorAttempts) else {
            throw UsageError("\(origins.name("permanent-error-attempts")) must be between 1 and 1000")
        }
        if self.providerURL == nil, let key = ["header", "header-file"].first(where: { !values[$0, default: []].isEmpty }) {
            throw UsageError("\(origins.name(key)) needs --provider-url")
        }
        try checkTransport(environment: environment)
        _ = try listenAddresses(demo: false)
        _ = try allowList()
        _ = try clientPolicy()
        if self.once && !self.listen.isEmpty { throw UsageError("\(origins.name("listen")) serves tokens while the agent runs: it does not go with --once") }
        _ = try fleetEngineProxySettings(environment: environment)
        guard let mode = socketModeValue else {
            throw UsageError("\(origins.name("socket-mode")) \(self.socketMode): give an octal mode such as 0660 or 0600")
        }
        // Whoever may connect gets tokens: "others" would be every user and service on the host.
        guard mode & 0o007 == 0 else {
            throw UsageError("\(origins.name("socket-mode")) \(self.socketMode) lets every user on the host connect and take tokens: give the clients a group and use 0660 (or 0600 for the agent's user alone)")
        }
        if self.once && self.sink != nil { throw UsageError("\(origins.name("sink")) keeps files fresh while the agent runs: it does not go with --once") }
        guard sinkModeValue != nil else {
            throw UsageError("\(origins.name("sink-mode")) \(self.sinkMode): give an octal mode such as 0640 or 0600 (no execute bits; only the owner may write; nothing for others, who would be every user on the host)")
        }
    }

    /// The request-shape, TLS and proxy options (the files themselves are checked when the fetcher is made).
    private func checkTransport(environment: [String: String]) throws(UsageError) {
        let given = [(!self.caFiles.isEmpty, "ca-file"), (!self.extraCAFiles.isEmpty, "extra-ca-file"),
                     (self.clientCertificate != nil, "client-cert"), (self.clientKey != nil, "client-key"),
                     (self.proxy != nil && self.fleetEngineListen.isEmpty, "proxy"), (self.method != .get, "method"), (self.bodyTemplate != nil, "body-template")]
        if self.providerURL == nil, let (_, key) = given.first(where: \.0) {
            throw UsageError("\(origins.name(key)) needs --provider-url (the demo issuer is plain HTTP on loopback)")
        }
        if (self.clientCertificate == nil) != (self.clientKey == nil) {
            let given = origins.name(self.clientCertificate == nil ? "client-key" : "client-cert")
            throw UsageError("\(given): --client-cert and --client-key go together: give both PEM files, or neither")
        }
        if self.proxy != nil && self.noProxy { throw UsageError("\(origins.name("proxy")) and \(origins.name("no-proxy")) exclude each other") }
        if self.contentType != nil && self.bodyTemplate == nil { throw UsageError("\(origins.name("content-type")) needs --body-template") }
        if self.bodyTemplate != nil && self.method != .post { throw UsageError("\(origins.name("body-template")) needs --method POST") }
        _ = try requestBody()
        _ = try proxySettings(environment: environment)
    }

    /// The API's listen addresses; demo mode listens on ./token-agent.sock unless told otherwise.
    func listenAddresses(demo: Bool) throws(UsageError) -> [ListenAddress] {
        if self.listen.isEmpty && demo && !self.once { return [.unix(path: "./token-agent.sock")] }
        do {
            return try self.listen.map { try ListenAddress(parsing: $0, allowNonLoopback: self.allowNonLoopbackListen) }
        } catch {
            throw UsageError("\(origins.name("listen")): \(OperatorHints.describe(error))")
        }
    }

    /// The Fleet Engine proxy's listen addresses (the token API's rules) and configuration;
    /// nil when `--fleet-engine-listen` is not given.
    func fleetEngineProxySettings(environment: [String: String]) throws(UsageError) -> (addresses: [ListenAddress], configuration: FleetEngineProxy.Configuration)? {
        let others = [("fleet-engine-ca-file", self.fleetEngineCAFile != nil), ("fleet-engine-default-subject", self.fleetEngineDefaultSubject != nil),
                      ("fleet-engine-url", self.fleetEngineURL != FleetEngineEndpoint.defaultURL)]
        guard !self.fleetEngineListen.isEmpty else {
            if let (key, _) = others.first(where: \.1) { throw UsageError("\(origins.name(key)) needs --fleet-engine-listen") }
            return nil
        }
        if self.once { throw UsageError("\(origins.name("fleet-engine-listen")) serves calls while the agent runs: it does not go with --once") }
        let addresses: [ListenAddress]
        do {
            addresses = try self.fleetEngineListen.map { try ListenAddress(parsing: $0, allowNonLoopback: self.allowNonLoopbackListen) }
        } catch {
            throw UsageError("\(origins.name("fleet-engine-listen")): \(OperatorHints.describe(error))")
        }
        let endpoint: FleetEngineEndpoint
        do {
            endpoint = try FleetEngineEndpoint(parsing: self.fleetEngineURL)
        } catch {
            throw UsageError("\(origins.name("fleet-engine-url")): \(error.description)")
        }
        // As for the provider: a CA file given for a plain http:// URL would be read by nothing,
        // and whoever wrote it believes calls are checked against it.
        if self.fleetEngineCAFile != nil && !endpoint.secure {
            throw UsageError("\(origins.name("fleet-engine-ca-file")) applies to an https:// --fleet-engine-url, not \(endpoint): remove it, or use https://")
        }
        var defaultSubject: TokenKey?
        if let text = self.fleetEngineDefaultSubject {
            guard let colon = text.firstIndex(of: ":"), let kind = TokenKind(rawValue: String(text[..<colon])),
                  let key = try? TokenKey(kind: kind, subjectID: String(text[text.index(after: colon)...])) else {
                throw UsageError("\(origins.name("fleet-engine-default-subject")) \"\(text)\": write KIND:ID, e.g. vehicle:fleet-admin (kinds: vehicle, trip, deliveryVehicle, task)")
            }
            defaultSubject = key
        }
        var configuration = FleetEngineProxy.Configuration(endpoint: endpoint, caFile: self.fleetEngineCAFile,
                                                           subjectRule: FleetEngineSubjectRule(defaultSubject: defaultSubject))
        // The provider's forward proxy settings, for Fleet Engine too.
        configuration.proxySettings = try proxySettings(environment: environment)
        return (addresses, configuration)
    }

    /// The `--allow` patterns as the API's allow list (the configured subjects are allowed as
    /// the engine's tracked keys: ``TokenAPI/Configuration/allowsTrackedSubjects``).
    func allowList() throws(UsageError) -> SubjectAllowList {
        do {
            return SubjectAllowList(patterns: try allowPatterns())
        } catch {
            throw UsageError("\(origins.name("allow")) \(error)")
        }
    }

    /// The `--allow-client` rules, names resolved now (at start, and on every reload).
    /// - Throws: ``UsageError`` for a bad rule, an unknown name, or rules beside a TCP listener of
    ///   the token API or the Fleet Engine proxy (whose callers cannot be identified).
    func clientPolicy() throws(UsageError) -> ClientAccessPolicy {
        let policy: ClientAccessPolicy
        do {
            policy = try ClientAccessPolicy(rules: try self.allowClient.map { text throws(ClientRuleError) in try ClientRule(parsing: text) })
        } catch {
            throw UsageError("\(origins.name("allow-client")) \(error)")
        }
        // The token API's listeners and the Fleet Engine proxy's alike.
        for (key, addresses) in [("listen", self.listen), ("fleet-engine-listen", self.fleetEngineListen)] where !policy.isEmpty {
            if let tcp = addresses.first(where: { !$0.hasPrefix("unix:") }) {
                throw UsageError("\(origins.name("allow-client")) grants tokens per caller, and a caller over TCP (\(origins.name(key)) \(tcp)) cannot be identified: listen on a Unix socket only")
            }
        }
        // The sink's files are the agent's group's to read, and that is the group the socket's
        // callers join: every one of them would read every subject's token, whatever the rules.
        if !policy.isEmpty, self.sink != nil, let mode = sinkModeValue, mode & 0o070 != 0 {
            throw UsageError("\(origins.name("allow-client")) grants tokens per caller, but \(origins.name("sink"))'s files (\(origins.name("sink-mode")) \(self.sinkMode)) are readable by the agent's group, which the socket's callers join, whatever the rules: give --sink-mode 0600 (files for the agent's user alone), or drop --sink")
        }
        return policy
    }

    func allowPatterns() throws -> [SubjectAllowList.Pattern] {
        try self.allow.map { try SubjectAllowList.Pattern(parsing: $0) }
    }

    var socketModeValue: mode_t? {
        mode_t(self.socketMode, radix: 8).flatMap { $0 <= 0o777 ? $0 : nil }
    }

    var sinkModeValue: mode_t? {
        // Token files: no execute bits, no writer but the owner, and, as for the socket, nothing
        // for "others" (every user and service on the host).
        mode_t(self.sinkMode, radix: 8).flatMap { $0 <= 0o777 && $0 & 0o137 == 0 ? $0 : nil }
    }

    /// The POST body, or a usage error naming the option.
    func requestBody() throws(UsageError) -> RequestBodyTemplate? {
        guard let bodyTemplate = self.bodyTemplate else { return nil }
        do {
            return try RequestBodyTemplate(bodyTemplate, contentType: self.contentType ?? "application/json")
        } catch {
            throw UsageError("\(origins.name("body-template")): \(error)")
        }
    }

    /// `--proxy` / `--no-proxy` over the environment's proxy variables; a bad proxy URL is a
    /// usage error naming its variable or option, with any password as `***`.
    func proxySettings(environment: [String: String]) throws(UsageError) -> ProxySettings {
        let override: ProxySettings.Override? = self.noProxy ? .direct : self.proxy.map { .proxy($0) }
        do {
            return try ProxySettings.fromEnvironment(environment, override: override)
        } catch {
            // The library calls an override "the proxy override": name it as the operator gave it.
            let named = self.proxy == nil ? error : ProxySettingsError(code: error.code, source: origins.name("proxy"), value: error.value)
            throw UsageError(named.description)
        }
    }

    /// Every subject the options name, in option order (the subjects file is read apart).
    func subjectKeys() throws(UsageError) -> [TokenKey] {
        var keys: [TokenKey] = []
        for (kind, ids) in [(TokenKind.vehicle, self.vehicles), (.trip, self.trips), (.deliveryVehicle, self.deliveryVehicles), (.task, self.tasks)] {
            for id in ids {
                do {
                    keys.append(try TokenKey(kind: kind, subjectID: id))
                } catch {
                    throw UsageError("\(origins.name(TokenAgent.flagName(kind))) '\(id)': \(error)")
                }
            }
        }
        return keys
    }

    /// The fetcher's configuration for `template` (the demo issuer's, or --provider-url).
    func fetcherConfiguration(template: String, demo: Bool, environment: [String: String]) throws(UsageError) -> HTTPTokenFetcherConfiguration {
        var configuration = HTTPTokenFetcherConfiguration(urlTemplate: template)
        configuration.headers = self.headers.compactMap(HeaderArgument.parseHeader)
        configuration.headerFiles = self.headerFiles.compactMap(HeaderArgument.parseHeaderFile)
        configuration.tokenKey = self.tokenKey
        configuration.expirationKey = self.expirationKey.isEmpty ? nil : self.expirationKey
        configuration.expirationFormat = self.expirationFormat
        configuration.allowInsecureHTTP = self.allowInsecureHTTP
        configuration.connectTimeout = self.connectTimeout
        configuration.totalTimeout = self.requestTimeout
        configuration.method = self.method
        configuration.body = try requestBody()
        configuration.tls.caFiles = self.caFiles
        configuration.tls.extraCAFiles = self.extraCAFiles
        configuration.tls.clientCertificateFile = self.clientCertificate
        configuration.tls.clientKeyFile = self.clientKey
        // The demo issuer is on loopback: no proxy, whatever the environment says.
        configuration.proxy = demo ? .direct : try proxySettings(environment: environment)
        return configuration
    }

    /// The engine's policy from the options.
    var policy: RefreshPolicy {
        var policy = RefreshPolicy()
        policy.retention = self.retention.seconds
        policy.allowOpaqueTokens = self.allowOpaqueTokens
        policy.leaseDuration = self.leaseDuration
        policy.idleWindow = self.idleWindow
        if let failureBackoff = self.failureBackoff {
            // Both bases: the engine's first backoff is the larger of the two.
            policy.nonRetryableBackoffBase = failureBackoff
            policy.backoffBase = min(policy.backoffBase, failureBackoff)
        }
        return policy
    }
}

/// Parses the `--header` and `--header-file` value forms.
enum HeaderArgument {
    /// `--header`, or `--header #2` when there are several.
    static func flag(_ name: String, _ index: Int, of count: Int) -> String {
        count > 1 ? "\(name) #\(index + 1)" : name
    }

    /// The fetcher's own header rules, as a usage error naming the option.
    static func check(_ flag: String, name: String, value: String) throws(UsageError) {
        do {
            try HTTPTokenFetcher.checkHeader(name: name, value: value)
        } catch {
            guard error.code == .invalidHeader, let detail = error.detail else { throw UsageError("\(flag): \(error.description)") }
            throw UsageError("\(flag): \(detail)")
        }
    }

    static func parseHeader(_ text: String) -> (name: String, value: String)? {
        guard let colon = text.firstIndex(of: ":") else { return nil }
        let name = text[..<colon].trimmingCharacters(in: .whitespaces)
        let value = text[text.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        return name.isEmpty ? nil : (name, value)
    }

    static func parseHeaderFile(_ text: String) -> (name: String, path: String)? {
        guard let colon = text.firstIndex(of: ":") else { return nil }
        let name = text[..<colon].trimmingCharacters(in: .whitespaces)
        let path = String(text[text.index(after: colon)...])
        return name.isEmpty || path.isEmpty ? nil : (name, path)
    }
}
