-- Flow logs (docs/protocol.md §8, Flow logs): each ended flow a member reported, and each
-- summary of the new flows it refused from one source over a minute (`kind` 'refused':
-- `src`, `dir`, `started` and `ended` the first and the last, `tx_packets` how many,
-- `ports` how many destination ports). `member` is the member's name, `fingerprint` its
-- certificate's. Times are unix seconds; counters are capped at 2^63 - 1. `id` is random:
-- with `ended` it orders and pages the records. Kept `[flows] keep_days`.
CREATE TABLE flows (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    member TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    proto BIGINT,
    src TEXT NOT NULL,
    sport BIGINT,
    dst TEXT,
    dport BIGINT,
    dir TEXT NOT NULL,
    started BIGINT NOT NULL,
    ended BIGINT NOT NULL,
    tx_bytes BIGINT NOT NULL,
    tx_packets BIGINT NOT NULL,
    rx_bytes BIGINT NOT NULL,
    rx_packets BIGINT NOT NULL,
    rule BIGINT,
    ports BIGINT
);
CREATE INDEX flows_ended ON flows (ended, id);
CREATE INDEX flows_member ON flows (member, ended, id);
