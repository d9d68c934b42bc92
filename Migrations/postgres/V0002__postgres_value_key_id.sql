-- V0002 (PostgreSQL): which key sealed each token value (encryption at rest), readable without
-- the key; the same column as the SQLite store's V0003. A sealed value is
-- 'sealed:v1:<key id, 16 hex digits>:<fingerprint>:<ciphertext>'; 'plaintext' marks a value
-- that is not sealed; NULL, an entry without a token. Derived from the value, so no writer can
-- set it apart from it.
ALTER TABLE tokens ADD COLUMN value_key_id text COLLATE "C" GENERATED ALWAYS AS (
    CASE
      WHEN token IS NULL THEN NULL
      WHEN substr(token, 1, 10) = 'sealed:v1:' THEN substr(token, 11, 16)
      ELSE 'plaintext'
    END) STORED;

-- Opening a store asks which key ids occur (a few index probes, not a scan of every token).
CREATE INDEX tokens_by_value_key ON tokens (value_key_id, kind, subject_id) WHERE token IS NOT NULL;
