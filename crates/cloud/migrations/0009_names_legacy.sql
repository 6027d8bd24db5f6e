-- A fixed-address device's own address on its site's legacy subnet (control version 7), for
-- the fleet view: NULL for every other name.
ALTER TABLE names ADD COLUMN legacy TEXT;
