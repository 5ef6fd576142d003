//! The audit log's spill: records the database would not take, in an append-only file
//! (JSON lines, fsync'd) or, while the file cannot be written either, in memory.

use std::io::{BufRead, Write as _};
use std::path::PathBuf;

use super::{AuditRecord, MAX_HELD};

/// Where records go that the database would not take: the spill file, and memory while
/// the file cannot be written either.
pub(super) struct Spill {
    file: PathBuf,
    /// Records in the file.
    on_file: usize,
    /// Records neither the database nor the file took.
    pub(super) held: Vec<AuditRecord>,
}

impl Spill {
    /// The spill at `file`, counting what an earlier run left in it.
    pub(super) fn open(file: PathBuf) -> Spill {
        let on_file = std::fs::File::open(&file)
            .map(|f| std::io::BufReader::new(f).lines().count())
            .unwrap_or(0);
        if on_file > 0 {
            tracing::warn!(records = on_file, file = %file.display(), "audit records spilled by an earlier run; loading them back");
        }
        Spill {
            file,
            on_file,
            held: Vec::new(),
        }
    }

    pub(super) fn waiting(&self) -> usize {
        self.on_file + self.held.len()
    }

    /// Takes `records` out of the database's way: appended to the file (fsync'd), or
    /// held in memory when that fails.
    pub(super) async fn hold(&mut self, records: Vec<AuditRecord>) {
        self.held.extend(records);
        if self.held.len() > MAX_HELD {
            let lost = self.held.len() - MAX_HELD;
            self.held.drain(..lost);
            tracing::error!(
                records = lost,
                "audit records lost: neither the database nor the spill file takes them"
            );
        }
        let mut text = String::new();
        for record in &self.held {
            // An AuditRecord always serializes.
            if let Ok(line) = serde_json::to_string(record) {
                text.push_str(&line);
                text.push('\n');
            }
        }
        let file = self.file.clone();
        match tokio::task::spawn_blocking(move || append_synced(&file, &text)).await {
            Ok(Ok(())) => {
                tracing::error!(
                    records = self.held.len(),
                    file = %self.file.display(),
                    "the database refuses audit records: spilled to the file, to be loaded back"
                );
                self.on_file += self.held.len();
                self.held.clear();
            }
            Ok(Err(e)) => tracing::error!(
                error = %e,
                records = self.held.len(),
                file = %self.file.display(),
                "cannot spill audit records either: held in memory"
            ),
            Err(e) => tracing::error!(error = %e, "audit spill task failed"),
        }
    }

    /// Every waiting record: the file's, then memory's.
    pub(super) async fn all(&self) -> Vec<AuditRecord> {
        let file = self.file.clone();
        let mut records = tokio::task::spawn_blocking(move || read_spill(&file))
            .await
            .unwrap_or_default();
        records.extend(self.held.iter().cloned());
        records
    }

    /// Everything waiting is in the database: the file is emptied.
    pub(super) async fn clear(&mut self) {
        if self.on_file > 0 {
            let file = self.file.clone();
            let emptied = tokio::task::spawn_blocking(move || {
                let f = std::fs::OpenOptions::new().write(true).open(&file)?;
                f.set_len(0)?;
                f.sync_all()
            })
            .await;
            if !matches!(emptied, Ok(Ok(()))) {
                // Left as it is: loading it again later is harmless (upserts).
                tracing::warn!(file = %self.file.display(), "cannot empty the audit spill file");
                return;
            }
        }
        self.on_file = 0;
        self.held.clear();
    }
}

/// Appends `text` to `file` and syncs it; on failure the file is cut back to where it
/// was, so no torn line stays behind.
fn append_synced(file: &std::path::Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    // Records carry call parameters: for the server's user only.
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(file)?;
    let before = f.metadata()?.len();
    let written = f.write_all(text.as_bytes()).and_then(|()| f.sync_data());
    if written.is_err() {
        let _ = f.set_len(before);
    }
    written
}

/// The spill file's records; a line that does not parse (cut by a crash mid-write) is
/// logged and skipped.
fn read_spill(file: &std::path::Path) -> Vec<AuditRecord> {
    let Ok(f) = std::fs::File::open(file) else {
        return Vec::new();
    };
    let mut records = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str(&line) {
            Ok(record) => records.push(record),
            Err(e) => tracing::warn!(error = %e, "unreadable line in the audit spill file"),
        }
    }
    records
}
