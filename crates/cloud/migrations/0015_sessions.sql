-- People signed in to the console (docs/protocol.md §8, Who may do what). A session is named
-- by 32 random bytes in the person's cookie; the store keeps only their SHA-256. `subject` is
-- the provider's `sub`, `role` viewer, operator or admin as mapped at sign-in, `csrf` the
-- token every write from the session must carry. Times are unix seconds: `seen_at` moves at
-- most once a minute; a session ends at `ends_at` or `[api.oidc] idle` after `seen_at`.
CREATE TABLE sessions (
    id_sha256 TEXT PRIMARY KEY,
    subject TEXT NOT NULL,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    csrf TEXT NOT NULL,
    source TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    seen_at BIGINT NOT NULL,
    ends_at BIGINT NOT NULL
);
CREATE INDEX sessions_subject ON sessions (subject, created_at);
