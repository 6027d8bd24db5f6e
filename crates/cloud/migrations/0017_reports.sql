-- What members say of themselves in their `report` messages (docs/protocol.md §8, Devices
-- and tunnels), for the fleet view only: nothing is decided by it. A member's rows are
-- replaced whole by each report. `reported_at` is when its last report came (unix seconds).
-- Counters are capped at 2^63 - 1; times are unix seconds; `established` is 0 or 1. A device
-- is named by its address (its vIP, else its IPv6 address); `address_key` orders them as
-- numbers: `4` and 8 hex digits for IPv4, `6` and 32 for IPv6.
ALTER TABLE clients ADD COLUMN reported_at BIGINT;

CREATE TABLE devices (
    member TEXT NOT NULL REFERENCES clients (fingerprint) ON DELETE CASCADE,
    address_key TEXT NOT NULL,
    address TEXT NOT NULL,
    mac TEXT NOT NULL,
    vip TEXT,
    vip6 TEXT,
    legacy TEXT,
    name TEXT,
    hostname TEXT,
    kind TEXT NOT NULL,
    expires BIGINT,
    vlan BIGINT,
    seen BIGINT,
    tx_bytes BIGINT NOT NULL,
    tx_packets BIGINT NOT NULL,
    rx_bytes BIGINT NOT NULL,
    rx_packets BIGINT NOT NULL,
    PRIMARY KEY (member, address_key)
);

CREATE TABLE tunnels (
    member TEXT NOT NULL REFERENCES clients (fingerprint) ON DELETE CASCADE,
    peer TEXT NOT NULL,
    peer_name TEXT NOT NULL,
    path TEXT NOT NULL,
    reason TEXT,
    endpoint TEXT,
    established BIGINT NOT NULL,
    handshake BIGINT,
    tx_bytes BIGINT NOT NULL,
    rx_bytes BIGINT NOT NULL,
    PRIMARY KEY (member, peer)
);
