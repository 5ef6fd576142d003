//! The books of a chaos or soak run: every action counted on the way in, every effect on
//! the way out, and the breaches (anything the issue says must never happen) listed by
//! name with an example each. Shared by every task of the generator.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

use crate::worker::new_histogram;

/// A counter by name (`offers.sent`, `arp.refused.-32603/robot_offline`, ...).
#[derive(Default)]
pub struct Counts(Mutex<BTreeMap<String, u64>>);

impl Counts {
    pub fn add(&self, name: &str, n: u64) {
        let mut map = self.0.lock().expect("counts");
        *map.entry(name.to_string()).or_default() += n;
    }

    pub fn get(&self, name: &str) -> u64 {
        self.0
            .lock()
            .expect("counts")
            .get(name)
            .copied()
            .unwrap_or(0)
    }

    pub fn snapshot(&self) -> BTreeMap<String, u64> {
        self.0.lock().expect("counts").clone()
    }
}

/// Latencies of one kind, whole run and the current sampling window.
pub struct Timings {
    all: Mutex<Histogram<u64>>,
    window: Mutex<Histogram<u64>>,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            all: Mutex::new(new_histogram()),
            window: Mutex::new(new_histogram()),
        }
    }
}

impl Timings {
    pub fn record(&self, nanos: u64) {
        let nanos = nanos.clamp(1, 120_000_000_000);
        let _ = self.all.lock().expect("timings").record(nanos);
        let _ = self.window.lock().expect("timings").record(nanos);
    }

    /// p50, p99, max in milliseconds and the count, of the whole run.
    pub fn summary(&self) -> Value {
        summary(&self.all.lock().expect("timings"))
    }

    /// The same of the window since the last call, which starts a new window.
    pub fn take_window(&self) -> Value {
        let mut window = self.window.lock().expect("timings");
        let value = summary(&window);
        window.reset();
        value
    }
}

fn summary(h: &Histogram<u64>) -> Value {
    let ms = |v: u64| (v as f64 / 1e6 * 100.0).round() / 100.0;
    json!({
        "count": h.len(),
        "p50_ms": ms(h.value_at_quantile(0.5)),
        "p99_ms": ms(h.value_at_quantile(0.99)),
        "max_ms": ms(h.max()),
    })
}

/// The phase marks the orchestrator sends (`mark NAME`): recoveries are counted in the
/// phase they started in.
pub struct Phases {
    current: Mutex<String>,
    back_online: Mutex<BTreeMap<String, Histogram<u64>>>,
}

#[derive(Default)]
pub struct Books {
    pub counts: Counts,
    /// Errors by code (`signalling:FORBIDDEN/robot_busy`, `arp:-32603/session_ended`).
    pub errors: Counts,
    pub relay_rtt: Timings,
    pub arp_rtt: Timings,
    pub phases: Phases,
    /// Breaches: name → (count, first example).
    breaches: Mutex<BTreeMap<String, (u64, String)>>,
    /// (subject, idempotency key) → executions on a robot.
    pub executed: Mutex<HashMap<String, u32>>,
    /// Keys whose call a program saw completed.
    pub completed_keys: Mutex<HashSet<String>>,
    /// Keys a program gave up on (no answer after every try): answered or refused, never this.
    pub unanswered_keys: Mutex<HashSet<String>>,
    /// Robots' largest number of controlling sessions seen at once.
    pub max_controllers: AtomicU64,
}

impl Default for Phases {
    fn default() -> Self {
        Phases {
            current: Mutex::new("warm-up".into()),
            back_online: Mutex::new(BTreeMap::new()),
        }
    }
}

impl Phases {
    pub fn set(&self, name: &str) {
        *self.current.lock().expect("phase") = name.to_string();
    }

    pub fn current(&self) -> String {
        self.current.lock().expect("phase").clone()
    }

    /// A robot that was cut in phase `phase` is back online after `since`.
    pub fn back_online(&self, phase: &str, since: Instant) {
        let nanos = (since.elapsed().as_nanos() as u64).clamp(1, 120_000_000_000);
        let mut map = self.back_online.lock().expect("phases");
        let _ = map
            .entry(phase.to_string())
            .or_insert_with(new_histogram)
            .record(nanos);
    }

    pub fn summary(&self) -> Value {
        let map = self.back_online.lock().expect("phases");
        Value::Object(
            map.iter()
                .map(|(phase, h)| (phase.clone(), summary(h)))
                .collect(),
        )
    }
}

impl Books {
    pub fn breach(&self, name: &str, example: String) {
        let example = format!("[{}] {example}", self.phases.current());
        let mut map = self.breaches.lock().expect("breaches");
        let entry = map.entry(name.to_string()).or_insert((0, example.clone()));
        entry.0 += 1;
        if entry.0 == 1 {
            eprintln!("[chaos] BREACH {name}: {example}");
        }
    }

    pub fn breaches(&self) -> BTreeMap<String, (u64, String)> {
        self.breaches.lock().expect("breaches").clone()
    }

    pub fn count(&self, name: &str) {
        self.counts.add(name, 1);
    }

    pub fn error(&self, code: &str) {
        self.errors.add(code, 1);
    }

    pub fn controllers_seen(&self, n: u64) {
        self.max_controllers.fetch_max(n, Ordering::Relaxed);
    }

    /// A robot ran a call; true when it is the first run of that key.
    pub fn executed(&self, key: &str) -> bool {
        let mut map = self.executed.lock().expect("executed");
        let runs = map.entry(key.to_string()).or_default();
        *runs += 1;
        if *runs > 1 {
            drop(map);
            self.breach("arp_call_executed_twice", key.to_string());
            return false;
        }
        true
    }

    /// The reconciliation at the end: ARP keys answered completed must have run exactly
    /// once; every key was answered or refused.
    pub fn reconcile(&self) {
        let executed = self.executed.lock().expect("executed").clone();
        for key in self.completed_keys.lock().expect("completed").iter() {
            if !executed.contains_key(key) {
                self.breach("arp_completed_without_running", key.clone());
            }
        }
        for key in self.unanswered_keys.lock().expect("unanswered").iter() {
            self.breach("arp_call_never_answered_nor_refused", key.clone());
        }
    }

    /// The books as JSON.
    pub fn to_json(&self) -> Value {
        let breaches: BTreeMap<String, Value> = self
            .breaches()
            .into_iter()
            .map(|(k, (n, ex))| (k, json!({"count": n, "example": ex})))
            .collect();
        json!({
            "counts": self.counts.snapshot(),
            "errors": self.errors.snapshot(),
            "relay_rtt": self.relay_rtt.summary(),
            "arp_rtt": self.arp_rtt.summary(),
            "back_online_by_phase": self.phases.summary(),
            "arp_keys_executed": self.executed.lock().expect("executed").len(),
            "arp_keys_completed": self.completed_keys.lock().expect("completed").len(),
            "max_controllers_of_one_robot": self.max_controllers.load(Ordering::Relaxed),
            "breaches": breaches,
        })
    }
}
