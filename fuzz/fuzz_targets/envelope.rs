//! A WebSocket text frame as the server reads it: envelope, then the typed body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use signalling_protocol::{is_legacy_ready, Envelope};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = is_legacy_ready(text);
    if let Ok(envelope) = Envelope::parse(text) {
        let _ = envelope.body();
        // What we send back out must parse again.
        let again = envelope.to_json();
        Envelope::parse(&again).expect("a parsed envelope re-serialises to a valid one");
    }
});
