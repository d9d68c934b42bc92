-- V0004: which provider configuration a recorded failure came from: a SHA-256 digest of it
-- (URL, method, body, fields, headers and their files' contents, certificates, proxy), never
-- the configuration in clear. A failure of another configuration holds no backoff, so a fixed
-- configuration is tried at once; the same one keeps backing off. NULL: not known (a failure
-- an older build recorded, or a fetcher that gives no digest), whose backoff holds.
ALTER TABLE tokens ADD COLUMN failure_config_digest TEXT;
