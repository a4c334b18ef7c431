//! The agent's log output, as upstream's kubelet writes it: klog's text lines
//! (`I1125 16:21:39.123456    1234 pod_workers.rs:123] "Started container" pod="web"`) or, with
//! `--logging-format=json`, component-base's JSON lines (`ts`, `caller`, `msg`, `v`, `err`).
//!
//! `--v` is the agent's own verbosity, as klog's `-v` is the kubelet's: its crates log at the
//! level it names, while the libraries under them (hyper, h2, rustls, tower, kube) stay at info
//! until `-v 8`; `RUST_LOG`, when set, decides alone.

use std::fmt;

use serde_json::Value;
use tracing::{Event, Level, Subscriber, field::Field};
use tracing_subscriber::{
    EnvFilter,
    field::{MakeVisitor, Visit, VisitOutput},
    fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, format::Writer},
    registry::LookupSpan,
};

use crate::settings::LogFormat;

/// The verbosity from which the libraries' own debug output shows, as `-v 8` shows client-go's
/// request details upstream.
const LIBRARIES_VERBOSE_FROM: u8 = 8;

/// Sets up logging to stderr in `format` at `verbosity`.
pub(crate) fn init(verbosity: u8, format: LogFormat) {
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter(verbosity)).with_writer(std::io::stderr).fmt_fields(KeyValues);
    let _ = match format {
        LogFormat::Text => builder.event_format(Klog).try_init(),
        LogFormat::Json => builder.event_format(ComponentBaseJson).try_init(),
    };
}

/// `RUST_LOG` when set; else the agent's crates (all named `kubelet…`) at `verbosity`'s level and
/// the libraries at info, or at that level too from [`LIBRARIES_VERBOSE_FROM`].
fn filter(verbosity: u8) -> EnvFilter {
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    EnvFilter::new(directives(verbosity))
}

fn directives(verbosity: u8) -> String {
    let level = match verbosity {
        0 | 1 => "info",
        2..=4 => "debug",
        _ => "trace",
    };
    if verbosity >= LIBRARIES_VERBOSE_FROM { level.to_owned() } else { format!("info,kubelet={level}") }
}

/// klog's severity letter; its verbosity levels are all `I`.
fn severity(level: Level) -> char {
    match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    }
}

/// The verbosity a component-base JSON line carries for `level` (none for errors).
fn json_verbosity(level: Level) -> Option<u8> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(2),
        Level::TRACE => Some(5),
    }
}

/// An event's message and fields; `error` is renamed `err`, upstream's key.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: Vec<(String, Value)>,
}

impl Fields {
    fn of(event: &Event<'_>) -> Self {
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields
    }

