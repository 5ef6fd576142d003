//! From raw readings to figures: /proc parsing, per-connection memory, CPU share, medians,
//! how sockets are shared between workers, and the machine description. Pure where it can
//! be, so it is tested without starting anything.

use std::path::Path;

use anyhow::Context;
use serde_json::{json, Value};

/// Resident memory (KiB) and CPU ticks (user + system) of a process, from /proc.
pub fn proc_stats(pid: u32) -> anyhow::Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    Ok((rss_kib(&status)?, cpu_ticks(&stat)?))
}

/// VmRSS from the text of /proc/PID/status.
fn rss_kib(status: &str) -> anyhow::Result<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .context("VmRSS")
}

/// CPU ticks of a process in user space and in the kernel, from /proc/PID/stat.
pub fn cpu_split(pid: u32) -> anyhow::Result<(u64, u64)> {
    user_and_kernel_ticks(&std::fs::read_to_string(format!("/proc/{pid}/stat"))?)
}

/// utime + stime from the text of /proc/PID/stat.
fn cpu_ticks(stat: &str) -> anyhow::Result<u64> {
    let (user, kernel) = user_and_kernel_ticks(stat)?;
    Ok(user + kernel)
}

/// (utime, stime) from the text of /proc/PID/stat.
fn user_and_kernel_ticks(stat: &str) -> anyhow::Result<(u64, u64)> {
    // Fields after the command name, which is in parentheses and may contain spaces.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields
        .get(11)
        .and_then(|v| v.parse().ok())
        .context("utime")?;
    let stime: u64 = fields
        .get(12)
        .and_then(|v| v.parse().ok())
        .context("stime")?;
    Ok((utime, stime))
}

/// Ticks per second of the CPU times in /proc (100 unless getconf says otherwise).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Memory growth per socket in KiB; a target that kept no socket counts as one.
pub fn rss_per_connection_kib(rss_before_kib: u64, rss_after_kib: u64, sockets: u64) -> f64 {
    let per_conn_bytes =
        (rss_after_kib.saturating_sub(rss_before_kib) as f64 * 1024.0) / sockets.max(1) as f64;
    per_conn_bytes / 1024.0
}

/// CPU use over `secs` as a percentage of one core.
pub fn cpu_percent(ticks_before: u64, ticks_after: u64, ticks_per_sec: f64, secs: f64) -> f64 {
    (ticks_after - ticks_before) as f64 / ticks_per_sec / secs * 100.0
}

/// The middle value (the mean of the two middle ones for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.total_cmp(b));
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `total` shared as evenly as possible between `parts`, the first ones taking the rest.
pub fn shares(total: usize, parts: usize) -> Vec<usize> {
    (0..parts)
        .map(|w| total / parts + usize::from(w < total % parts))
        .collect()
}

/// The CPU model line of /proc/cpuinfo.
fn cpu_model(cpuinfo: &str) -> String {
    cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_default()
}

/// What the figures were measured on: CPU, kernel, tool versions, commit, file limit.
pub fn describe_machine(repo: &Path) -> Value {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .current_dir(repo)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .map(|c| cpu_model(&c))
        .unwrap_or_default();
    json!({
        "cpu": cpu,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "kernel": run("uname", &["-r"]),
        "rustc": run("rustc", &["--version"]),
        "node": run("node", &["--version"]),
        "python": run("python3", &["--version"]),
        "commit": run("git", &["rev-parse", "--short", "HEAD"]),
        "open_files_limit": run("sh", &["-c", "ulimit -n"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_comes_from_the_vmrss_line() {
        let status =
            "Name:\tsignalling-serv\nVmPeak:\t  90000 kB\nVmRSS:\t   12345 kB\nThreads:\t3\n";
        assert_eq!(rss_kib(status).unwrap(), 12345);
        assert!(rss_kib("Name:\tx\n").is_err());
        assert!(rss_kib("VmRSS:\tlots kB\n").is_err());
    }

    #[test]
    fn cpu_ticks_add_utime_and_stime_after_the_command_name() {
        // A command name with spaces and a ')' must not shift the fields.
        let stat = "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 70 30 0 0 20 0 3 0";
        assert_eq!(cpu_ticks(stat).unwrap(), 100);
        assert_eq!(user_and_kernel_ticks(stat).unwrap(), (70, 30));
        assert!(cpu_ticks("4242 (short) S 1").is_err());
        assert!(cpu_ticks("no parenthesis").is_err());
    }

    #[test]
    fn this_process_can_be_measured() {
        let (rss, _) = proc_stats(std::process::id()).unwrap();
        assert!(rss > 0);
        assert!(clock_ticks() > 0.0);
    }

    #[test]
    fn rss_per_connection_is_growth_over_sockets() {
        assert_eq!(rss_per_connection_kib(1_000, 3_000, 100), 20.0);
        // Memory that shrank counts as no growth; no sockets count as one.
        assert_eq!(rss_per_connection_kib(3_000, 1_000, 100), 0.0);
        assert_eq!(rss_per_connection_kib(1_000, 1_512, 0), 512.0);
    }

    #[test]
    fn cpu_percent_is_of_one_core() {
        assert_eq!(cpu_percent(100, 150, 100.0, 1.0), 50.0);
        assert_eq!(cpu_percent(0, 2_000, 100.0, 10.0), 200.0);
        assert_eq!(cpu_percent(7, 7, 100.0, 10.0), 0.0);
    }

    #[test]
    fn median_of_odd_even_and_no_values() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[9.0, 1.0, 5.0]), 5.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[1.0, f64::NAN, 2.0]), 2.0, "NaN sorts last");
    }

    #[test]
    fn shares_are_even_and_add_up() {
        assert_eq!(shares(10, 3), vec![4, 3, 3]);
        assert_eq!(shares(12_000, 2), vec![6_000, 6_000]);
        assert_eq!(shares(2, 3), vec![1, 1, 0]);
        for (total, parts) in [(0, 1), (1, 1), (18_000, 3), (301, 7)] {
            let s = shares(total, parts);
            assert_eq!(s.len(), parts);
            assert_eq!(s.iter().sum::<usize>(), total);
            assert!(s.iter().max().unwrap() - s.iter().min().unwrap() <= 1);
        }
    }

    #[test]
    fn cpu_model_is_read_from_cpuinfo() {
        let cpuinfo = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\nflags\t: fpu\n";
        assert_eq!(cpu_model(cpuinfo), "Intel(R) Xeon(R) CPU @ 2.20GHz");
        assert_eq!(cpu_model("processor\t: 0\n"), "");
    }

    #[test]
    fn the_machine_description_has_every_field() {
        let machine = describe_machine(Path::new("."));
        for field in [
            "cpu",
            "cores",
            "kernel",
            "rustc",
            "node",
            "python",
            "commit",
            "open_files_limit",
        ] {
            assert!(machine.get(field).is_some(), "{field} missing: {machine}");
        }
    }
}
