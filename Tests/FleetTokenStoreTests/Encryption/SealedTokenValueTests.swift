import FleetTokenStoreTesting
import Foundation
import Synchronization
import Testing
import TestSupportKit
@testable import FleetTokenStore

@Suite("Sealed token values: AES-GCM bound to kind, subject id, key id and fingerprint", .paced)
struct SealedTokenValueTests {
    let key = TokenEncryptionKey.random()
    let vehicle = try! TokenKey.vehicle("truck-7")
    let value = TestJWT.make(for: try! TokenKey.vehicle("truck-7"), issuedAt: referenceNow, lifetime: 3600)

    @Test("a sealed value opens to the token; it shows the key id and fingerprint, never the token or its signature")
    func roundTrip() throws {
        let sealed = SealedTokenValue.seal(value, for: vehicle, with: key)
        #expect(sealed.hasPrefix("sealed:v1:\(key.id):\(TokenFingerprint(of: value)):"))
        #expect(!sealed.contains(value))
        let signature = try #require(value.split(separator: ".").last)
        #expect(!sealed.contains(signature))
        #expect(SealedTokenValue.keyID(ofStored: sealed) == key.id)
        #expect(SealedTokenValue.fingerprint(ofStored: sealed) == TokenFingerprint(of: value))
        #expect(SealedTokenValue.fingerprint(ofStored: value) == TokenFingerprint(of: value))
        #expect(SealedTokenValue.open(sealed, for: vehicle, with: TokenKeyring(primary: key)) == .opened(value, keyID: key.id))
    }

    @Test("a fingerprint is the first 6 bytes of SHA-256 in lowercase hex (the value sealed values carry)")
    func fingerprintDigits() {
        // SHA-256("abc") = ba7816bf8f01cfea…, SHA-256("") = e3b0c44298fc1c14…
        #expect(TokenFingerprint(of: "abc").description == "ba7816bf8f01")
        #expect(TokenFingerprint(of: "").description == "e3b0c44298fc")
        #expect(TokenFingerprint(of: String(repeating: "é", count: 3)) == TokenFingerprint(of: "ééé"))
    }

    @Test("a JWT is sealed as its segments' bytes, so the sealed text is about as long as the token; every token comes back exactly")
    func packedPlaintext() throws {
        let sealed = SealedTokenValue.seal(value, for: vehicle, with: key)
        #expect(sealed.count <= value.count + 80, "\(sealed.count) characters for a \(value.count)-character token")
        let keyring = TokenKeyring(primary: key)
        // Canonical JWTs, a segment with stray low bits (not canonical: kept as text), padding,
        // opaque tokens with and without dots, empty segments, non-ASCII text.
        let stray = value.dropLast() + (value.last == "A" ? "B" : "A")
        let tokens = [value, jwtLike(vehicle), String(stray), value + "==", "opaque-token", "a.b", "a..c", "..", "",
                      "tök.én.ü", String(repeating: "x", count: 5000)]
        for token in tokens {
            let sealedToken = SealedTokenValue.seal(token, for: vehicle, with: key)
            #expect(SealedTokenValue.open(sealedToken, for: vehicle, with: keyring) == .opened(token, keyID: key.id), "\(token.prefix(40))")
        }
        // The codec against Foundation's base64 for every length's tail.
        for length in 0..<70 {
            let bytes = (0..<length).map { UInt8(truncatingIfNeeded: $0 &* 37 &+ 11) }
            let foundation = Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
                .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
            #expect(Base64URL.encode(bytes) == foundation)
            #expect(decode(foundation) == bytes)
        }
        #expect(decode("QQ==") == nil && decode("QR") == nil && decode("Q") == nil && decode("QQ") == [0x41])
    }

    func decode(_ text: String) -> [UInt8]? {
        Array(text.utf8).withUnsafeBufferPointer { Base64URL.decode($0) }
    }

    @Test("every write has its own nonce: the same token sealed twice differs")
    func freshNonce() {
        let first = SealedTokenValue.seal(value, for: vehicle, with: key)
        let second = SealedTokenValue.seal(value, for: vehicle, with: key)
        #expect(first != second)
    }

    @Test("a value copied onto another subject, or another kind, does not open")
    func boundToRow() throws {
        let sealed = SealedTokenValue.seal(value, for: vehicle, with: key)
        let keyring = TokenKeyring(primary: key)
        #expect(SealedTokenValue.open(sealed, for: try .vehicle("truck-8"), with: keyring) == .failed(keyID: key.id))
        #expect(SealedTokenValue.open(sealed, for: try .trip("truck-7"), with: keyring) == .failed(keyID: key.id))
    }

