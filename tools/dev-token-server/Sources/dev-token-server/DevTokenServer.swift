// dev-token-server: the development issuer of Fleet-Engine-shaped tokens, standalone.
//
//   swift run dev-token-server --port 8080

public import ArgumentParser
import BuildStamp
import DevTokenIssuer
import Foundation
import Logging

@main
struct DevTokenServer: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "dev-token-server",
        abstract: "Serve Fleet-Engine-shaped RS256 JWTs for development and tests. NOT FOR PRODUCTION.",
        discussion: """
            GET /token/{kind}/{id} answers {"VEHICLE_TOKEN_KEY"|"TRIP_TOKEN_KEY": "<jwt>", "TOKEN_EXPIRATION": <unix seconds>}.
            Query parameters: expiration_format=epoch-seconds|epoch-millis|relative-seconds|none;
            fault=status|html|missing-token|missing-expiration|wrong-subject|expired|too-long|bad-base64|huge-body|hang|slow-body|same-token
            (with status=CODE, retry_after=SECONDS, delay_ms=N). GET /stats answers {"issued": N, "requests": N};
            with --record-issued-tokens, GET /stats/tokens answers every token issued, by kind/id.
            """,
        version: BuildStamp.versionLine(program: "dev-token-server"))

    @Option(help: "Address to listen on (loopback unless --allow-non-loopback).")
    var host = "127.0.0.1"

    @Option(help: "Port to listen on (0 picks a free one).")
    var port = 8080

    @Option(help: "Token lifetime in seconds (at most 3600).")
    var lifetime = 3600

    @Option(help: "PEM RSA private key to sign with (default: a fresh key per start).")
    var keyFile: String?

    @Flag(help: "Allow listening on a non-loopback address. The issuer gives tokens to anyone.")
    var allowNonLoopback = false

    @Flag(help: "Keep every issued token and answer them at GET /stats/tokens (for tests that look for token values on disk).")
    var recordIssuedTokens = false

    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical.")
    var logLevel: Logger.Level = .info

    func validate() throws {
        guard (1...3600).contains(lifetime) else { throw ValidationError("--lifetime must be between 1 and 3600 seconds") }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be between 0 and 65535") }
    }

    func run() async throws {
        var logger = Logger(label: "dev-token-server") { StreamLogHandler.standardError(label: $0) }
        logger.logLevel = logLevel
        var configuration = DevTokenIssuer.Configuration()
        configuration.host = host
        configuration.port = port
        configuration.lifetime = TimeInterval(lifetime)
        configuration.keyFile = keyFile
        configuration.allowNonLoopback = allowNonLoopback
        configuration.recordIssuedTokens = recordIssuedTokens
        let issuer = try await DevTokenIssuer.start(configuration, logger: logger)
        // Written unbuffered: scripts and tests read the URL (and its free port) from this line.
        FileHandle.standardOutput.write(Data("dev-token-server: NOT FOR PRODUCTION; listening on \(issuer.urlTemplate)\n".utf8))
        try await issuer.wait()
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}
