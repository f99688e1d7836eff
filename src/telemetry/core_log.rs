//! Where log lines go: stdout, and on a core's thread (`crate::cores`)
//! through a buffer of that thread's own.
//!
//! Every delivery writes one line. Written at once, each line is a `write`
//! system call of its own (tracing-subscriber formats an event into one
//! string and hands it to its writer in one piece). On a core's thread the
//! lines gather instead and are written together: when the core is about
//! to wait for work (its runtime's `on_thread_park` hook calls [`flush`]),
//! when they pass [`LIMIT`], and when the thread ends. A line is never
//! split, and lines are late by at most the work a core finds ready at
//! once: it parks as soon as nothing is left to run. Off the cores (the
//! main runtime, the CLI, tests) each line is written as it comes.
//!
//! Written by hand: tracing-appender's non-blocking writer would move each
//! line through a channel to a thread of its own, a hand-off per line
//! where this is a copy into a buffer the thread already owns.

use std::cell::RefCell;
use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// A core's lines are written out once they reach this many bytes, even
/// if the core never runs out of work.
pub const LIMIT: usize = 64 * 1024;

thread_local! {
    static PENDING: RefCell<Pending> = const { RefCell::new(Pending(Vec::new())) };
}

/// The lines a core's thread has not written yet; written when the thread
/// ends (after its runtime), so that stopping loses none.
struct Pending(Vec<u8>);

impl Pending {
    fn write_out(&mut self) {
        if !self.0.is_empty() {
            // Nowhere to report a failed log write: stdout is the log.
            let _ = stdout().write_all(&self.0);
            self.0.clear();
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.write_out();
    }
}

/// Writes out the calling thread's pending lines.
pub fn flush() {
    let _ = PENDING.try_with(|pending| {
        if let Ok(mut pending) = pending.try_borrow_mut() {
            pending.write_out();
        }
    });
}

#[cfg(not(test))]
fn stdout() -> impl Write {
    io::stdout().lock()
}

/// In unit tests, the writes this thread would have made.
#[cfg(test)]
fn stdout() -> impl Write {
    tests::Written
}

/// tracing-subscriber's writer for the log.
#[derive(Clone, Copy, Debug, Default)]
pub struct CoreLog;

impl<'a> MakeWriter<'a> for CoreLog {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line
    }
}

/// One event's line (tracing-subscriber writes it with one `write_all`).
pub struct Line;

impl Line {
    /// Takes `line` into the thread's buffer if this is a core's thread;
    /// `false` if it must be written at once.
    fn pend(line: &[u8]) -> bool {
        if crate::cores::current() == 0 {
            return false;
        }
        let pended = PENDING.try_with(|pending| {
            let Ok(mut pending) = pending.try_borrow_mut() else {
                return false;
            };
            pending.0.extend_from_slice(line);
            if pending.0.len() >= LIMIT {
                pending.write_out();
            }
            true
        });
        pended.unwrap_or(false)
    }
}

impl Write for Line {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if Self::pend(buf) {
            Ok(())
        } else {
            stdout().write_all(buf)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    thread_local! {
        static WRITES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    }

    /// Records each `write_all` as one write.
    pub(super) struct Written;

    impl Write for Written {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            // At the thread's end `WRITES` may be gone before `PENDING`.
            let _ = WRITES.try_with(|w| w.borrow_mut().push(buf.to_vec()));
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn writes() -> Vec<Vec<u8>> {
        WRITES.with(|w| w.borrow_mut().drain(..).collect())
    }

    fn log(line: &[u8]) {
        CoreLog.make_writer().write_all(line).unwrap();
    }

    #[test]
    fn off_the_cores_each_line_is_written_as_it_comes() {
        thread::spawn(|| {
            log(b"{\"a\":1}\n");
            log(b"{\"b\":2}\n");
            assert_eq!(writes(), [b"{\"a\":1}\n".to_vec(), b"{\"b\":2}\n".to_vec()]);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_core_writes_its_lines_together_when_it_flushes() {
        thread::spawn(|| {
            crate::cores::become_core(1);
            log(b"one\n");
            log(b"two\n");
            assert!(writes().is_empty(), "nothing written before the flush");
            flush();
            assert_eq!(writes(), [b"one\ntwo\n".to_vec()]);
            flush();
            assert!(writes().is_empty(), "an empty buffer writes nothing");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_busy_core_writes_its_lines_once_they_pass_the_limit() {
        thread::spawn(|| {
            crate::cores::become_core(1);
            let line = [b"x".repeat(999), b"\n".to_vec()].concat();
            for _ in 0..LIMIT / line.len() {
                log(&line);
            }
            assert!(writes().is_empty());
            log(&line);
            let written = writes();
            assert_eq!(written.len(), 1);
            assert_eq!(written[0].len(), (LIMIT / line.len() + 1) * line.len());
            assert!(written[0].ends_with(b"\n"), "whole lines only");
        })
        .join()
        .unwrap();
    }
}
