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

    /// Whether welcomes carry credentials that expire, so long connections need fresh ones.
    pub fn issues_credentials(&self) -> bool {
        !self.turn_urls.is_empty() && self.turn_secret.is_some()
    }

    /// When a connection should get fresh credentials: well before the old ones lapse, so
    /// a peer that gathers candidates or restarts ICE late still holds valid ones.
    pub fn refresh_after(&self) -> std::time::Duration {
        let ttl = self.turn_ttl_secs.max(1);
        // At 80 % of the lifetime, and never later than one minute before expiry.
        let at = (ttl * 4 / 5)
            .min(ttl.saturating_sub(60))
            .max(ttl / 2)
            .max(1);
        std::time::Duration::from_secs(at)
    }

    /// STUN plus TURN with short-lived credentials bound to `user` (the TURN server logs
    /// it: the client's subject, or `robot:<id>`).
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
    fn credentials_refresh_before_they_lapse() {
        let cfg = |ttl| IceConfig {
            stun_urls: vec![],
            turn_urls: vec!["turn:127.0.0.1:3478".into()],
            turn_secret: Some("x".into()),
            turn_ttl_secs: ttl,
        };
        assert_eq!(cfg(600).refresh_after().as_secs(), 480);
        assert_eq!(cfg(3_600).refresh_after().as_secs(), 2_880);
        assert_eq!(cfg(100).refresh_after().as_secs(), 50);
        assert_eq!(cfg(2).refresh_after().as_secs(), 1);
        assert!(cfg(600).issues_credentials());
        let stun_only = IceConfig {
            turn_urls: vec![],
            ..cfg(600)
        };
        assert!(!stun_only.issues_credentials());
    }

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
