-- The software and version a client said it runs (its Hello's agent, cleaned), for the fleet
-- view: set at each connection, NULL for a certificate that never connected.
ALTER TABLE clients ADD COLUMN agent TEXT;