    fn push(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = match value {
                Value::String(text) => text,
                other => other.to_string(),
            };
            return;
        }
        let key = match field.name() {
            "error" => "err",
            name => name,
        };
        self.pairs.push((key.to_owned(), value));
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, Value::from(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.push(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.push(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.push(field, Value::from(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.push(field, Value::from(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.push(field, Value::from(kubelet_core::ErrorChain(value).to_string()));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, Value::from(format!("{value:?}")));
    }
}

/// A value as klog writes it: strings quoted, numbers and booleans bare.
fn klog_value(value: &Value) -> String {
    match value {
        Value::String(text) => format!("{text:?}"),
        other => other.to_string(),
    }
}

/// Spans' fields as `key="value"` pairs, kept with each span for the lines inside it.
struct KeyValues;

impl<'writer> FormatFields<'writer> for KeyValues {
    fn format_fields<R: tracing_subscriber::field::RecordFields>(
        &self,
        writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = self.make_visitor(writer);
        fields.record(&mut visitor);
        visitor.finish()
    }
}

impl<'writer> MakeVisitor<Writer<'writer>> for KeyValues {
    type Visitor = SpanFieldWriter<'writer>;

    fn make_visitor(&self, target: Writer<'writer>) -> Self::Visitor {
        SpanFieldWriter { writer: target, fields: Fields::default() }
    }
}

/// Writes a span's fields as klog pairs.
struct SpanFieldWriter<'writer> {
    writer: Writer<'writer>,
    fields: Fields,
}

impl Visit for SpanFieldWriter<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.fields.record_debug(field, value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.fields.record_str(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.record_i64(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.record_u64(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.record_bool(field, value);
    }
}

impl VisitOutput<fmt::Result> for SpanFieldWriter<'_> {
    fn finish(mut self) -> fmt::Result {
        // Separated by spaces, the first without one: the formatter puts a space between
        // fields recorded later and those before.
        for (i, (key, value)) in self.fields.pairs.iter().enumerate() {
            let separator = if i == 0 { "" } else { " " };
            write!(self.writer, "{separator}{key}={}", klog_value(value))?;
        }
        Ok(())
    }
}

/// The fields of the spans an event is in, outermost first, as written by [`KeyValues`] and
/// separated by spaces.
fn span_fields<S, N>(ctx: &FmtContext<'_, S, N>) -> String
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    let mut text = String::new();
    if let Some(scope) = ctx.event_scope() {
        for span in scope.from_root() {
            let extensions = span.extensions();
            let Some(fields) = extensions.get::<FormattedFields<N>>().filter(|f| !f.is_empty()) else { continue };
            if !text.is_empty() {
                text.push(' ');
            }
            text.push_str(fields);
        }
    }
    text
}

/// The base name of an event's source file and its line (`pod_workers.rs:123`).
fn caller(event: &Event<'_>) -> String {
    let metadata = event.metadata();
    let file = metadata.file().map(|f| f.rsplit('/').next().unwrap_or(f)).unwrap_or("???");
    format!("{file}:{}", metadata.line().unwrap_or(0))
}

/// klog's text lines.
struct Klog;

impl<S, N> FormatEvent<S, N> for Klog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let now = k8s_openapi::jiff::Zoned::now();
        let fields = Fields::of(event);
        write!(
            writer,
            "{}{} {:>7} {}] {:?}",
            severity(*event.metadata().level()),
            now.strftime("%m%d %H:%M:%S%.6f"),
            std::process::id(),
            caller(event),
            fields.message,
        )?;
        for (key, value) in &fields.pairs {
            write!(writer, " {key}={}", klog_value(value))?;
        }
        let spans = span_fields(ctx);
        if !spans.is_empty() {
            write!(writer, " {spans}")?;
        }
        writeln!(writer)
    }
}

/// component-base's JSON lines: `ts` (milliseconds since the epoch), `caller`, `msg`, `v`
/// (not on errors), then the fields, `err` among them.
struct ComponentBaseJson;

impl<S, N> FormatEvent<S, N> for ComponentBaseJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let fields = Fields::of(event);
        let millis = kubelet_core::clock::wall_now().as_microsecond() as f64 / 1000.0;
        // Written key by key, in component-base's order.
        let mut line = vec![
            ("ts".to_owned(), Value::from(millis)),
            ("caller".to_owned(), Value::from(caller(event))),
            ("msg".to_owned(), Value::from(fields.message)),
        ];
        if let Some(v) = json_verbosity(*event.metadata().level()) {
            line.push(("v".to_owned(), Value::from(v)));
        }
        line.extend(fields.pairs);
        line.extend(span_pairs(&span_fields(ctx)));
        writer.write_char('{')?;
        for (i, (key, value)) in line.iter().enumerate() {
            let separator = if i == 0 { "" } else { "," };
            write!(writer, "{separator}{}:{value}", Value::from(key.as_str()))?;
        }
        writer.write_str("}\n")
    }
}

/// The `key="value"` pairs [`KeyValues`] wrote, read back for a JSON line.
fn span_pairs(text: &str) -> Vec<(String, Value)> {
    let mut pairs = Vec::new();
    let mut rest = text.trim_start();
    while let Some((key, after)) = rest.split_once('=') {
        let (value, remaining) = match after.strip_prefix('"') {
            Some(quoted) => {
                let end = closing_quote(quoted).unwrap_or(quoted.len());
                let value: Value = serde_json::from_str(&after[..end + 2]).unwrap_or(Value::from(&quoted[..end]));
                (value, &quoted[(end + 1).min(quoted.len())..])
            }
            None => {
                let end = after.find(' ').unwrap_or(after.len());
                let value = serde_json::from_str(&after[..end]).unwrap_or(Value::from(&after[..end]));
                (value, &after[end..])
            }
        };
        pairs.push((key.to_owned(), value));
        rest = remaining.trim_start();
    }
    pairs
}

/// Where a quoted string (after its opening quote) ends, escapes skipped.
fn closing_quote(quoted: &str) -> Option<usize> {
    let mut escaped = false;
    for (i, c) in quoted.char_indices() {
        match (escaped, c) {
            (true, _) => escaped = false,
            (false, '\\') => escaped = true,
            (false, '"') => return Some(i),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_libraries_stay_at_info_until_v8() {
        assert_eq!(directives(0), "info,kubelet=info");
        assert_eq!(directives(2), "info,kubelet=debug");
        assert_eq!(directives(6), "info,kubelet=trace");
        assert_eq!(directives(8), "trace");
    }

    #[test]
    fn span_fields_read_back_as_json_values() {
        let pairs = span_pairs(r#" pod.uid="a1" pod.name="web \"x\"" attempt=3"#);
        assert_eq!(
            pairs,
            [
                ("pod.uid".to_owned(), Value::from("a1")),
                ("pod.name".to_owned(), Value::from("web \"x\"")),
                ("attempt".to_owned(), Value::from(3)),
            ]
        );
    }
}
