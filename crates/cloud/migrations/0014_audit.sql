-- The audit log (docs/protocol.md §8, The audit log): every change to the registry, who made
-- it, from where and with what result. Rows are only ever added (and swept after
-- `[api] audit_days`). `at` is unix milliseconds; `id` (16 hex digits, random) orders rows of
-- the same millisecond and is the list's cursor with it; `details` is a JSON object.
CREATE TABLE audit (
    id TEXT PRIMARY KEY,
    at BIGINT NOT NULL,
    actor TEXT NOT NULL,
    source TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    result TEXT NOT NULL,
    details TEXT NOT NULL
);
CREATE INDEX audit_at ON audit (at, id);

-- API tokens (docs/protocol.md §8, Who may do what): the secret is kept only as its SHA-256.
-- `scope` is read, write or admin; times are unix seconds.
CREATE TABLE api_tokens (
    id TEXT PRIMARY KEY,
    secret_sha256 TEXT NOT NULL,
    name TEXT NOT NULL,
    scope TEXT NOT NULL,
    created_by TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    expires_at BIGINT,
    revoked_at BIGINT
);
