//! The log's line format: one JSON object per event, fields flattened.
//!
//! It writes what tracing-subscriber's `json().flatten_event(true)` writes
//! (`timestamp`, `level`, the event's fields, `target`), but into a byte
//! buffer, and hands the line to the subscriber's writer in one piece.
//! tracing-subscriber's JSON format serializes through an adaptor that
//! turns every fragment serde_json writes (each quote, colon and comma)
//! into a UTF-8 check and a dynamic `fmt::Write` call: measured with
//! callgrind, formatting the delivery line took 19.8k instructions there
//! and 5.4k here (docs/BENCHMARKS.md, finding 6), 4.1k since the timestamp
//! (`super::timestamp`) and the strings (`crate::json_string`, which
//! copies a string that needs no escaping whole) are written without
//! serde_json; numbers and formatted values still go through it.

use std::fmt;
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::json_string::push_str;

/// A delivery line is about 300 bytes; a line that grows past this keeps
/// growing, the buffer is only where it starts.
const LINE_CAPACITY: usize = 512;

/// Formats each event as one flat JSON object on one line.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonLine;

impl<S, N> FormatEvent<S, N> for JsonLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let line = format_line(event, SystemTime::now());
        // The line is valid UTF-8 (strings copied whole are `&str`, the
        // rest is serde_json's); the check is one pass over a few hundred
        // bytes and keeps this module free of `unsafe`.
        writer.write_str(std::str::from_utf8(&line).map_err(|_| fmt::Error)?)
    }
}

/// The line for `event` at time `now`, newline included.
fn format_line(event: &Event<'_>, now: SystemTime) -> Vec<u8> {
    // Events bridged from the `log` crate carry their real target and
    // level in fields; tracing-subscriber's formats show those, so does this.
    let normalized = event.normalized_metadata();
    let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());

    let mut line = Vec::with_capacity(LINE_CAPACITY);
    line.extend_from_slice(b"{\"timestamp\":\"");
    super::timestamp::push(&mut line, now);
    line.extend_from_slice(b"\",\"level\":");
    push_str(&mut line, meta.level().as_str());
    event.record(&mut Fields { line: &mut line });
    line.extend_from_slice(b",\"target\":");
    push_str(&mut line, meta.target());
    line.extend_from_slice(b"}\n");
    line
}

/// Writes each field as `,"name":value`.
struct Fields<'a> {
    line: &'a mut Vec<u8>,
}

impl Fields<'_> {
    /// Writes `,"name":`, for the value that follows.
    fn name(&mut self, field: &Field) {
        self.line.push(b',');
        push_str(self.line, field.name());
        self.line.push(b':');
    }

    fn field<T: serde::Serialize + ?Sized>(&mut self, field: &Field, value: &T) {
        self.name(field);
        push_json(self.line, value);
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.name(field);
        push_str(self.line, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.field(field, &value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.field(field, &value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.field(field, &value);
    }

    /// serde_json writes a non-finite number as `null`.
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.field(field, &value);
    }

    /// `Display` (`%`) and `Debug` (`?`) values, and the message, become
    /// JSON strings, escaped as they are formatted.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, &format_args!("{value:?}"));
    }
}

/// Appends `value` as JSON. Serializing a string, a number or formatted
/// text into a Vec has no error to report.
fn push_json<T: serde::Serialize + ?Sized>(line: &mut Vec<u8>, value: &T) {
    let _ = serde_json::to_writer(line, value);
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, UNIX_EPOCH};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    /// The line `emit`'s one event formats to, at the time `now`.
    fn capture_line_at(now: SystemTime, emit: impl FnOnce()) -> String {
        struct AtTime(SystemTime, Arc<Mutex<String>>);
        impl<S: Subscriber> tracing_subscriber::Layer<S> for AtTime {
            fn on_event(&self, event: &Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
                let line = format_line(event, self.0);
                self.1
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8(line).unwrap());
            }
        }
        let out = Arc::new(Mutex::new(String::new()));
        let subscriber = tracing_subscriber::registry().with(AtTime(now, out.clone()));
        tracing::subscriber::with_default(subscriber, emit);
        out.lock().unwrap().clone()
    }

    /// `emit`'s one event, formatted now and parsed back.
    fn json_of(emit: impl FnOnce()) -> serde_json::Value {
        let line = capture_line_at(SystemTime::now(), emit);
        assert!(line.ends_with('\n'), "{line:?}");
        assert_eq!(line.lines().count(), 1, "{line:?}");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    #[test]
    fn every_field_kind_is_written_as_json_with_timestamp_level_and_target() {
        let line = json_of(|| {
            tracing::warn!(
                target: "hookgate::delivery",
                provider = "stripe",
                key = Some("evt_1"),
                upstream_status = Some(200u16),
                missing = None::<&str>,
                delta = -3i64,
                duration_ms = 1.25f64,
                nan = f64::NAN,
                ok = true,
                shown = %"dis\"play",
                debugged = ?vec![1, 2],
                "delivery {}",
                7
            );
        });
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["target"], "hookgate::delivery");
        assert_eq!(line["message"], "delivery 7");
        assert_eq!(line["provider"], "stripe");
        assert_eq!(line["key"], "evt_1");
        assert_eq!(line["upstream_status"], 200);
        assert!(line.get("missing").is_none(), "{line}");
        assert_eq!(line["delta"], -3);
        assert_eq!(line["duration_ms"], 1.25);
        assert!(line["nan"].is_null());
        assert_eq!(line["ok"], true);
        assert_eq!(line["shown"], "dis\"play");
        assert_eq!(line["debugged"], "[1, 2]");
        let timestamp = line["timestamp"].as_str().unwrap();
        let parsed = humantime::parse_rfc3339(timestamp).unwrap();
        let age = SystemTime::now().duration_since(parsed).unwrap();
        assert!(age < Duration::from_secs(60), "{timestamp}");
    }

    #[test]
    fn strings_that_need_escaping_round_trip() {
        let nasty: String = (0u32..0x80)
            .filter_map(char::from_u32)
            .chain(['\u{2028}', '\u{fffd}', 'é', '😀'])
            .collect();
        let line = json_of(|| tracing::info!(key = nasty.as_str(), "{}", nasty));
        assert_eq!(line["key"], nasty.as_str());
        assert_eq!(line["message"], nasty.as_str());
    }

    #[test]
    fn a_clock_before_1970_logs_the_epoch_instead_of_panicking() {
        let before = UNIX_EPOCH - Duration::from_secs(5);
        let line = capture_line_at(before, || tracing::info!("at a time"));
        assert!(
            line.starts_with("{\"timestamp\":\"1970-01-01T00:00:00.000000Z\",\"level\":\"INFO\""),
            "{line}"
        );
        assert!(
            line.ends_with("\"target\":\"hookgate::telemetry::json_line::tests\"}\n"),
            "{line}"
        );
    }
}
