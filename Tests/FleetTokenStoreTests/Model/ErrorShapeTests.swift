// The public errors' shape: a code and properties per error, kinds that the store persists,
// construction as before, and messages in library terms (no program or flag named).

import FleetTokenStore
import Foundation
import Testing

@Suite("Public errors: codes, details, kinds and messages", .paced)
struct ErrorShapeTests {
    static let date = Date(timeIntervalSince1970: 1_700_000_000)

    static let validationErrors: [(TokenValidationError, TokenValidationError.Code, String)] = [
        (.malformed(detail: "two segments"), .malformed, "malformed"),
        (.undecodablePayload, .undecodablePayload, "undecodablePayload"),
        (.missingExpiry, .missingExpiry, "missingExpiry"),
        (.expired(expiresAt: date), .expired, "expired"),
        (.lifetimeTooLong(seconds: 7200, limit: 3600), .lifetimeTooLong, "lifetimeTooLong"),
        (.issuedInFuture(issuedAt: date), .issuedInFuture, "issuedInFuture"),
        (.subjectMismatch(expected: "a", claim: "vehicleid", found: "b"), .subjectMismatch, "subjectMismatch"),
        (.opaqueNotAllowed, .opaqueNotAllowed, "opaqueNotAllowed"),
        (.noProgress(expiresAt: date), .noProgress, "noProgress"),
        (.missingIssuedAt, .missingIssuedAt, "missingIssuedAt"),
        (.missingAuthorization(claim: "tripid"), .missingAuthorization, "missingAuthorization"),
    ]

    static let providerErrors: [(TokenProviderError, TokenProviderError.Code, String, Bool)] = [
        (.unreachable(detail: "refused"), .unreachable, "unreachable", true),
        (.timeout(seconds: 5), .timeout, "timeout", true),
        (.httpStatus(code: 503, retryAfter: 7), .httpStatus, "httpStatus", true),
        (.httpStatus(code: 404, retryAfter: nil), .httpStatus, "httpStatus", false),
        (.httpStatus(code: 429, retryAfter: nil), .httpStatus, "httpStatus", true),
        (.notJSON(detail: "HTML"), .notJSON, "notJSON", false),
        (.missingData(field: "VEHICLE_TOKEN_KEY"), .missingData, "missingData", false),
        (.bodyTooLarge(limitBytes: 1024), .bodyTooLarge, "bodyTooLarge", true),
        (.invalidToken(.expired(expiresAt: date)), .invalidToken, "expired", false),
        (.invalidToken(.noProgress(expiresAt: date)), .invalidToken, "noProgress", true),
        (.other(detail: "cancelled"), .other, "other", true),
        (.tlsCertificate(detail: "unknown CA"), .tlsCertificate, "tlsCertificate", false),
    ]

    static let storeErrors: [(TokenStoreError, TokenStoreError.Code)] = [
        (.directoryMissing(path: "/s/t.sqlite"), .directoryMissing),
        (.directoryNotWritable(path: "/s/t.sqlite", reason: "EACCES"), .directoryNotWritable),
        (.notAFile(path: "/s"), .notAFile),
        (.storeMissing(path: "/s/t.sqlite"), .storeMissing),
        (.storeNewerThanBuild(path: "/s/t.sqlite", storeVersion: 9, buildVersion: 2), .storeNewerThanBuild),
        (.storeOlderThanBuild(path: "/s/t.sqlite", storeVersion: 1, buildVersion: 2), .storeOlderThanBuild),
        (.corrupt(path: "/s/t.sqlite", detail: "not a database"), .corrupt),
        (.migrationFailed(path: "/s/t.sqlite", identifier: "V0003", reason: "no table"), .migrationFailed),
        (.diskFull(path: "/s/t.sqlite"), .diskFull),
        (.busy(path: "/s/t.sqlite", timeoutSeconds: 5), .busy),
        (.readOnly(path: "/s/t.sqlite"), .readOnly),
        (.closed(path: "/s/t.sqlite"), .closed),
        (.sqlite(path: "/s/t.sqlite", code: 1, message: "oops"), .sqlite),
        (.symbolicLink(path: "/s/t.sqlite", file: "/s/t.sqlite", target: "/elsewhere"), .symbolicLink),
        (.symbolicLink(path: "/s/t.sqlite", file: "/s/t.sqlite-wal", target: "/elsewhere"), .symbolicLink),
        (.notOwnedByUser(path: "/s/t.sqlite", file: "/s/t.sqlite", ownerID: 0, userID: 1000), .notOwnedByUser),
        (.fileModeTooOpen(path: "/s/t.sqlite", file: "/s/t.sqlite", mode: 0o644, reason: nil), .fileModeTooOpen),
        (.fileModeTooOpen(path: "/s/t.sqlite", file: "/s/t.sqlite", mode: 0o644, reason: "EPERM"), .fileModeTooOpen),
    ]

