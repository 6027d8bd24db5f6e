-- The registry of clients and the names they host. Portable SQL: the same file runs on SQLite
-- and PostgreSQL.
CREATE TABLE clients (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    certificate TEXT NOT NULL,
    endpoints TEXT NOT NULL,
    observed TEXT,
    online BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE names (
    name TEXT PRIMARY KEY,
    vip TEXT NOT NULL,
    owner TEXT NOT NULL REFERENCES clients (fingerprint) ON DELETE CASCADE
);

CREATE INDEX names_owner ON names (owner);
