//! `signalling-server pki …`: a development CA and robot certificates in a folder.
//! Keys are written 0600 and never overwritten.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};

use crate::config::PkiCommand;
use crate::pki::{generate_ca, CertificateAuthority};

pub const CA_CERT_FILE: &str = "ca.pem";
pub const CA_KEY_FILE: &str = "ca.key";

pub fn run(command: PkiCommand) -> anyhow::Result<()> {
    match command {
        PkiCommand::InitCa {
            out,
            common_name,
            days,
        } => {
            let (cert, key) = generate_ca(&common_name, days)?;
            std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
            write_new(&out.join(CA_CERT_FILE), cert.as_bytes(), 0o644)?;
            write_new(&out.join(CA_KEY_FILE), key.as_bytes(), 0o600)?;
            println!(
                "CA written to {dir}/{CA_CERT_FILE} and {dir}/{CA_KEY_FILE}.\nStart the server with --ca-cert {dir}/{CA_CERT_FILE} --ca-key {dir}/{CA_KEY_FILE} (signs CSRs)\nor --trust-anchors {dir}/{CA_CERT_FILE} --auto-register (robots log in with certificates it issued).",
                dir = out.display()
            );
            Ok(())
        }
        PkiCommand::Issue {
            robot_id,
            out,
            days,
        } => {
            if !crate::identity::valid_robot_id(&robot_id) {
                bail!("{}", crate::identity::ROBOT_ID_RULE);
            }
            let ca = load_ca(&out)?;
            let now = crate::clock::now_unix();
            let lifetime = Duration::from_secs(u64::from(days) * 86_400);
            let (issued, key) = ca.issue_key_and_cert(&robot_id, lifetime, now)?;
            let cert_path = out.join(format!("{robot_id}.pem"));
            let key_path = out.join(format!("{robot_id}.key"));
            write_new(&cert_path, issued.chain_pem.as_bytes(), 0o644)?;
            write_new(&key_path, key.as_bytes(), 0o600)?;
            println!(
                "{} (chain, serial {}) and {} written.",
                cert_path.display(),
                issued.serial_hex,
                key_path.display()
            );
            Ok(())
        }
    }
}

fn load_ca(dir: &Path) -> anyhow::Result<CertificateAuthority> {
    let cert_path: PathBuf = dir.join(CA_CERT_FILE);
    let key_path: PathBuf = dir.join(CA_KEY_FILE);
    let cert = std::fs::read_to_string(&cert_path)
        .with_context(|| format!("reading {} (run `pki init-ca` first)", cert_path.display()))?;
    let key = std::fs::read_to_string(&key_path)
        .with_context(|| format!("reading {}", key_path.display()))?;
    Ok(CertificateAuthority::from_pem(&cert, &key)?)
}

/// Creates `path` with `mode`, refusing to replace an existing file.
fn write_new(path: &Path, contents: &[u8], mode: u32) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options
        .open(path)
        .with_context(|| format!("creating {} (it must not exist yet)", path.display()))?;
    file.write_all(contents)?;
    Ok(())
}
