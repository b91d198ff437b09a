"""The schema migrations of the ragscope database.

Each entry of :data:`MIGRATIONS` is one SQL script; :mod:`core.storage.db` applies the
missing ones in order when a database is opened. A shipped entry is never edited: a
schema change appends a new one.
"""

from __future__ import annotations

#: Schema migrations, applied in order; entry ``k`` brings the schema to version ``k + 1``.
#: Never edit an entry that has shipped: append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE datasets (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        source TEXT,
        format TEXT,
        created_at TEXT NOT NULL,
        n_examples INTEGER NOT NULL,
        meta TEXT NOT NULL DEFAULT '{}'
    );
    CREATE TABLE examples (
        dataset_id INTEGER NOT NULL REFERENCES datasets(id) ON DELETE CASCADE,
        example_id TEXT NOT NULL,
        position INTEGER NOT NULL,
        json TEXT NOT NULL,
        PRIMARY KEY (dataset_id, example_id)
    );
    CREATE UNIQUE INDEX examples_by_position ON examples(dataset_id, position);
    CREATE TABLE analyses (
        id INTEGER PRIMARY KEY,
        dataset TEXT,
        example_id TEXT,
        example_hash TEXT NOT NULL,
        model TEXT NOT NULL,
        detector TEXT NOT NULL,
        config_hash TEXT NOT NULL,
        created_at TEXT NOT NULL,
        encoding TEXT NOT NULL CHECK (encoding IN ('json', 'bytes')),
        result BLOB NOT NULL,
        UNIQUE (example_hash, model, detector, config_hash)
    );
    CREATE INDEX analyses_by_example ON analyses(dataset, example_id);
    CREATE TABLE annotations (
        id INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        span_start INTEGER NOT NULL CHECK (span_start >= 0),
        span_end INTEGER NOT NULL CHECK (span_end > span_start),
        label TEXT NOT NULL,
        note TEXT,
        annotator TEXT,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL
    );
    CREATE INDEX annotations_by_example ON annotations(dataset, example_id);
    CREATE TABLE explanations (
        id INTEGER PRIMARY KEY,
        model TEXT NOT NULL,
        feature_key TEXT NOT NULL,
        prompt_hash TEXT NOT NULL,
        text TEXT NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (model, feature_key, prompt_hash)
    );
    """,
    """
    CREATE TABLE counterfactuals (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        model TEXT NOT NULL,
        example_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        json TEXT NOT NULL
    );
    CREATE INDEX counterfactuals_by_model ON counterfactuals(model, created_at);
    """,
    # 3: annotation review (core.review): the queue, one review per item and reviewer,
    # and an append-only audit trail.
    """
    CREATE TABLE review_items (
        id INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        span_start INTEGER NOT NULL CHECK (span_start >= 0),
        span_end INTEGER NOT NULL CHECK (span_end > span_start),
        answer_len INTEGER NOT NULL,
        sources TEXT NOT NULL,
        score REAL NOT NULL,
        margin REAL NOT NULL,
        task TEXT,
        generator TEXT,
        position INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        UNIQUE (dataset, example_id, span_start, span_end)
    );
    CREATE INDEX review_items_by_dataset ON review_items(dataset, position);
    CREATE TABLE reviews (
        id INTEGER PRIMARY KEY,
        item_id INTEGER NOT NULL REFERENCES review_items(id),
        reviewer TEXT NOT NULL,
        decision TEXT NOT NULL CHECK (decision IN ('accept', 'reject')),
        span_start INTEGER NOT NULL,
        span_end INTEGER NOT NULL,
        kind TEXT CHECK (kind IS NULL OR kind IN ('baseless', 'conflict')),
        evidence TEXT CHECK (evidence IS NULL OR evidence IN ('evident', 'subtle')),
        note TEXT,
        version INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (item_id, reviewer)
    );
    CREATE TABLE review_audit (
        id INTEGER PRIMARY KEY,
        item_id INTEGER NOT NULL,
        reviewer TEXT NOT NULL,
        at TEXT NOT NULL,
        action TEXT NOT NULL,
        before TEXT,
        after TEXT NOT NULL
    );
    CREATE INDEX review_audit_by_item ON review_audit(item_id, id);
    CREATE TRIGGER review_audit_no_update BEFORE UPDATE ON review_audit
    BEGIN
        SELECT RAISE(ABORT, 'the review audit trail is append-only');
    END;
    CREATE TRIGGER review_audit_no_delete BEFORE DELETE ON review_audit
    BEGIN
        SELECT RAISE(ABORT, 'the review audit trail is append-only');
    END;
    """,
    # 4: each review item remembers the content hash of the answer it was flagged on, so
    # an item whose dataset was re-imported with another answer shows as stale.
    """
    ALTER TABLE review_items ADD COLUMN example_hash TEXT;
    """,
    # 5: background jobs (core.services.jobs): training detectors for a model outside the app's
    # script runs. At most one queued or running job per model key.
    """
    CREATE TABLE jobs (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('train')),
        model TEXT NOT NULL,
        spec TEXT NOT NULL,
        out TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        stage TEXT NOT NULL DEFAULT '',
        done INTEGER NOT NULL DEFAULT 0,
        total INTEGER NOT NULL DEFAULT 0,
        pid INTEGER,
        heartbeat REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        result TEXT,
        created_at TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT
    );
    CREATE UNIQUE INDEX jobs_one_active_per_model ON jobs(model)
        WHERE status IN ('queued', 'running');
    CREATE INDEX jobs_by_model ON jobs(model, id);
    """,
    # 6: a job's owner (the signed-in identity that started it: only they or an admin
    # control it) and a random uid naming its log and staging folder (two databases in
    # one folder, or sharing a trained-detectors folder, never share them); logins
    # revoked by logging out (a session issued before its identity's revocation is
    # refused).
    """
    ALTER TABLE jobs ADD COLUMN owner TEXT;
    ALTER TABLE jobs ADD COLUMN uid TEXT;
    UPDATE jobs SET uid = lower(hex(randomblob(8))) WHERE uid IS NULL;
    CREATE TABLE revoked_logins (
        identity TEXT PRIMARY KEY,
        revoked_at REAL NOT NULL
    );
    """,
    # 7: the pace of feature extraction measured on this machine, per loaded model and
    # detector choice (seconds per character): the pages' time estimates are then free
    # in later processes for a day (core.storage.paces.MAX_AGE), instead of timing an answer on
    # every first visit.
    """
    CREATE TABLE paces (
        model TEXT NOT NULL,
        detectors TEXT NOT NULL,
        seconds_per_char REAL NOT NULL CHECK (seconds_per_char > 0),
        measured_at TEXT NOT NULL,
        PRIMARY KEY (model, detectors)
    );
    """,
    # 8: answer-level review (core.review.answers): one versioned mark per answer and
    # reviewer (faithful / hallucinated, with the ordering the answer was drawn under:
    # calibration counts only answers drawn at random), its append-only audit trail, and
    # the set's verdict on each scanned answer (the answer queue and its orderings).
    """
    CREATE TABLE answer_reviews (
        id INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        reviewer TEXT NOT NULL,
        label TEXT NOT NULL CHECK (label IN ('faithful', 'hallucinated')),
        drawn_by TEXT NOT NULL CHECK (drawn_by IN ('random', 'uncertainty', 'stratified')),
        note TEXT,
        example_hash TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        UNIQUE (dataset, example_id, reviewer)
    );
    CREATE INDEX answer_reviews_by_dataset ON answer_reviews(dataset, example_id);
    CREATE TABLE answer_review_audit (
        id INTEGER PRIMARY KEY,
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        reviewer TEXT NOT NULL,
        at TEXT NOT NULL,
        action TEXT NOT NULL,
        before TEXT,
        after TEXT NOT NULL
    );
    CREATE INDEX answer_review_audit_by_answer ON answer_review_audit(dataset, example_id, id);
    CREATE TRIGGER answer_review_audit_no_update BEFORE UPDATE ON answer_review_audit
    BEGIN
        SELECT RAISE(ABORT, 'the review audit trail is append-only');
    END;
    CREATE TRIGGER answer_review_audit_no_delete BEFORE DELETE ON answer_review_audit
    BEGIN
        SELECT RAISE(ABORT, 'the review audit trail is append-only');
    END;
    CREATE TABLE review_answers (
        dataset TEXT NOT NULL,
        example_id TEXT NOT NULL,
        example_hash TEXT NOT NULL,
        probability REAL NOT NULL CHECK (probability >= 0 AND probability <= 1),
        threshold REAL NOT NULL CHECK (threshold >= 0 AND threshold <= 1),
        judged_by TEXT NOT NULL,
        scanned_at TEXT NOT NULL,
        PRIMARY KEY (dataset, example_id)
    );
    """,
    # 9: adaptation jobs (core.services.adapting): a set adapted to a dataset from its
    # reviews runs as a background job like training. SQLite cannot change a CHECK
    # constraint, so the table is rebuilt with every row and index as it was.
    """
    CREATE TABLE jobs_v9 (
        id INTEGER PRIMARY KEY,
        kind TEXT NOT NULL CHECK (kind IN ('train', 'adapt')),
        model TEXT NOT NULL,
        spec TEXT NOT NULL,
        out TEXT NOT NULL,
        status TEXT NOT NULL
            CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
        cancel_requested INTEGER NOT NULL DEFAULT 0,
        stage TEXT NOT NULL DEFAULT '',
        done INTEGER NOT NULL DEFAULT 0,
        total INTEGER NOT NULL DEFAULT 0,
        pid INTEGER,
        heartbeat REAL,
        attempts INTEGER NOT NULL DEFAULT 0,
        error TEXT,
        result TEXT,
        created_at TEXT NOT NULL,
        started_at TEXT,
        finished_at TEXT,
        owner TEXT,
        uid TEXT
    );
    INSERT INTO jobs_v9 (id, kind, model, spec, out, status, cancel_requested, stage, done,
        total, pid, heartbeat, attempts, error, result, created_at, started_at, finished_at,
        owner, uid)
    SELECT id, kind, model, spec, out, status, cancel_requested, stage, done, total, pid,
        heartbeat, attempts, error, result, created_at, started_at, finished_at, owner, uid
    FROM jobs;
    DROP TABLE jobs;
    ALTER TABLE jobs_v9 RENAME TO jobs;
    CREATE UNIQUE INDEX jobs_one_active_per_model ON jobs(model)
        WHERE status IN ('queued', 'running');
    CREATE INDEX jobs_by_model ON jobs(model, id);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
