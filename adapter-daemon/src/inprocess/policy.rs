//! The per-device policy at both ends.

use super::*;

/// The per-device policy holds at both ends: gw1 lets every flow between the two blocks
/// start, gw2 only UDP to port 5000 into its own block. A flow gw2 allows crosses and its
/// answers come back; a flow gw1 lets out is stopped on arrival at gw2; a flow gw2's device
/// starts is stopped before it leaves. Each stop is counted where it happened.
#[test]
fn the_policy_holds_at_both_ends() {
    let open = r#"
[policy]
[[policy.rule]]
from = ["100.64.1.0/24", "100.64.2.0/24"]
to = ["100.64.1.0/24", "100.64.2.0/24"]
allow = ["any"]
"#;
    let strict = r#"
[policy]
[[policy.rule]]
from = ["100.64.1.0/24"]
to = ["100.64.2.0/24"]
allow = ["udp/5000"]
"#;
    let link = Link::new(5);
    let (_f, one, mut two) = sites_with(&link, "sparse_socket = false", [open, strict]);
    let (ip1, gw1_mac) = one.device.lease("sensor-one");
    let (ip2, gw2_mac) = two.device.lease("sensor-two");
    let send = |from: &Site, gw, src: Ipv4Addr, dst: Ipv4Addr, (sport, dport)| {
        let udp = ipv4_udp(src.octets(), dst.octets(), sport, dport, b"policy");
        from.device.send(&eth(gw, from.device.mac, &udp));
    };

    // Refused on arrival at gw2, then an allowed flow behind it: only the allowed one comes.
    send(&one, gw1_mac, ip1, ip2, (4000, 6000));
    send(&one, gw1_mac, ip1, ip2, (4000, 5000));
    let (_, before) = two
        .device
        .expect_after("the allowed flow", |f| is_udp(f, ip1, ip2, 5000));
    assert!(
        !before.iter().any(|f| is_udp(f, ip1, ip2, 6000)),
        "gw2 let in a flow its policy refuses"
    );
    // Its answer comes back (the flow is open both ways at both ends)...
    send(&two, gw2_mac, ip2, ip1, (5000, 4000));
    one.device
        .expect("the answer", |f| is_udp(f, ip2, ip1, 4000));
    // ... but a flow gw2's device starts does not leave gw2.
    send(&two, gw2_mac, ip2, ip1, (4100, 7000));
    send(&one, gw1_mac, ip1, ip2, (4001, 5000));
    two.device
        .expect("the second allowed flow", |f| is_udp(f, ip1, ip2, 5000));
    send(&two, gw2_mac, ip2, ip1, (5000, 4001));
    let (_, before) = one
        .device
        .expect_after("its answer", |f| is_udp(f, ip2, ip1, 4001));
    assert!(
        !before.iter().any(|f| is_udp(f, ip2, ip1, 7000)),
        "gw2 let out a flow its policy refuses"
    );

    // gw2 refused two flows, one of them on arrival; gw1 none.
    let refused = |d: &serde_json::Value, way: &str| d["policy"][way]["no_rule"].as_u64();
    let doc = two
        .end
        .wait_status(PATIENCE, |d| refused(d, "dropped") == Some(2))
        .expect("gw2 counts two flows refused");
    assert_eq!(refused(&doc, "dropped_in"), Some(1), "{}", doc["policy"]);
    assert_eq!(doc["counters"]["drop_policy"].as_u64(), Some(2));
    let doc = one.end.status().expect("gw1 answers");
    assert_eq!(refused(&doc, "dropped"), Some(0), "{}", doc["policy"]);
    assert_eq!(
        doc["policy"]["opened"].as_u64(),
        Some(3),
        "{}",
        doc["policy"]
    );
}
