-- V0001: one row per token key (kind + subject id).
-- A row may hold a token, a refresh-failure state, or both: a subject whose first fetch failed
-- has failure state and no token yet. Times are Unix seconds (REAL) so `sqlite3` can show them
-- with datetime(x, 'unixepoch').
CREATE TABLE tokens (
    kind               TEXT    NOT NULL
                       CHECK (kind IN ('vehicle', 'trip', 'deliveryVehicle', 'task')),
    subject_id         TEXT    NOT NULL CHECK (length(subject_id) BETWEEN 1 AND 512),
    token              TEXT,
    expires_at         REAL,
    issued_at          REAL,
    fetched_at         REAL,
    last_used_at       REAL,
    failure_count      INTEGER NOT NULL DEFAULT 0 CHECK (failure_count >= 0),
    next_attempt_at    REAL,
    last_error_kind    TEXT,
    last_error_message TEXT,
    last_failure_at    REAL,
    PRIMARY KEY (kind, subject_id),
    -- a token always comes with its expiry and fetch time
    CHECK ((token IS NULL) = (expires_at IS NULL)),
    CHECK (token IS NULL OR fetched_at IS NOT NULL)
) WITHOUT ROWID;