    @Test("an altered byte, a relabelled key id or fingerprint, a truncated value: none opens")
    func tamperedValues() throws {
        let keyring = TokenKeyring(primary: key)
        let other = TokenEncryptionKey.random()
        let sealed = SealedTokenValue.seal(value, for: vehicle, with: key)
        var payload = Array(sealed.utf8)
        let index = payload.count - 30
        payload[index] = payload[index] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        #expect(SealedTokenValue.open(String(decoding: payload, as: UTF8.self), for: vehicle, with: keyring) == .failed(keyID: key.id))
        // The other key's id on this key's ciphertext: opened with the other key, it fails.
        let relabelled = sealed.replacingOccurrences(of: key.id, with: other.id)
        #expect(SealedTokenValue.open(relabelled, for: vehicle, with: TokenKeyring(primary: other, others: [key])) == .failed(keyID: other.id))
        let refingered = sealed.replacingOccurrences(of: TokenFingerprint(of: value).description, with: "000000000000")
        #expect(SealedTokenValue.open(refingered, for: vehicle, with: keyring) == .failed(keyID: key.id))
        #expect(SealedTokenValue.open(String(sealed.dropLast(8)), for: vehicle, with: keyring) == .failed(keyID: key.id))
        #expect(SealedTokenValue.open("sealed:v1:garbage", for: vehicle, with: keyring) == .failed(keyID: "unknown"))
    }

    @Test("a value sealed with a key not held names its key id; a plaintext value is told apart")
    func missingKeyAndPlaintext() {
        let sealed = SealedTokenValue.seal(value, for: vehicle, with: key)
        #expect(SealedTokenValue.open(sealed, for: vehicle, with: TokenKeyring(primary: .random())) == .missingKey(key.id))
        #expect(SealedTokenValue.open(sealed, for: vehicle, with: nil) == .missingKey(key.id))
        #expect(SealedTokenValue.open(value, for: vehicle, with: TokenKeyring(primary: key)) == .plaintext(value))
        #expect(SealedTokenValue.keyID(ofStored: value) == nil)
    }

    @Test("a key's id is stable, 16 hex digits, and differs between keys; a second key opens what it sealed")
    func keyIDsAndRotation() throws {
        let bytes = Data((0..<32).map { UInt8($0) })
        let first = try TokenEncryptionKey(bytes: bytes), again = try TokenEncryptionKey(bytes: bytes)
        #expect(first.id == again.id && first.id.count == 16 && first.id.allSatisfy(\.isHexDigit))
        #expect(first.id != TokenEncryptionKey.random().id)
        let old = TokenEncryptionKey.random()
        let sealedOld = SealedTokenValue.seal(value, for: vehicle, with: old)
        let rotating = TokenKeyring(primary: first, others: [old, old])
        #expect(rotating.ids == [first.id, old.id])
        #expect(SealedTokenValue.open(sealedOld, for: vehicle, with: rotating) == .opened(value, keyID: old.id))
        #expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey(bytes: Data(count: 16)) }
    }
}

@Suite("Key files: 32 bytes raw or base64, owned by this user, no access for group or others", .paced)
struct KeyFileTests {
    let dir = Scratch()

    func write(_ name: String, _ bytes: Data, mode: mode_t = 0o600) -> String {
        let path = dir.file(name)
        #expect(FileManager.default.createFile(atPath: path, contents: bytes))
        chmod(path, mode)
        return path
    }

    @Test("raw and base64 files give the same key; a base64 file may end in a newline")
    func formats() throws {
        let bytes = Data((0..<32).map { _ in UInt8.random(in: 0...255) })
        let raw = try TokenEncryptionKey.load(file: write("raw", bytes))
        let text = try TokenEncryptionKey.load(file: write("b64", Data((bytes.base64EncodedString() + "\n").utf8)))
        #expect(raw.id == text.id)
        #expect(raw.id == (try TokenEncryptionKey(bytes: bytes)).id)
    }

    @Test("wrong length, a directory, a missing file: each refused with what to do")
    func badFiles() throws {
        let short = write("short", Data(count: 31))
        let error = #expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: short) }
        #expect(error?.code == .wrongLength && error?.byteCount == 31)
        #expect(error?.description.contains("head -c 32 /dev/urandom") == true)
        let notBase64 = write("text", Data("not a key at all, just some words\n".utf8))
        #expect((#expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: notBase64) })?.code == .wrongLength)
        #expect((#expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: dir.path) })?.code == .notAFile)
        #expect((#expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: dir.file("absent")) })?.code == .unreadable)
    }

    // From a review: a single read of 1,024 bytes named that as the size of a larger file.
    @Test("a file far too long for a key is refused naming its real size")
    func longFileSize() throws {
        let pem = write("pem", Data(repeating: 0x41, count: 1_700))
        let error = #expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: pem) }
        #expect(error?.code == .wrongLength && error?.byteCount == 1_700)
    }

