// The baseline of the token API's hit figure: a Hummingbird server with the token API's server
// settings (HTTP/1.1 on a Unix socket, the same idle timeout, decoder limits and backlog), whose
// only route has the API's path pattern and answers a constant body with constant headers. The
// measurement tool gives it the agent's own answer, so both send the same bytes.
//
//   token-api-bare-route --socket PATH --body-file FILE [--header 'Name: value']...
//
// Serves until SIGTERM or SIGINT.

import Foundation
import HTTPTypes
import Hummingbird
import Logging
import NIOCore

func values(_ flag: String, in arguments: [String] = CommandLine.arguments) -> [String] {
    arguments.indices.dropLast().filter { arguments[$0] == flag }.map { arguments[$0 + 1] }
}
guard let socketPath = values("--socket").first, let bodyFile = values("--body-file").first,
      let body = FileManager.default.contents(atPath: bodyFile) else {
    FileHandle.standardError.write(Data("usage: token-api-bare-route --socket PATH --body-file FILE [--header 'Name: value']...\n".utf8))
    exit(64)
}
var headers: HTTPFields = [.contentType: "application/json"]
for header in values("--header") {
    guard let colon = header.firstIndex(of: ":"), let name = HTTPField.Name(String(header[..<colon])) else {
        FileHandle.standardError.write(Data("token-api-bare-route: --header \(header): write 'Name: value'\n".utf8))
        exit(64)
    }
    headers[name] = header[header.index(after: colon)...].trimmingCharacters(in: .whitespaces)
}
let responseHeaders = headers
let buffer = ByteBuffer(bytes: body)

var logger = Logger(label: "token-api-bare-route")
logger.logLevel = .warning
let router = Router(context: BasicRequestContext.self)
router.get("/v1/token/:kind/:id") { _, _ in
    Response(status: .ok, headers: responseHeaders, body: .init(byteBuffer: buffer))
}
let app = Application(
    router: router,
    // As TokenAPIService configures the agent's listeners.
    server: .http1(configuration: .init(
        idleTimeout: .seconds(30),
        httpDecoderConfiguration: .init(maxHeaderFieldSize: 8 * 1024, maxHeaderListSize: 16 * 1024, maxHeaderFieldCount: 100))),
    configuration: .init(address: .unixDomainSocket(path: socketPath), serverName: nil, backlog: 1024),
    logger: logger)
try await app.runService()
