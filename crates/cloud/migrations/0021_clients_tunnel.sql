-- The tunnel versions a client speaks (its registration's `tunnel`, control version 15), as
-- JSON `[oldest, newest]`; NULL when it registered none.
ALTER TABLE clients ADD COLUMN tunnel TEXT;
