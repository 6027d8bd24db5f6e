-- A name's IPv6 address (control version 8, docs/protocol.md §7): its AAAA beside the vip's
-- A. NULL for a name without one, and for every name registered before.
ALTER TABLE names ADD COLUMN vip6 TEXT;
