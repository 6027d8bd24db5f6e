-- Each registered certificate's address blocks, so that "does anyone else hold these
-- addresses?" (issue 49, finding 6) is an indexed lookup, not a parse of every certificate.
-- `first` and `last` are a block's first and last address as '4:' and 8 hex digits or '6:'
-- and 32 (fixed width: text order is address order, and the families never mix). Rows of
-- certificates registered before this table are filled in when the cloud opens the store.
CREATE TABLE blocks (
    fingerprint TEXT NOT NULL REFERENCES clients (fingerprint) ON DELETE CASCADE,
    first TEXT NOT NULL,
    last TEXT NOT NULL,
    PRIMARY KEY (fingerprint, first, last)
);

CREATE INDEX blocks_first ON blocks (first);
