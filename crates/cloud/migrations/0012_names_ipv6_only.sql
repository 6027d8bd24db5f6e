-- A device with IPv6 only has a name without a vip (control version 9, docs/protocol.md §7):
-- `vip` may be NULL (a name has at least one of `vip` and `vip6`). SQLite cannot drop a NOT
-- NULL, so the table is made again, the same on both stores.
CREATE TABLE names_next (
    name TEXT PRIMARY KEY,
    vip TEXT,
    owner TEXT NOT NULL REFERENCES clients (fingerprint) ON DELETE CASCADE,
    legacy TEXT,
    vip6 TEXT
);
INSERT INTO names_next (name, vip, owner, legacy, vip6)
    SELECT name, vip, owner, legacy, vip6 FROM names;
DROP TABLE names;
ALTER TABLE names_next RENAME TO names;
CREATE INDEX names_owner ON names (owner);
