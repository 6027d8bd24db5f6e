//! What a daemon tells its service manager (sd_notify(3), through the `sd-notify` crate):
//! ready, reloading, stopping, and the watchdog's pings. Without systemd (no
//! `NOTIFY_SOCKET`), every call does nothing. And how every program ends: its exit statuses,
//! the fatal line, and the answers of `check-config` and `policy` that scripts read.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

/// The exit status of a configuration the program refuses (EX_CONFIG in sysexits.h). The
/// units name it in `RestartPreventExitStatus=`: restarting would not mend the file.
pub const EXIT_CONFIG: u8 = 78;

/// A configuration the program refuses: said as [`fatal`] says it, and the exit status
/// [`EXIT_CONFIG`].
pub fn config_refused(program: &str, e: &dyn std::fmt::Display) -> std::process::ExitCode {
    fatal(program, e);
    std::process::ExitCode::from(EXIT_CONFIG)
}

/// The exit status of a `policy` dry run that cannot answer (a name that is not one
/// address, a flow that does not read); 0 is its "allowed", 1 its "denied".
pub const EXIT_NO_ANSWER: u8 = 2;

/// `check-config`'s answer for the file `config`: the `summary` of a good one, or why it is
/// refused (exit status [`EXIT_CONFIG`]), as text or, with `json`, as one JSON object on
/// stdout (`{"ok", "config", "summary"}` or `{"ok": false, "config", "error"}`).
#[expect(clippy::print_stdout, reason = "the command's answer")]
pub fn checked_config(
    program: &str,
    config: &std::path::Path,
    json: bool,
    checked: Result<String, String>,
) -> std::process::ExitCode {
    let path = config.display().to_string();
    match (checked, json) {
        (Ok(summary), false) => println!("{summary}"),
        (Ok(summary), true) => println!(
            "{}",
            serde_json::json!({ "ok": true, "config": path, "summary": summary })
        ),
        (Err(e), false) => return config_refused(program, &e),
        (Err(e), true) => {
            println!(
                "{}",
                serde_json::json!({ "ok": false, "config": path, "error": e })
            );
            return std::process::ExitCode::from(EXIT_CONFIG);
        }
    }
    std::process::ExitCode::SUCCESS
}

/// A `policy` dry run's answer: whether the flow is allowed and why, as text or, with `json`,
/// as `{"allowed", "answer"}`; exit status 0 allowed, 1 denied, [`EXIT_NO_ANSWER`] when it
/// cannot say (the reason on stderr).
#[expect(clippy::print_stdout, reason = "the command's answer")]
pub fn policy_answer(
    program: &str,
    json: bool,
    answer: Result<(bool, String), String>,
) -> std::process::ExitCode {
    match answer {
        Ok((allowed, answer)) => {
            if json {
                println!(
                    "{}",
                    serde_json::json!({ "allowed": allowed, "answer": answer })
                );
            } else {
                println!("{answer}");
            }
            if allowed {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::FAILURE
            }
        }
        Err(e) => {
            fatal(program, &e);
            std::process::ExitCode::from(EXIT_NO_ANSWER)
        }
    }
}

/// Says on stderr why the program ends, as `<program>: error: ...`; under systemd (stderr is
/// the journal's) each line is led by its priority, `<3>` (err), so that `journalctl -p err`
/// shows why a unit stopped, as it shows the error lines the program logged.
pub fn fatal(program: &str, e: &dyn std::fmt::Display) {
    eprint!(
        "{}",
        fatal_text(program, e, crate::logging::under_journald())
    );
}

fn fatal_text(program: &str, e: &dyn std::fmt::Display, journald: bool) -> String {
    let priority = if journald { "<3>" } else { "" };
    format!("{program}: error: {e:#}")
        .lines()
        .map(|l| format!("{priority}{l}\n"))
        .collect()
}

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "the service manager could not be told");
    }
}

/// The daemon serves: systemd marks the unit active (`Type=notify`).
pub fn ready() {
    notify(&[NotifyState::Ready]);
}

/// The daemon reads its configuration again ([`ready`] follows when it is done).
pub fn reloading() {
    notify(&[NotifyState::Reloading]);
}

/// The daemon is shutting down.
pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

/// The watchdog systemd keeps on this process (`WatchdogSec=`): pinged at half its period
/// from the loop whose liveness it stands for.
#[derive(Debug, Clone)]
pub struct Watchdog {
    every: Duration,
    next: Instant,
}

impl Watchdog {
    /// The watchdog systemd set for this process, or `None` (no `WatchdogSec=`, or not
    /// under systemd).
    pub fn from_env(now: Instant) -> Option<Self> {
        let mut usec = 0;
        (sd_notify::watchdog_enabled(false, &mut usec) && usec > 0)
            .then(|| Self::every(Duration::from_micros(usec) / 2, now))
    }

    /// A watchdog pinged every `every`, the first time at once.
    pub fn every(every: Duration, now: Instant) -> Self {
        Self { every, next: now }
    }

    /// When the next ping is due.
    pub fn due(&self) -> Instant {
        self.next
    }

    /// Pings when due (returns whether it did).
    pub fn kick(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        notify(&[NotifyState::Watchdog]);
        self.next = now + self.every;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The line that explains an exit carries err's priority for the journal, on every line
    /// of a message that has several; elsewhere it is as said.
    #[test]
    fn the_fatal_line_is_an_error_for_the_journal() {
        let e = "starting: cannot bind\nport 51820";
        assert_eq!(
            fatal_text("cyphonic-node", &e, true),
            "<3>cyphonic-node: error: starting: cannot bind\n<3>port 51820\n"
        );
        assert_eq!(
            fatal_text("cyphonic-node", &e, false),
            "cyphonic-node: error: starting: cannot bind\nport 51820\n"
        );
    }

    #[test]
    fn the_watchdog_is_pinged_once_per_period() {
        let t0 = Instant::now();
        let mut w = Watchdog::every(Duration::from_secs(15), t0);
        assert!(w.kick(t0), "the first ping goes at once");
        assert!(!w.kick(t0 + Duration::from_secs(14)));
        assert_eq!(w.due(), t0 + Duration::from_secs(15));
        assert!(w.kick(t0 + Duration::from_secs(16)));
        assert_eq!(w.due(), t0 + Duration::from_secs(31));
    }
}
