-- Enrollment tokens (docs/protocol.md §4, Enrollment): single use, expiring, revocable; the
-- secret is kept only as its SHA-256. `blocks` and `member_groups` are JSON lists; times are unix
-- seconds; `used_by` is the fingerprint of the certificate the token was redeemed for.
CREATE TABLE tokens (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    name TEXT NOT NULL,
    blocks TEXT NOT NULL,
    member_groups TEXT NOT NULL,
    lifetime BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    used_at BIGINT,
    used_by TEXT,
    revoked_at BIGINT
);
