//! The builds `cargo xtask test` runs beside its tiers, as two chains at once: the Pi's
//! build and its unit tier under the emulator ([`cross::commands`]), at nice 19; the
//! documentation with rustdoc's lints denied (every intra-doc link resolves, no broken
//! HTML), then the fuzz targets' check, under `SCHED_IDLE` (CPU nothing else wants). The
//! Pi's chain comes first because the run's last steps (the emulated demo, the arm64
//! packages) need it; the other fills what is left idle, to the end. Each chain's output
//! goes to its own log in target/ (said in full if one fails). Each build runs in a
//! process group of its own, which is ended if the run stops before they are waited for:
//! no build is left behind a failed run.

use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::{cross, util};

/// The target directory of the documentation and the fuzz targets' check.
const CHECK_DIR: &str = "target/check";

/// A build: cargo's arguments and environment.
type Job = (Vec<String>, cross::Env);

/// One chain of builds, running in turn on a thread.
#[derive(Debug)]
struct Chain {
    thread: Option<JoinHandle<anyhow::Result<()>>>,
    /// The process group of the build running now, if any (its leader's PID).
    running: Arc<Mutex<Option<u32>>>,
}

/// The background builds, running.
#[derive(Debug)]
pub(crate) struct Builds {
    /// The Pi's build and tests; then the documentation and the fuzz check.
    chains: [Chain; 2],
    /// Set when the run gave up on them: no further build starts.
    stopped: Arc<Mutex<bool>>,
}

impl Builds {
    /// Starts the two chains, each in a target directory of its own (cargo locks a target
    /// directory for the whole of a build: in `target` they would hold the native builds
    /// up).
    ///
    /// # Errors
    /// The Pi's toolchain is missing (said with the remedy), or a log cannot be created.
    pub(crate) fn start(root: &Path) -> anyhow::Result<Self> {
        let pi = cross::commands()?;
        // The documentation and the fuzz targets' check share a target directory (one
        // tree of dependencies in check mode on the disk, not two). The fuzz workspace
        // resolves other features for most of them: its check took 104 s after the
        // documentation's on a fresh machine, as long as in a directory of its own.
        let doc: Vec<String> = [
            "doc",
            "--workspace",
            "--no-deps",
            "--locked",
            "--target-dir",
            CHECK_DIR,
        ]
        .map(str::to_owned)
        .to_vec();
        let denied = vec![("RUSTDOCFLAGS".to_owned(), "-D warnings".to_owned())];
        let fuzz: Vec<String> = [
            "check",
            "--manifest-path",
            "fuzz/Cargo.toml",
            "--bins",
            // Not libFuzzer's C++ (the fuzzing runs' build links it): the targets' code.
            "--no-default-features",
            "--target-dir",
            CHECK_DIR,
        ]
        .map(str::to_owned)
        .to_vec();
        std::fs::create_dir_all(root.join("target"))?;
        let stopped = Arc::new(Mutex::new(false));
        let chains = [
            Chain::start(
                root,
                &root.join("target/background-pi.log"),
                pi,
                Priority::Low,
                &stopped,
            )?,
            Chain::start(
                root,
                &root.join("target/background-check.log"),
                vec![(doc, denied), (fuzz, Vec::new())],
                Priority::Idle,
                &stopped,
            )?,
        ];
        Ok(Self { chains, stopped })
    }

    /// Waits for the Pi's chain (the other may still run).
    ///
    /// # Errors
    /// One of its builds failed (its log in the error), or its thread panicked.
    pub(crate) fn wait_for_the_pi(&mut self) -> anyhow::Result<()> {
        self.chains[0].wait()
    }

    /// Waits for both chains.
    ///
    /// # Errors
    /// One failed (its log in the error), or a thread panicked.
    pub(crate) fn wait(mut self) -> anyhow::Result<()> {
        for chain in &mut self.chains {
            // On an error, Drop ends the other chain's builds: they are of no use now.
            chain.wait()?;
        }
        eprintln!("xtask: the background builds are done");
        Ok(())
    }
}