    static let keyErrors: [(InvalidTokenKey, InvalidTokenKey.Code)] = [
        (.emptySubjectID(kind: .vehicle), .emptySubjectID),
        (.subjectIDTooLong(kind: .trip, length: 600), .subjectIDTooLong),
        (.controlCharacters(kind: .task), .controlCharacters),
        (.pathSegment(kind: .vehicle, subjectID: ".."), .pathSegment),
    ]

    /// Every message any of these errors can give.
    static var allMessages: [String] {
        validationErrors.map(\.0.description) + providerErrors.map(\.0.description) + storeErrors.map(\.0.description)
            + keyErrors.map(\.0.description)
            + [TokenUnavailable.Reason.shuttingDown.description]
    }

    @Test("each validation error has its code, and its kind is the name the store persists")
    func validationCodes() {
        for (error, code, kind) in Self.validationErrors {
            #expect(error.code == code, "\(error)")
            #expect(error.kind == kind && code.description == kind, "\(error)")
        }
        let mismatch = TokenValidationError.subjectMismatch(expected: "a", claim: "vehicleid", found: "b")
        #expect(mismatch.expectedSubject == "a" && mismatch.claim == "vehicleid" && mismatch.foundSubject == "b")
        #expect(mismatch.expiresAt == nil && mismatch.detail == nil)
        #expect(TokenValidationError.lifetimeTooLong(seconds: 7200, limit: 3600).lifetime == 7200)
        #expect(mismatch != .subjectMismatch(expected: "a", claim: "vehicleid", found: "c"))
    }

    @Test("each provider error has its code, kind, retryability and details")
    func providerCodes() {
        for (error, code, kind, retryable) in Self.providerErrors {
            #expect(error.code == code, "\(error)")
            #expect(error.kind == kind, "\(error)")
            #expect(error.isRetryable == retryable, "\(error)")
        }
        let status = TokenProviderError.httpStatus(code: 503, retryAfter: 7)
        #expect(status.statusCode == 503 && status.retryAfter == 7 && status.detail == nil)
        #expect(status == .httpStatus(code: 503, retryAfter: 7) && status != .httpStatus(code: 503, retryAfter: nil))
        #expect(TokenProviderError.timeout(seconds: 5).retryAfter == nil)
        #expect(TokenProviderError.invalidToken(.missingExpiry).validationError == .missingExpiry)
        #expect(TokenProviderError.missingData(field: "f").field == "f")
    }

    @Test("a code can be matched in a switch with a default, as users of a growing type must")
    func switchOverCode() {
        func name(_ error: TokenProviderError) -> String {
            switch error.code {
            case .httpStatus: "status \(error.statusCode ?? 0)"
            case .timeout: "timeout"
            default: "other"
            }
        }
        #expect(name(.httpStatus(code: 401, retryAfter: nil)) == "status 401")
        #expect(name(.timeout(seconds: 1)) == "timeout")
        #expect(name(.unreachable(detail: "x")) == "other")
        func thrower() throws(TokenProviderError) { throw .timeout(seconds: 5) }
        #expect(throws: TokenProviderError.timeout(seconds: 5)) { try thrower() }
    }

    @Test("store errors keep their path and details; unavailable reasons carry their error")
    func storeAndReasonDetails() throws {
        for (error, code) in Self.storeErrors {
            #expect(error.code == code && error.path.hasPrefix("/s"), "\(error)")
        }
        let busy = TokenStoreError.busy(path: "/s", timeoutSeconds: 5)
        #expect(busy.timeoutSeconds == 5 && busy.code.description == "busy")
        let link = TokenStoreError.symbolicLink(path: "/s", file: "/s", target: "/t")
        #expect(link.file == "/s" && link.target == "/t")

        let key = try TokenKey.vehicle("v")
        let provider = TokenUnavailable.Reason.provider(.timeout(seconds: 5))
        #expect(provider.code == .provider && provider.providerError == .timeout(seconds: 5) && provider.storeError == nil)
        let store = TokenUnavailable.Reason.store(busy)
        #expect(store.code == .store && store.storeError == busy && store.providerError == nil)
        #expect(TokenUnavailable.Reason.shuttingDown.code == .shuttingDown)
        let unavailable = TokenUnavailable(key: key, reason: provider, nextAttemptAt: nil)
        #expect(unavailable.description == "no usable token for vehicle/v: token provider did not answer within 5.0 s")
        for (error, code) in Self.keyErrors { #expect(error.code == code && error.kind != .deliveryVehicle, "\(error)") }
        #expect(InvalidTokenKey.subjectIDTooLong(kind: .trip, length: 600).length == 600)
    }

    @Test("library messages name no program and no command-line flag (the programs add theirs)")
    func messagesInLibraryTerms() {
        for message in Self.allMessages {
            #expect(!message.contains("token-agent") && !message.contains("tokenctl"), "\(message)")
            #expect(message.range(of: #"--[a-z]"#, options: .regularExpression) == nil, "\(message)")
        }
        #expect(TokenProviderError.tlsCertificate(detail: "x").description.contains("trust the CA that signed the provider's certificate"))
    }
}
