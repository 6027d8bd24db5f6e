-- What a client's router said of a mapping of its tunnel port (its registration's `mapping`,
-- control version 14), as JSON; NULL when it registered none.
ALTER TABLE clients ADD COLUMN mapping TEXT;
