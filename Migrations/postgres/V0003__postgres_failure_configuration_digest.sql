-- V0003 (PostgreSQL): which provider configuration a recorded failure came from; the same
-- column as the SQLite store's V0004. A SHA-256 digest (URL, method, body, fields, headers and
-- their files' contents, certificates, proxy), never the configuration in clear. A failure of
-- another configuration holds no backoff, so a fixed configuration is tried at once. NULL: not
-- known (a failure an older build recorded, or a fetcher that gives no digest), whose backoff
-- holds.
ALTER TABLE tokens ADD COLUMN failure_config_digest text;
