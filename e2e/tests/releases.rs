//! Members a release apart (issue 57; docs/protocol.md §2 and §4, *Versions*): the release
//! before this protocol changes (N-1: `cargo xtask previous` builds it from the
//! commit xtask/src/previous.rs names) and the one under test (N), on either side of a cloud
//! of either release. They register, find each other by name and carry pings both ways
//! through the relay (site B sits behind a symmetric NAT: the cloud pairs them through its
//! relay from the first question), and the member under test shows the tunnel version the
//! pair runs at.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::Duration;

use cyphonic_e2e::bed::{BedOptions, CloudOptions, Nat, Ping, Side, SiteOptions, TwoSites};
use cyphonic_e2e::hosts::Bins;
use cyphonic_e2e::wait_until;

/// Who runs which release: `Some(program)` for the release before's, `None` for ours.
struct Releases {
    cloud: Option<PathBuf>,
    a: Option<PathBuf>,
    b: Option<PathBuf>,
}

fn meet(releases: &Releases) {
    let bed = TwoSites::up(&BedOptions {
        cloud: Some(CloudOptions {
            program: releases.cloud.clone(),
            ..CloudOptions::default()
        }),
        a: SiteOptions {
            nat: Some(Nat::PortPreserving),
            program: releases.a.clone(),
            ..SiteOptions::default()
        },
        b: SiteOptions {
            nat: Some(Nat::Symmetric),
            program: releases.b.clone(),
            ..SiteOptions::default()
        },
        ..BedOptions::default()
    })
    .unwrap();
    // Both registered, and both ports' probes of both seen (so the first question is
    // answered with the relay).
    wait_until(Duration::from_secs(10), "both adapters' probes", || {
        bed.cloud_counter("endpoint_writes").unwrap_or(0) >= 4
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", bed.logs()));
    assert_eq!(
        bed.resolve(&bed.a.lan, bed.a.gateway, "host.gw2.ovl.example"),
        ["100.64.2.10"]
    );
    bed.ping_ok(&bed.a.lan, bed.b.host_ip, Ping::count(3).wait(3));
    bed.ping_ok(&bed.b.lan, bed.a.host_ip, Ping::count(3).wait(3));
    for (side, release) in [(Side::A, &releases.a), (Side::B, &releases.b)] {
        let s = bed.status(side).unwrap();
        let p = &s["peers"][0];
        assert_eq!(p["route"], "relay", "{side:?}: {s}\n{}", bed.logs());
        assert_eq!(p["relay"]["reason"], "symmetric NAT", "{side:?}: {s}");
        assert_eq!(p["established"], true, "{side:?}: {s}");
        if release.is_none() {
            // Ours: the version both speak (the release before's only one), no problem.
            assert_eq!(p["tunnel_version"], cyphonic_wire::VERSION, "{side:?}: {s}");
            assert!(p.get("version_problem").is_none(), "{side:?}: {s}");
        }
    }
}

/// A cloud of ours between the release before (A) and ours (B).
#[test]
fn the_release_before_and_ours_meet_through_our_cloud() {
    let previous = Bins::previous().unwrap();
    meet(&Releases {
        cloud: None,
        a: Some(previous.adapter),
        b: None,
    });
}

/// A cloud of the release before (not upgraded yet) between ours (A) and the release
/// before (B).
#[test]
fn ours_and_the_release_before_meet_through_a_cloud_of_the_release_before() {
    let previous = Bins::previous().unwrap();
    meet(&Releases {
        cloud: Some(previous.cloud),
        a: None,
        b: Some(previous.adapter),
    });
}
