-- The HA pair a member's serving box last reported (docs/protocol.md §5, Seen from the cloud),
-- as JSON, for the fleet view: NULL until it reports one, cleared at each new session.
ALTER TABLE clients ADD COLUMN pair TEXT;
