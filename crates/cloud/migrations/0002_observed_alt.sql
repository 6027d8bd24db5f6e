-- The address a client's probes to the second probe port came from: compared with `observed`,
-- it tells a symmetric NAT (a new mapping per destination) from the others.
ALTER TABLE clients ADD COLUMN observed_alt TEXT;
