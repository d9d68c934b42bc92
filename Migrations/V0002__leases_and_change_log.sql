-- V0002: what the sync engine needs beyond V0001.

-- Purges of expired entries and expiry statistics use this instead of a table scan.
CREATE INDEX tokens_by_expiry ON tokens (expires_at) WHERE expires_at IS NOT NULL;

-- Cross-process single flight: the process holding a row here is fetching that key. A lease
-- expires so that a crashed holder blocks nobody for long.
CREATE TABLE refresh_leases (
    kind        TEXT NOT NULL,
    subject_id  TEXT NOT NULL,
    holder      TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at  REAL NOT NULL,
    PRIMARY KEY (kind, subject_id)
) WITHOUT ROWID;

-- Change log: every writer, our library or a stock `sqlite3` shell, leaves a row per changed key,
-- so a long-lived process learns *which* keys another process changed (PRAGMA data_version only
-- says that something did). Pruned by age.
CREATE TABLE token_changes (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    kind       TEXT NOT NULL,
    subject_id TEXT NOT NULL,
    operation  TEXT NOT NULL CHECK (operation IN ('upsert', 'delete')),
    changed_at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

CREATE TRIGGER tokens_after_insert AFTER INSERT ON tokens
WHEN NEW.token IS NOT NULL
BEGIN
    INSERT INTO token_changes (kind, subject_id, operation)
    VALUES (NEW.kind, NEW.subject_id, 'upsert');
END;

-- Only a change of the token itself is news; last-use and failure bookkeeping are not.
CREATE TRIGGER tokens_after_token_update AFTER UPDATE OF token, expires_at ON tokens
WHEN NEW.token IS NOT OLD.token OR NEW.expires_at IS NOT OLD.expires_at
BEGIN
    INSERT INTO token_changes (kind, subject_id, operation)
    VALUES (NEW.kind, NEW.subject_id, CASE WHEN NEW.token IS NULL THEN 'delete' ELSE 'upsert' END);
END;

CREATE TRIGGER tokens_after_delete AFTER DELETE ON tokens
WHEN OLD.token IS NOT NULL
BEGIN
    INSERT INTO token_changes (kind, subject_id, operation)
    VALUES (OLD.kind, OLD.subject_id, 'delete');
END;