/// How a chain's builds share the CPU with the rest of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    /// nice 19: little CPU beside the foreground, most of what it leaves beside
    /// [`Priority::Idle`].
    Low,
    /// `SCHED_IDLE` (and nice 19): only what no other process wants.
    Idle,
}

impl Chain {
    /// Starts `jobs` in turn on a thread at `priority`, their output into `log_path`.
    fn start(
        root: &Path,
        log_path: &Path,
        jobs: Vec<Job>,
        priority: Priority,
        stopped: &Arc<Mutex<bool>>,
    ) -> anyhow::Result<Self> {
        let log = std::fs::File::create(log_path)?;
        let said: Vec<String> = jobs
            .iter()
            .map(|(args, _)| format!("cargo {}", args.join(" ")))
            .collect();
        eprintln!(
            "xtask: in the background ({}; output in {}), in turn: {}",
            match priority {
                Priority::Low => "nice 19",
                Priority::Idle => "SCHED_IDLE",
            },
            log_path.display(),
            said.join("; ")
        );
        let running = Arc::new(Mutex::new(None));
        let (root, log_path, r, s) = (
            root.to_owned(),
            log_path.to_owned(),
            running.clone(),
            stopped.clone(),
        );
        let thread = std::thread::spawn(move || {
            for (args, env) in jobs {
                let started = std::time::Instant::now();
                run_one(&root, &args, &env, priority, &log, &log_path, &r, &s)?;
                eprintln!(
                    "xtask: in the background, `cargo {}` passed in {} s",
                    args.first().map_or("", String::as_str),
                    started.elapsed().as_secs()
                );
            }
            Ok(())
        });
        Ok(Self {
            thread: Some(thread),
            running,
        })
    }

    /// Waits for its builds, unless already waited for.
    ///
    /// # Errors
    /// One failed (its log in the error), or the thread panicked.
    fn wait(&mut self) -> anyhow::Result<()> {
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        thread
            .join()
            .map_err(|_| anyhow::anyhow!("the background builds panicked"))?
    }
}

impl Drop for Builds {
    /// Not waited for (the run failed) or one chain failed: the builds running now are
    /// ended, by their process groups, and none follows.
    fn drop(&mut self) {
        *self.stopped.lock().unwrap_or_else(PoisonError::into_inner) = true;
        for chain in &mut self.chains {
            let Some(thread) = chain.thread.take() else {
                continue;
            };
            if let Some(pgid) = *chain.running.lock().unwrap_or_else(PoisonError::into_inner) {
                let _ = Command::new("kill")
                    .args(["-TERM", "--", &format!("-{pgid}")])
                    .status();
            }
            let _ = thread.join();
        }
    }
}

/// Runs `cargo <args>` with `env` at `priority` in a process group of its own, its output
/// into `log`, unless the run was `stopped`.
#[expect(
    clippy::too_many_arguments,
    reason = "the chain's thread hands its state in; a struct would only rename it"
)]
fn run_one(
    root: &Path,
    args: &[String],
    env: &[(String, String)],
    priority: Priority,
    log: &std::fs::File,
    log_path: &Path,
    running: &Mutex<Option<u32>>,
    stopped: &Mutex<bool>,
) -> anyhow::Result<()> {
    let mut child = {
        let stopped = stopped.lock().unwrap_or_else(PoisonError::into_inner);
        if *stopped {
            anyhow::bail!("the run stopped before `cargo {}`", args.join(" "));
        }
        let mut cmd = match priority {
            Priority::Low => Command::new("nice"),
            Priority::Idle => {
                let mut c = Command::new("chrt");
                c.args(["--idle", "0", "nice"]);
                c
            }
        };
        let child = util::forget_own_package(&mut cmd)
            .args(["-n", "19", &util::cargo_program()])
            .args(args)
            .current_dir(root)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            .process_group(0)
            .spawn()?;
        *running.lock().unwrap_or_else(PoisonError::into_inner) = Some(child.id());
        child
    };
    let status = child.wait()?;
    *running.lock().unwrap_or_else(PoisonError::into_inner) = None;
    if !status.success() {
        let said = std::fs::read_to_string(log_path).unwrap_or_default();
        anyhow::bail!("`cargo {}` failed ({status}):\n{said}", args.join(" "));
    }
    Ok(())
}
