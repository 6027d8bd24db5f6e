-- Clients are looked up by certificate name at every registration (a device's name may not
-- be another member's), every session (the newest certificate of a name wins) and every
-- revocation by name: an index, or each of those reads the whole table.
CREATE INDEX clients_name ON clients (name);
