-- Certificates revoked online (`cyphonic-cloud revoke`): every instance reads this table every
-- 2 s, cuts the sessions of the certificates it names and pushes them to its clients.
CREATE TABLE revocations (
    fingerprint TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    revoked_at BIGINT NOT NULL
);
