// The kit's provider that mints a token of any kind, under the field the provider response
// format names for that kind: shared by the fetcher's request-shape tests and the agent's
// transport tests.

import FleetTokenHTTP
import FleetTokenStore
import FleetTokenStoreTesting
import Foundation
import NIOHTTP1

extension TLSTokenServer {
    /// A token of the kind the request names (path `/token/{kind}/{id}`, or what `subject` reads),
    /// under that kind's samples field, with its claim.
    package static func anyKindToken(subject: @escaping @Sendable (TLSTokenServer.RecordedRequest) -> (kind: String, id: String) = { request in
        let parts = request.path.split(separator: "/").map { String($0).removingPercentEncoding ?? String($0) }
        return (parts.count >= 2 ? parts[parts.count - 2] : "vehicle", parts.last ?? "")
    }) -> TLSTokenServer.Respond {
        { request in
            let (kindName, id) = subject(request)
            guard let kind = TokenKind(rawValue: kindName) else { return .init(status: .notFound, body: #"{"error":"kind"}"#) }
            let now = Date()
            let token = TestJWT.make(kind: kind, subject: id, issuedAt: now)
            let field = ProviderResponseFormat().tokenField(for: kind)
            let encodedToken = String(decoding: try! JSONSerialization.data(withJSONObject: [field: token]), as: UTF8.self)
            return .init(body: String(encodedToken.dropLast()) + #","TOKEN_EXPIRATION":\#(Int(now.timeIntervalSince1970) + 3600)}"#)
        }
    }
}
