//! What the bridge is asked to do, and how it ended.

use crate::ws;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Arp,
    Mcp,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Arp => "arp",
            Mode::Mcp => "mcp",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub target: ws::Target,
    pub mode: Mode,
}

/// How the bridge ended; [`Exit::code`] is the process's exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// stdin ended: the socket was closed cleanly.
    Eof,
    /// Could not connect or initialize; the ready notification said why.
    StartFailed,
    /// Reading stdin failed.
    Input,
    /// The ARP connection ended while the parent was still there.
    ConnectionLost,
}

impl Exit {
    pub fn code(self) -> u8 {
        match self {
            Exit::Eof => 0,
            Exit::StartFailed | Exit::Input => 1,
            Exit::ConnectionLost => 2,
        }
    }
}
