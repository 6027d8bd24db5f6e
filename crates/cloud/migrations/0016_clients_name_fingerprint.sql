-- The members' list is paged by (name, fingerprint) (the API's GET /members): this index
-- gives each page in order from where the last ended, without reading or sorting the rows
-- before it.
CREATE INDEX clients_name_fingerprint ON clients (name, fingerprint);
