//! The bearer token: given once (`--token`, `ARP_TOKEN`), or kept in a file
//! (`--token-file`) that is read again for every connection, so a token
//! rotated in the file (an expiring one replaced) is the one the next
//! connection presents. Never printed.

use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TokenError {
    #[error("cannot read the token file {path}: {why}")]
    Unreadable { path: PathBuf, why: String },
    // Never the token itself in a message: it may reach a log.
    #[error("the token is empty")]
    Empty,
    #[error("the token contains whitespace")]
    Whitespace,
}

/// Where the token comes from.
#[derive(Clone, Default)]
pub enum TokenSource {
    /// None (robot-agent's socket with `--arp-no-token` takes loopback clients).
    #[default]
    None,
    /// Fixed for the bridge's life.
    Fixed(String),
    /// Read again at every connection.
    File(PathBuf),
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TokenSource::None => f.write_str("None"),
            TokenSource::Fixed(_) => f.write_str("Fixed(***)"),
            TokenSource::File(path) => write!(f, "File({})", path.display()),
        }
    }
}

impl TokenSource {
    /// The token as of now (the file read again).
    pub fn current(&self) -> Result<Option<String>, TokenError> {
        match self {
            TokenSource::None => Ok(None),
            TokenSource::Fixed(token) => checked(token).map(Some),
            TokenSource::File(path) => read_file(path).map(Some),
        }
    }

    /// The file a new token may be written to, if there is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            TokenSource::File(path) => Some(path),
            _ => None,
        }
    }
}

/// A token file's token: surrounding whitespace ignored; a robot-agent
/// token file (`ROLE:SECRET`) works as is.
pub fn read_file(path: &Path) -> Result<String, TokenError> {
    let text = std::fs::read_to_string(path).map_err(|e| TokenError::Unreadable {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    checked(without_role(text.trim()))
}

fn checked(token: &str) -> Result<String, TokenError> {
    let token = token.trim();
    if token.is_empty() {
        Err(TokenError::Empty)
    } else if token.chars().any(char::is_whitespace) {
        Err(TokenError::Whitespace)
    } else {
        Ok(token.to_owned())
    }
}

/// robot-agent's token files hold `ROLE:SECRET` (`enroll` writes
/// `operator:SECRET`); the secret is what a client presents.
fn without_role(text: &str) -> &str {
    ["viewer:", "operator:", "owner:"]
        .iter()
        .find_map(|role| text.strip_prefix(role))
        .unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_file_is_read_again_each_time() {
        let path = std::env::temp_dir().join(format!("arp-bridge-token-{}", std::process::id()));
        std::fs::write(&path, "operator:first\n").unwrap();
        let source = TokenSource::File(path.clone());
        assert_eq!(source.current(), Ok(Some("first".into())));
        std::fs::write(&path, "  second  \n").unwrap();
        assert_eq!(source.current(), Ok(Some("second".into())));
        std::fs::write(&path, "\n").unwrap();
        assert_eq!(source.current(), Err(TokenError::Empty));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            source.current(),
            Err(TokenError::Unreadable { .. })
        ));
        assert!(!format!("{:?}", TokenSource::Fixed("secret".into())).contains("secret"));
    }
}
