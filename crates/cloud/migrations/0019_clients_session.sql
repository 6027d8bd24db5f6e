-- The control session a client's row was last marked online by (random, hex): a session that
-- ends marks the client offline only while it is still the one recorded, so that the end of
-- an older session, written late, cannot mark a newer one offline.
ALTER TABLE clients ADD COLUMN session TEXT;
