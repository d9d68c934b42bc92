-- V0001 (PostgreSQL): the whole schema of the SQLite store's V0001 and V0002, in the schema the
-- repository was configured with (the migrator sets search_path to it; names here are
-- unqualified). Times are Unix seconds (double precision), as in SQLite, so a value read back
-- is the value written; show them with to_timestamp(expires_at). Keys compare byte by byte
-- (COLLATE "C"), as in SQLite, so listing pages keep one order whatever the server's locale.

-- One row per token key (kind + subject id): a token, a refresh-failure state, or both.
CREATE TABLE tokens (
    kind               text COLLATE "C" NOT NULL
                       CHECK (kind IN ('vehicle', 'trip', 'deliveryVehicle', 'task')),
    subject_id         text COLLATE "C" NOT NULL CHECK (length(subject_id) BETWEEN 1 AND 512),
    token              text,
    expires_at         double precision,
    issued_at          double precision,
    fetched_at         double precision,
    last_used_at       double precision,
    failure_count      integer          NOT NULL DEFAULT 0 CHECK (failure_count >= 0),
    next_attempt_at    double precision,
    last_error_kind    text,
    last_error_message text,
    last_failure_at    double precision,
    PRIMARY KEY (kind, subject_id),
    CHECK ((token IS NULL) = (expires_at IS NULL)),
    CHECK (token IS NULL OR fetched_at IS NOT NULL)
);

CREATE INDEX tokens_by_expiry ON tokens (expires_at) WHERE expires_at IS NOT NULL;

-- Single flight across processes and hosts: the holder named here is fetching that key. The
-- holder names its host (boot id) and process, so a holder on the same host is judged dead as
-- soon as its process is gone; one on another host only when its lease expires.
CREATE TABLE refresh_leases (
    kind        text COLLATE "C" NOT NULL,
    subject_id  text COLLATE "C" NOT NULL,
    holder      text             NOT NULL,
    acquired_at double precision NOT NULL,
    expires_at  double precision NOT NULL,
    PRIMARY KEY (kind, subject_id)
);

-- The change feed: every change of a token itself (not last-use or failure bookkeeping) is
-- announced on the channel '<schema>.token_changes', delivered at commit to every listening
-- replica. The payload is 'upsert' or 'delete', the writer's application_name (so a replica
-- skips its own changes), the kind and the subject id, separated by tabs. Whoever writes
-- (a replica, tokenctl, psql) announces alike.
CREATE FUNCTION announce_token_change() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    changed record;
    operation text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.token IS NULL THEN RETURN NULL; END IF;
        changed := OLD;
        operation := 'delete';
    ELSIF TG_OP = 'UPDATE' THEN
        IF NEW.token IS NOT DISTINCT FROM OLD.token AND NEW.expires_at IS NOT DISTINCT FROM OLD.expires_at THEN
            RETURN NULL;
        END IF;
        changed := NEW;
        operation := CASE WHEN NEW.token IS NULL THEN 'delete' ELSE 'upsert' END;
    ELSE
        IF NEW.token IS NULL THEN RETURN NULL; END IF;
        changed := NEW;
        operation := 'upsert';
    END IF;
    PERFORM pg_notify(TG_TABLE_SCHEMA || '.token_changes',
                      operation || E'\t' || coalesce(current_setting('application_name', true), '')
                      || E'\t' || changed.kind || E'\t' || changed.subject_id);
    RETURN NULL;
END;
$$;

CREATE TRIGGER tokens_announce AFTER INSERT OR UPDATE OR DELETE ON tokens
    FOR EACH ROW EXECUTE FUNCTION announce_token_change();
