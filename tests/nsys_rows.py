"""Rows added to copies of real nsys exports in their own schema (tests/data/nsys)."""
RUNTIME, KERNEL, MEMCPY = "CUPTI_ACTIVITY_KIND_RUNTIME", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"


def clone_row(db, table, **changes):
    """Insert a copy of one real row of `table` with some columns changed (keeps every NOT NULL column filled)."""
    cursor = db.execute(f"SELECT * FROM {table} LIMIT 1")
    row = dict(zip([c[0] for c in cursor.description], cursor.fetchone()))
    row.update(changes)
    db.execute(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})", list(row.values()))


def add_string(db, value):
    next_id = db.execute("SELECT MAX(id) + 1 FROM StringIds").fetchone()[0]
    db.execute("INSERT INTO StringIds (id, value) VALUES (?, ?)", (next_id, value))
    return next_id


def add_range(db, text, start, end, tid):
    db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) VALUES (?, ?, ?, ?, ?, 0)",
               (start, end, 34 if end is None else 59, text, tid))
