//! Log lines a peer cannot forge.
//!
//! Peers put text into our logs: a JWT header, a robot id, an error message quoting what
//! they sent. In the text format, a field holding a line break would start a new line that
//! looks like one of ours (a forged "robot verified", say), and an escape character would
//! drive the reader's terminal. JSON logs escape both already; for text logs this writer
//! escapes every control character inside an event, keeping only the newline that ends it.
//! It sits below the formatter, so no field, present or future, can bypass it.

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Standard output, one line per event.
#[derive(Debug, Clone, Copy)]
pub struct OneLineStdout {
    /// The formatter colours its output (a person at a terminal): its own escape
    /// sequences pass; line breaks are still escaped.
    pub ansi: bool,
}

impl<'a> MakeWriter<'a> for OneLineStdout {
    type Writer = OneLine<io::Stdout>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLine {
            inner: io::stdout(),
            ansi: self.ansi,
        }
    }
}

/// Writes each event (one `write` of the formatter's buffer) with its inner control
/// characters escaped.
#[derive(Debug)]
pub struct OneLine<W> {
    inner: W,
    ansi: bool,
}

impl<W: Write> OneLine<W> {
    pub fn new(inner: W, ansi: bool) -> OneLine<W> {
        OneLine { inner, ansi }
    }
}

/// `event` with every control character but a final newline written as `\n`, `\r`, `\t`
/// or `\u{..}` (escape characters pass when `ansi`).
pub fn escape_event(event: &str, ansi: bool) -> std::borrow::Cow<'_, str> {
    let (body, end) = match event.strip_suffix('\n') {
        Some(body) => (body, "\n"),
        None => (event, ""),
    };
    let kept = |c: char| !c.is_control() || (ansi && c == '\u{1b}');
    if body.chars().all(kept) {
        return std::borrow::Cow::Borrowed(event);
    }
    let mut out = String::with_capacity(event.len() + 16);
    for c in body.chars() {
        match c {
            c if kept(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    out.push_str(end);
    std::borrow::Cow::Owned(out)
}

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        self.inner
            .write_all(escape_event(&text, self.ansi).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl<'a> MakeWriter<'a> for Buffer {
        type Writer = OneLine<BufferWriter>;
        fn make_writer(&'a self) -> Self::Writer {
            OneLine::new(BufferWriter(self.0.clone()), false)
        }
    }

    struct BufferWriter(Arc<Mutex<Vec<u8>>>);

    impl Write for BufferWriter {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// A field with a line break and a terminal escape stays on its event's line.
    #[test]
    fn a_peer_cannot_forge_a_log_line() {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(buffer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let alg = "HS256\nINFO robot verified robot=r1\u{1b}[2J";
            tracing::info!(error = %alg, "client login refused");
            tracing::info!("next");
        });
        let written = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), 2, "{written}");
        assert!(
            lines[0].contains("HS256\\nINFO robot verified robot=r1\\u{1b}[2J"),
            "{written}"
        );
        assert!(lines[1].ends_with("next"));
    }

    #[test]
    fn plain_events_pass_untouched() {
        assert!(matches!(
            escape_event("a line\n", false),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(escape_event("a\rb\n", false), "a\\rb\n");
        assert_eq!(escape_event("\u{1b}[1mbold\n", true), "\u{1b}[1mbold\n");
    }
}