    // From a review: opened without O_NONBLOCK, a FIFO at the key's path blocked the open (and
    // the agent's start with it) before the check that refuses anything but a regular file.
    @Test("a FIFO at the key's path is refused at once as not a file, not waited on")
    func fifoRefusedAtOnce() throws {
        let path = dir.file("fifo.key")
        #expect(mkfifo(path, 0o600) == 0)
        let done = DispatchSemaphore(value: 0)
        let code = Mutex<TokenKeyFileError.Code?>(nil)
        let thread = Thread {
            do { _ = try TokenEncryptionKey.load(file: path) } catch let error as TokenKeyFileError { code.withLock { $0 = error.code } } catch {}
            done.signal()
        }
        thread.start()
        let answered = done.wait(timeout: .now() + 10) == .success
        if !answered {
            // Let the blocked open finish, so the thread ends.
            let writer = open(path, O_WRONLY | O_NONBLOCK)
            _ = done.wait(timeout: .now() + 10)
            if writer >= 0 { close(writer) }
        }
        #expect(answered, "the load waited on the FIFO")
        #expect(code.withLock { $0 } == .notAFile)
    }

    // From a review: the key file's own owner and mode were checked, not the directories on
    // its way, so another user who may change one could swap in another file of this user's.
    @Test("a key file under a directory group or others may write (not sticky) is refused, naming the directory and chmod go-w; under a sound one it loads")
    func unsafeDirectory() throws {
        let open = dir.file("shared")
        try FileManager.default.createDirectory(atPath: open, withIntermediateDirectories: false)
        #expect(chmod(open, 0o777) == 0)
        let path = open + "/store.key"
        #expect(FileManager.default.createFile(atPath: path, contents: Data(count: 32)))
        #expect(chmod(path, 0o600) == 0)
        let error = #expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: path) }
        #expect(error?.code == .unsafeDirectory, "\(String(describing: error))")
        #expect(error?.description.contains("is under \(open)") == true && error?.description.contains("chmod go-w") == true,
                "\(error?.description ?? "")")
        #expect(chmod(open, 0o755) == 0)
        _ = try TokenEncryptionKey.load(file: path)
    }

    @Test("a key file readable by group or others is refused, naming its mode and chmod 600")
    func modeTooOpen() throws {
        for mode: mode_t in [0o644, 0o640, 0o604, 0o660] {
            let path = write("open-\(String(mode, radix: 8))", Data(count: 32), mode: mode)
            let error = #expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: path) }
            #expect(error?.code == .modeTooOpen && error?.mode == Int(mode))
            #expect(error?.description.contains("chmod 600") == true)
        }
        _ = try TokenEncryptionKey.load(file: write("tight", Data(count: 32), mode: 0o400))
    }

    @Test("a key file owned by another user is refused (run as root: chown to nobody)", .enabled(if: geteuid() == 0))
    func foreignOwner() throws {
        let path = write("foreign", Data(count: 32))
        #expect(chown(path, 65534, 65534) == 0)
        let error = #expect(throws: TokenKeyFileError.self) { try TokenEncryptionKey.load(file: path) }
        #expect(error?.code == .notOwnedByUser && error?.ownerID == 65534)
    }

    @Test("the keyring: key files in order, the first the primary; else systemd's credential; else none")
    func keyringSources() throws {
        let first = write("first", Data(repeating: 1, count: 32))
        let second = write("second", Data(repeating: 2, count: 32))
        let keyring = try #require(try TokenKeyring.load(files: [first, second], environment: [:]))
        #expect(keyring.primary.id == (try TokenEncryptionKey.load(file: first)).id)
        #expect(keyring.ids.count == 2)
        #expect(try TokenKeyring.load(files: [], environment: [:]) == nil)

        // systemd's credential directory: used without flags, and its files are exempt from the
        // owner and mode rules (systemd limits them to the service's user, possibly by an ACL).
        let credentials = dir.file("credentials")
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: true)
        let credential = credentials + "/token-store-key"
        #expect(FileManager.default.createFile(atPath: credential, contents: Data(repeating: 3, count: 32)))
        chmod(credential, 0o440)
        let fromSystemd = try #require(try TokenKeyring.load(files: [], environment: ["CREDENTIALS_DIRECTORY": credentials]))
        #expect(fromSystemd.primary.id == (try TokenEncryptionKey(bytes: Data(repeating: 3, count: 32))).id)
        // Flags win over the credential.
        let flagged = try #require(try TokenKeyring.load(files: [first], environment: ["CREDENTIALS_DIRECTORY": credentials]))
        #expect(flagged.ids == [keyring.primary.id])
        // A credential directory without the credential gives no key.
        #expect(try TokenKeyring.load(files: [], environment: ["CREDENTIALS_DIRECTORY": dir.file("empty")]) == nil)
    }
}
