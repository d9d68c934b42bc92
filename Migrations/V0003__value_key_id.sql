-- V0003: which key sealed each token value (encryption at rest), readable without the key.
-- A sealed value is 'sealed:v1:<key id, 16 hex digits>:<fingerprint>:<ciphertext>'; the column
-- is derived from it, so no writer can set it apart from the value, and a stock sqlite3 shell
-- answers "which keys does this store need" with SELECT value_key_id, count(*) ... GROUP BY 1.
-- 'plaintext' marks a value that is not sealed; NULL, an entry without a token.
ALTER TABLE tokens ADD COLUMN value_key_id TEXT GENERATED ALWAYS AS (
    CASE
      WHEN token IS NULL THEN NULL
      WHEN substr(token, 1, 10) = 'sealed:v1:' THEN substr(token, 11, 16)
      ELSE 'plaintext'
    END) VIRTUAL;

-- Opening a store asks which key ids occur (a few index probes, not a scan of every token).
CREATE INDEX tokens_by_value_key ON tokens (value_key_id, kind, subject_id) WHERE token IS NOT NULL;
