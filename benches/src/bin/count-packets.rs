//! Seals or opens packets as the engine's workers do, for counting their instructions under
//! an emulator (`cargo xtask bench --arm64`): `count-packets <seal|open> <ring|rustcrypto>
//! <packets>`. The fixtures are benches/benches/instructions.rs' (1,420-byte packets, a
//! keyed session, [`Sealing::seal_bare`] and [`Opening::open_bare`]); what the program
//! does besides (the handshake, the frames to open) is the same for any `packets`, so the
//! difference between two runs is the packets' alone.

use std::hint::black_box;
use std::process::ExitCode;

use cyphonic_benches::BURST;
use cyphonic_benches::engine::{Opening, PACKET, Sealing};
use cyphonic_crypto::Backend;

const USAGE: &str = "usage: count-packets <seal|open> <ring|rustcrypto> <packets, 1 to 4096>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("count-packets: {e}\n{USAGE}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    let [op, backend, packets] = args else {
        return Err(format!("3 arguments expected, {} given", args.len()));
    };
    let backend = Backend::ALL
        .into_iter()
        .find(|b| b.name() == backend)
        .ok_or_else(|| format!("unknown backend {backend:?}"))?;
    let packets: usize = packets
        .parse()
        .ok()
        .filter(|n| (1..=BURST).contains(n))
        .ok_or_else(|| format!("packets {packets:?}: not a number from 1 to {BURST}"))?;
    match op.as_str() {
        "seal" => {
            let sealing = Sealing::new(backend, PACKET);
            let mut bufs = sealing.bare_burst();
            sealing.seal_bare(&mut bufs[..packets]);
            black_box(&bufs);
        }
        "open" => {
            let opening = Opening::new(backend, PACKET);
            let mut frames = opening.bare_burst();
            let failed = opening.open_bare(&mut frames[..packets]);
            if failed != 0 {
                return Err(format!("{failed} of the fixture's frames did not open"));
            }
            black_box(&frames);
        }
        other => return Err(format!("unknown operation {other:?}")),
    }
    Ok(())
}
