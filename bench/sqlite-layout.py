#!/usr/bin/env python3
"""The sqlite store's table layout, probed outside the gate: WAL frames and
time per claim and mark, for the schema the store uses (a rowid table and
its primary key's index) against the same table `WITHOUT ROWID`.

Each batch is one write transaction, as the store's thread commits them
(src/store/sqlite/store_thread.rs): `BATCH` claims of new keys (a lookup,
then the insert) and the marks of the previous batch's claims, each job in
a savepoint of its own. The table starts with `WARM` completed rows. A WAL
frame is one page written; the time is Python's as much as SQLite's, so
compare the layouts with each other, not with the gate.

    python3 bench/sqlite-layout.py [WARM] [BATCH] [BATCHES]
"""
import os
import random
import sqlite3
import sys
import tempfile
import time

COLUMNS = """
    provider              TEXT    NOT NULL,
    provider_event_id     TEXT    NOT NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    lease_token           TEXT,
    fingerprint           TEXT    NOT NULL,
    response_status       INTEGER,
    response_content_type TEXT,
    response_body         BLOB,
    response_truncated    INTEGER NOT NULL DEFAULT 0,
    lease_expires_at      INTEGER,
    expires_at            INTEGER NOT NULL,
    received_at           INTEGER NOT NULL,
    PRIMARY KEY (provider, provider_event_id)"""
LAYOUTS = {
    "rowid table + primary key index (the store's)": f"CREATE TABLE processed_events ({COLUMNS})",
    "WITHOUT ROWID": f"CREATE TABLE processed_events ({COLUMNS}) WITHOUT ROWID",
}
SELECT = """SELECT state, fingerprint FROM processed_events
    WHERE provider = 'stripe' AND provider_event_id = ? AND expires_at > ?"""
INSERT = """INSERT OR REPLACE INTO processed_events (provider, provider_event_id, state,
    lease_token, fingerprint, lease_expires_at, expires_at, received_at)
    VALUES ('stripe', ?, 'in_flight', ?, ?, ?, ?, ?)"""
MARK = """UPDATE processed_events
    SET state = 'completed', lease_token = NULL, lease_expires_at = NULL,
        response_status = 200, response_content_type = 'text/plain', response_body = x'6f6b',
        expires_at = ?, response_truncated = 0
    WHERE provider = 'stripe' AND provider_event_id = ? AND lease_token = ?
      AND state = 'in_flight' AND expires_at > ?"""
FRAME_HEADER = 24  # before each page a WAL frame holds
NOW = 1_780_000_000_000


def event(rng):
    return (f"evt_{rng.getrandbits(96):024x}", f"{rng.getrandbits(256):064x}",
            f"{rng.getrandbits(128):032x}")


def claim(db, key, fingerprint, token):
    db.execute("SAVEPOINT job")
    if db.execute(SELECT, (key, NOW)).fetchone() is None:
        db.execute(INSERT, (key, token, fingerprint, NOW + 5000, NOW + 5000, NOW))
    db.execute("RELEASE job")


def mark(db, key, token):
    db.execute("SAVEPOINT job")
    changed = db.execute(MARK, (NOW + 345_600_000, key, token, NOW)).rowcount
    db.execute("RELEASE job")
    assert changed == 1


def probe(n, name, schema, warm, batch, batches, directory):
    path = os.path.join(directory, f"layout{n}.sqlite")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.execute("PRAGMA wal_autocheckpoint = 0")
    db.execute("PRAGMA cache_size = -512")
    db.execute(schema)
    frame = db.execute("PRAGMA page_size").fetchone()[0] + FRAME_HEADER
    rng = random.Random(7)
    db.execute("BEGIN")
    for _ in range(warm):
        key, fingerprint, token = event(rng)
        claim(db, key, fingerprint, token)
        mark(db, key, token)
    db.execute("COMMIT")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    frames, spent, previous = 0, 0.0, []
    for n in range(batches):
        current = [event(rng) for _ in range(batch)]
        before = os.path.getsize(path + "-wal")
        started = time.perf_counter()
        db.execute("BEGIN IMMEDIATE")
        for key, fingerprint, token in current:
            claim(db, key, fingerprint, token)
        for key, token in previous:
            mark(db, key, token)
        db.execute("COMMIT")
        spent += time.perf_counter() - started
        frames += (os.path.getsize(path + "-wal") - max(before, 32)) // frame
        previous = [(key, token) for key, _, token in current]
        if n % 500 == 499:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    events = batch * batches
    print(f"{name}: {frames / events:.2f} WAL frames and "
          f"{spent * 1e6 / events:.1f} µs per claim and mark")


def main():
    given = [int(a) for a in sys.argv[1:]]
    warm, batch, batches = given + [200000, 8, 4000][len(given):]
    print(f"{warm} rows, {batch} claims and {batch} marks a transaction, {batches} transactions")
    with tempfile.TemporaryDirectory() as directory:
        for n, (name, schema) in enumerate(LAYOUTS.items()):
            probe(n, name, schema, warm, batch, batches, directory)


if __name__ == "__main__":
    main()
