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
    fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields, MakeWriter, format::Writer},
    registry::LookupSpan,
};

use crate::settings::LogFormat;

/// The verbosity from which the libraries' own debug output shows, as `-v 8` shows client-go's
/// request details upstream.
const LIBRARIES_VERBOSE_FROM: u8 = 8;

/// Sets up logging to stderr in `format` at `verbosity`.
pub(crate) fn init(verbosity: u8, format: LogFormat) {
    let (subscriber, set_verbosity) = subscriber(filter(verbosity), format, std::io::stderr);
    if tracing::subscriber::set_global_default(subscriber).is_ok() {
        let _ = VERBOSITY.set(set_verbosity);
    }
}

/// Changes the verbosity of the agent's own crates to klog's `-v` `verbosity` while it runs
/// (upstream's `/debug/flags/v`); an error when logging was not set up.
pub(crate) fn set_verbosity(verbosity: u8) -> Result<(), String> {
    let set = VERBOSITY.get().ok_or("logging is not set up")?;
    set(verbosity)
}

/// What changes the verbosity of the global subscriber [`init`] set.
type SetVerbosity = Box<dyn Fn(u8) -> Result<(), String> + Send + Sync>;

static VERBOSITY: std::sync::OnceLock<SetVerbosity> = std::sync::OnceLock::new();

/// A subscriber writing `format`'s lines to `writer`, and what changes its filter to a verbosity.
fn subscriber<W>(filter: EnvFilter, format: LogFormat, writer: W) -> (Box<dyn Subscriber + Send + Sync>, SetVerbosity)
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    match format {
        LogFormat::Text => {
            let builder = builder.fmt_fields(KeyValues::Klog).event_format(Klog).with_filter_reloading();
            let handle = builder.reload_handle();
            (Box::new(builder.finish()), Box::new(move |v| reload(&handle, v)))
        }
        LogFormat::Json => {
            let builder = builder.fmt_fields(KeyValues::Json).event_format(ComponentBaseJson).with_filter_reloading();
            let handle = builder.reload_handle();
            (Box::new(builder.finish()), Box::new(move |v| reload(&handle, v)))
        }
    }
}

fn reload<S>(handle: &tracing_subscriber::reload::Handle<EnvFilter, S>, verbosity: u8) -> Result<(), String> {
    handle.reload(EnvFilter::new(directives(verbosity))).map_err(|err| err.to_string())
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

/// How spans' fields are kept with each span for the lines inside it: as klog's `key="value"`
/// pairs, or as JSON members (`"key":value`) for component-base's lines.
#[derive(Clone, Copy)]
enum KeyValues {
    Klog,
    Json,
}

impl KeyValues {
    /// What goes between two fields, and between a span's fields and those recorded later.
    fn separator(self) -> char {
        match self {
            KeyValues::Klog => ' ',
            KeyValues::Json => ',',
        }
    }
}

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

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if !current.fields.is_empty() {
            current.fields.push(self.separator());
        }
        self.format_fields(current.as_writer(), fields)
    }
}

impl<'writer> MakeVisitor<Writer<'writer>> for KeyValues {
    type Visitor = SpanFieldWriter<'writer>;

    fn make_visitor(&self, target: Writer<'writer>) -> Self::Visitor {
        SpanFieldWriter { format: *self, writer: target, fields: Fields::default() }
    }
}

/// Writes a span's fields in its [`KeyValues`] format.
struct SpanFieldWriter<'writer> {
    format: KeyValues,
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

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.record_f64(field, value);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.fields.record_error(field, value);
    }
}

impl VisitOutput<fmt::Result> for SpanFieldWriter<'_> {
    fn finish(mut self) -> fmt::Result {
        // The first without a separator: `add_fields` puts one between fields recorded later
        // and those before.
        for (i, (key, value)) in self.fields.pairs.iter().enumerate() {
            if i > 0 {
                self.writer.write_char(self.format.separator())?;
            }
            match self.format {
                KeyValues::Klog => write!(self.writer, "{key}={}", klog_value(value))?,
                KeyValues::Json => write!(self.writer, "{}:{value}", Value::from(key.as_str()))?,
            }
        }
        Ok(())
    }
}

/// The fields of the spans an event is in, outermost first, as written by [`KeyValues`] and
/// joined by its separator.
fn span_fields<S, N>(ctx: &FmtContext<'_, S, N>, separator: char) -> String
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
                text.push(separator);
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
        let spans = span_fields(ctx, KeyValues::Klog.separator());
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
        writer.write_char('{')?;
        for (i, (key, value)) in line.iter().enumerate() {
            let separator = if i == 0 { "" } else { "," };
            write!(writer, "{separator}{}:{value}", Value::from(key.as_str()))?;
        }
        // The spans' members, written as JSON by [`KeyValues::Json`] when the span was made.
        let spans = span_fields(ctx, KeyValues::Json.separator());
        if !spans.is_empty() {
            write!(writer, ",{spans}")?;
        }
        writer.write_str("}\n")
    }
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

    /// The lines written while `log` runs, in `format` at debug.
    fn lines_of(format: LogFormat, log: impl FnOnce()) -> Vec<String> {
        let buffer = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u8>::new()));
        let sink = buffer.clone();
        let writer = move || SharedBuffer(sink.clone());
        let (subscriber, _) = subscriber(EnvFilter::new("debug"), format, writer);
        tracing::subscriber::with_default(subscriber, log);
        let text = String::from_utf8(buffer.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    struct SharedBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for SharedBuffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Logs a line inside two spans, one with a field recorded after it was made.
    fn in_spans() {
        let pod = tracing::info_span!("pod", pod.uid = "a1", pod.name = "web \"x\" = y");
        let _pod = pod.enter();
        let attempt = tracing::info_span!("attempt", attempt = 3, outcome = tracing::field::Empty);
        attempt.record("outcome", "retry");
        let _attempt = attempt.enter();
        tracing::warn!(container = "app", "Back-off restarting");
    }

    #[test]
    fn span_fields_are_json_members_in_json_lines() {
        let lines = lines_of(LogFormat::Json, in_spans);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line: serde_json::Map<String, Value> = serde_json::from_str(&lines[0]).unwrap();
        let keys = ["ts", "caller", "msg", "v", "container", "pod.uid", "pod.name", "attempt", "outcome"];
        assert_eq!(line.len(), keys.len(), "{}", lines[0]);
        let positions: Vec<usize> = keys.iter().map(|key| lines[0].find(&format!("\"{key}\":")).unwrap()).collect();
        assert!(positions.is_sorted(), "keys out of component-base's order: {}", lines[0]);
        assert_eq!(line["pod.name"], "web \"x\" = y");
        assert_eq!(line["attempt"], 3);
        assert_eq!(line["outcome"], "retry");
    }

    #[test]
    fn span_fields_are_klog_pairs_in_text_lines() {
        let lines = lines_of(LogFormat::Text, in_spans);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with('W'), "{}", lines[0]);
        assert!(
            lines[0].ends_with(
                r#"] "Back-off restarting" container="app" pod.uid="a1" pod.name="web \"x\" = y" attempt=3 outcome="retry""#
            ),
            "{}",
            lines[0]
        );
    }
}
