-- A redeemed token is final only once its certificate connected (issue 49, finding 5): a
-- device that refused what it was given (a clock behind) redeems it again with the same key.
-- `used_key` is the hex of the Noise static key it was redeemed with; `confirmed_at` is when
-- the certificate it names first opened a session (NULL: not yet). Rows redeemed before this
-- column count as confirmed.
ALTER TABLE tokens ADD COLUMN used_key TEXT;
ALTER TABLE tokens ADD COLUMN confirmed_at BIGINT;
UPDATE tokens SET confirmed_at = used_at WHERE used_at IS NOT NULL;
