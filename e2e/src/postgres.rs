//! A throwaway PostgreSQL server for the store tests: `initdb` in a scratch directory, the
//! server on a free loopback port, run as the `postgres` system user through `setpriv` (PostgreSQL refuses to
//! run as root), removed on drop. Debian's `postgresql` package provides the binaries; the
//! cluster it may have started itself is not touched.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use crate::bed::TempDir;
use crate::{Netns, Proc, wait_until};

/// A running server. `url()` reaches database `postgres` as the superuser `cyphonic`.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    server: Option<Proc>,
    _dir: TempDir,
}

/// The newest installed PostgreSQL's `bin` directory.
fn bin_dir() -> anyhow::Result<PathBuf> {
    let root = PathBuf::from("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(&root)
        .with_context(|| format!("{}: is the postgresql package installed?", root.display()))?
        .filter_map(|e| {
            let e = e.ok()?;
            let v = e.file_name().to_str()?.parse().ok()?;
            Some((v, e.path().join("bin")))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .context("no PostgreSQL version under /usr/lib/postgresql")
}

/// `program` as the `postgres` user, in namespace `ns` if given; `ip netns exec` and
/// `setpriv` exec it in place, so the PID we hold is the server's own and signals reach it.
fn as_postgres(program: &Path, ns: Option<&Netns>) -> Command {
    let setpriv = [
        "setpriv",
        "--reuid=postgres",
        "--regid=postgres",
        "--clear-groups",
        "--",
    ];
    let mut c = match ns {
        Some(ns) => ns.command(setpriv[0], &setpriv[1..]),
        None => {
            let mut c = Command::new(setpriv[0]);
            c.args(&setpriv[1..]);
            c
        }
    };
    c.arg(program).current_dir("/");
    c
}

impl Postgres {
    /// Creates and starts a server on this host's loopback; waits until it accepts
    /// connections.
    ///
    /// # Errors
    /// PostgreSQL is not installed, or does not come up within 20 s (its log is in the error).
    pub fn start() -> anyhow::Result<Self> {
        Self::start_in(None)
    }

    /// The same, on the loopback of namespace `ns` (for daemons running there), or of this
    /// host without one.
    ///
    /// # Errors
    /// As [`Postgres::start`].
    pub fn start_in(ns: Option<&Netns>) -> anyhow::Result<Self> {
        crate::require_root();
        let bin = bin_dir()?;
        let dir = TempDir::new("pg")?;
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        crate::sh(
            "chown",
            &[
                "-R",
                "postgres:postgres",
                dir.path().to_str().context("path")?,
            ],
        )?;
        let out = as_postgres(&bin.join("initdb"), None)
            .args(["-D", data.to_str().context("path")?])
            .args(["-U", "cyphonic", "-A", "trust", "--no-sync", "-E", "UTF8"])
            .output()?;
        if !out.status.success() {
            bail!("initdb: {}", String::from_utf8_lossy(&out.stderr));
        }
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = dir.path().join("server.log");
        let log_file = std::fs::File::create(&log)?;
        crate::sh("chown", &["postgres", log.to_str().context("path")?])?;
        let child = as_postgres(&bin.join("postgres"), ns)
            .args(["-D", data.to_str().context("path")?])
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args([
                "-c",
                &format!("unix_socket_directories={}", dir.path().display()),
            ])
            .args(["-c", "fsync=off"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting postgres")?;
        let server = Proc::from_child(child, "postgres");
        let ready = wait_until(
            Duration::from_secs(20),
            "PostgreSQL accepting connections",
            || {
                let isready = bin.join("pg_isready");
                let args = ["-h", "127.0.0.1", "-p", &port.to_string(), "-q"];
                let mut c = match ns {
                    Some(ns) => ns.command(isready.to_str().unwrap_or("pg_isready"), &args),
                    None => {
                        let mut c = Command::new(&isready);
                        c.args(args);
                        c
                    }
                };
                c.status().is_ok_and(|s| s.success())
            },
        );
        if let Err(e) = ready {
            bail!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        Ok(Self {
            port,
            server: Some(server),
            _dir: dir,
        })
    }

    /// The URL of database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://cyphonic@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT: PostgreSQL's fast shutdown; the directory goes after it.
        if let Some(p) = self.server.take() {
            let _ = p.stop("INT", Duration::from_secs(10));
        }
    }
}
