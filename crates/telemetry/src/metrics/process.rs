//! The process's own metrics, under the names every Prometheus client library gives them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, ...), read from /proc at
//! each scrape. Elsewhere than Linux there are none.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;

use super::gauge;

/// Collects the process's CPU time, memory, threads, descriptors and start time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Process;

impl prometheus_client::collector::Collector for Process {
    fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        #[cfg(target_os = "linux")]
        linux(&mut e)?;
        #[cfg(not(target_os = "linux"))]
        let _ = &mut e;
        Ok(())
    }
}

#[cfg(target_os = "linux")]
#[expect(
    clippy::cast_precision_loss,
    reason = "sizes and times as metric values"
)]
fn linux(e: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
    // What cannot be read is left out of this scrape (a value of 0 would be a lie).
    let Ok(me) = procfs::process::Process::myself() else {
        return Ok(());
    };
    if let Ok(stat) = me.stat() {
        let ticks = procfs::ticks_per_second() as f64;
        let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / ticks);
        let m = e.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time spent, in seconds.",
            None,
            cpu.metric_type(),
        )?;
        cpu.encode(m)?;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            (stat.rss * procfs::page_size()) as f64,
        )?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.vsize as f64,
        )?;
        gauge(
            e,
            "process_threads",
            "Threads of the process.",
            stat.num_threads as f64,
        )?;
        if let Ok(boot) = procfs::boot_time_secs() {
            gauge(
                e,
                "process_start_time_seconds",
                "When the process started, in seconds since the Unix epoch.",
                boot as f64 + stat.starttime as f64 / ticks,
            )?;
        }
    }
    if let Ok(open) = me.fd_count() {
        gauge(e, "process_open_fds", "Open file descriptors.", open as f64)?;
    }
    if let Ok(limits) = me.limits()
        && let procfs::process::LimitValue::Value(max) = limits.max_open_files.soft_limit
    {
        gauge(
            e,
            "process_max_fds",
            "The most file descriptors the process may open.",
            max as f64,
        )?;
    }
    Ok(())
}
