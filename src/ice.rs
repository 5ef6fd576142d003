//! ICE servers handed out in `signalling.welcome`, with TURN REST credentials
//! (coturn `use-auth-secret`): username `expiry:user`, password base64(HMAC-SHA1(secret, username)).

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ring::hmac;
use signalling_protocol::IceServer;

#[derive(Debug, Clone, Default)]
pub struct IceConfig {
    pub stun_urls: Vec<String>,
    pub turn_urls: Vec<String>,
    pub turn_secret: Option<String>,
    pub turn_ttl_secs: u64,
}

impl IceConfig {
    /// STUN only: for connections that have not proven who they are.
    pub fn public_servers(&self) -> Vec<IceServer> {
        let mut servers = Vec::new();
        if !self.stun_urls.is_empty() {
            servers.push(IceServer {
                urls: self.stun_urls.clone(),
                username: None,
                credential: None,
            });
        }
        servers
    }

    /// STUN plus TURN with short-lived credentials bound to `user`.
    pub fn servers_for(&self, user: &str, now_unix: u64) -> Vec<IceServer> {
        let mut servers = self.public_servers();
        if self.turn_urls.is_empty() {
            return servers;
        }
        let (username, credential) = match &self.turn_secret {
            Some(secret) => {
                let (u, c) = turn_credentials(secret, user, now_unix + self.turn_ttl_secs);
                (Some(u), Some(c))
            }
            None => (None, None),
        };
        servers.push(IceServer {
            urls: self.turn_urls.clone(),
            username,
            credential,
        });
        servers
    }
}

pub fn turn_credentials(secret: &str, user: &str, expires_unix: u64) -> (String, String) {
    let username = format!("{expires_unix}:{user}");
    let key = hmac::Key::new(hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, secret.as_bytes());
    let tag = hmac::sign(&key, username.as_bytes());
    (username, STANDARD.encode(tag.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turn_rest_credentials_match_coturn() {
        // Reference value computed with: printf '1700000000:robot-1' | openssl dgst -sha1 -hmac s3cret -binary | base64
        let (user, pass) = turn_credentials("s3cret", "robot-1", 1_700_000_000);
        assert_eq!(user, "1700000000:robot-1");
        assert_eq!(pass, REFERENCE);
    }

    const REFERENCE: &str = "AkrfkaTFidB25FhW8hdKxFMMJc8=";

    #[test]
    fn turn_only_with_urls() {
        let cfg = IceConfig {
            stun_urls: vec!["stun:127.0.0.1:3478".into()],
            turn_urls: vec![],
            turn_secret: Some("x".into()),
            turn_ttl_secs: 60,
        };
        assert_eq!(cfg.servers_for("a", 0).len(), 1);
        let cfg = IceConfig {
            turn_urls: vec!["turn:127.0.0.1:3478".into()],
            ..cfg
        };
        let servers = cfg.servers_for("a", 100);
        assert_eq!(servers.len(), 2);
        assert_eq!(servers[1].username.as_deref(), Some("160:a"));
        assert!(cfg.public_servers().iter().all(|s| s.credential.is_none()));
    }
}
