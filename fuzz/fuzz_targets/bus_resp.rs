//! The cluster bus's reader of Redis replies and pushes: whatever it reads at some length,
//! every shorter prefix reads as incomplete (never as an error or another reply), and a bus
//! payload inside never panics the decoder. Commands written by the bus read back as the
//! same arguments.
#![no_main]

use libfuzzer_sys::fuzz_target;
use signalling_server::cluster::decode;
use signalling_server::cluster::resp::{parse, Outgoing, Reply};

fuzz_target!(|data: &[u8]| {
    if let Ok(Some((reply, used))) = parse(data) {
        assert!(used <= data.len());
        for cut in 0..used {
            assert_eq!(parse(&data[..cut]), Ok(None), "a prefix of {used} bytes at {cut}");
        }
        if let Reply::Array(items) = &reply {
            if let [_, _, Reply::Bulk(Some(payload))] = items.as_slice() {
                let _ = decode(payload);
            }
        }
        assert_eq!(parse(&data[..used]).map(|r| r.map(|(_, n)| n)), Ok(Some(used)));
    }

    let args: Vec<&[u8]> = data.split(|&b| b == 0xff).take(16).collect();
    let mut out = Outgoing::new(Vec::new());
    out.command(&args);
    let written: Vec<u8> = out.io_slices().iter().flat_map(|s| s.to_vec()).collect();
    let Ok(Some((Reply::Array(items), used))) = parse(&written) else {
        panic!("a written command reads back");
    };
    assert_eq!(used, written.len());
    let read: Vec<&[u8]> = items
        .iter()
        .map(|item| match item {
            Reply::Bulk(Some(b)) => *b,
            other => panic!("a bulk string, not {other:?}"),
        })
        .collect();
    assert_eq!(read, args);
});
