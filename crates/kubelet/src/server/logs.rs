//! Container logs in the CRI format: `<RFC 3339 time> <stdout|stderr> <P|F> <content>` per line,
//! where `P` marks a partial line the runtime split and `F` the end of one.
//!
//! A container's logs live in `<pod log dir>/<container>/<restart>.log`; the kubelet's log
//! rotation renames a full file to `<restart>.log.<timestamp>` and starts a new one, so one
//! container instance's logs are its rotated files in name order, then the live file.
//!
//! A read is upstream's `ReadLogs`: `tailLines` finds its start by reading back from the end of
//! the files, `limitBytes` cuts the output, `sinceSeconds`/`sinceTime` skip older lines, and the
//! rest is streamed a chunk at a time, as bytes, whatever the container wrote; `follow` goes on
//! from where the read ended, into a rotated file's successor, until a newer instance starts.

use std::{
    io,
    path::{Path, PathBuf},
    time::Duration,
};

use axum::body::Bytes;
use k8s_openapi::jiff::Timestamp;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncSeekExt, BufReader};

/// What a read of a container's logs is asked for (upstream's `LogOptions`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LogOptions {
    /// The last lines of the log to start from (`tailLines`); all of it when `None`.
    pub tail: Option<u64>,
    /// At most this many bytes of output (`limitBytes`).
    pub limit_bytes: Option<u64>,
    /// Lines stamped before this are skipped (`sinceSeconds`, `sinceTime`).
    pub since: Option<Timestamp>,
    /// Each line starts with the runtime's timestamp (`timestamps`).
    pub timestamps: bool,
    /// Goes on with what the container writes next (`follow`).
    pub follow: bool,
}

/// The longest raw line read as one; a longer one is cut into pieces of this size. The runtime
/// splits what a container writes into lines of at most 16 KiB.
const MAX_RAW_LINE: usize = 1 << 20;
/// Output is sent in chunks of about this size.
const CHUNK: usize = 64 * 1024;
/// How often a followed log file is checked for new output.
const FOLLOW_PERIOD: Duration = Duration::from_millis(200);
/// How often a follower checks that its container still runs (upstream's `stateCheckPeriod`).
const STATE_CHECK_PERIOD: Duration = Duration::from_secs(5);

/// One raw line of a CRI log file, split.
#[derive(Debug, PartialEq, Eq)]
struct RawLine<'a> {
    /// As the runtime wrote it (RFC 3339 with nanoseconds).
    timestamp: &'a [u8],
    /// A piece of a line the runtime split (`P`), not its end (`F`).
    partial: bool,
    /// Without the newline.
    content: &'a [u8],
}

/// `line` split, `None` when it is not in the CRI format (`<time> <stdout|stderr> <P|F> <content>`).
fn parse_raw(line: &[u8]) -> Option<RawLine<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let timestamp = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or_default();
    if !matches!(stream, b"stdout" | b"stderr") {
        return None;
    }
    // The tag may carry more flags after `P`/`F`, separated by `:`.
    let partial = match tag.split(|b| *b == b':').next()? {
        b"P" => true,
        b"F" => false,
        _ => return None,
    };
    Some(RawLine { timestamp, partial, content })
}

/// Whether a read goes on after a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// More may be written.
    More,
    /// `limitBytes` is reached.
    Limit,
}

/// Writes a log's raw lines as `kubectl logs` shows them (upstream's `logWriter`): a partial
/// piece as it comes, the timestamp before the first piece of a line when asked, lines stamped
/// before `since` skipped, and the whole cut at `limitBytes`. A line not in the CRI format is
/// shown as it is.
#[derive(Debug)]
pub(crate) struct LogWriter {
    since: Option<Timestamp>,
    timestamps: bool,
    remaining: Option<u64>,
    at_line_start: bool,
}

impl LogWriter {
    pub(crate) fn new(options: &LogOptions) -> Self {
        LogWriter {
            since: options.since,
            timestamps: options.timestamps,
            remaining: options.limit_bytes,
            at_line_start: true,
        }
    }

    /// Appends what `raw` (one raw line, its newline included when it has one) shows to `out`.
    pub(crate) fn write(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Flow {
        if self.remaining == Some(0) {
            return Flow::Limit;
        }
        let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
        let (timestamp, content, newline) = match parse_raw(raw) {
            Some(line) => (Some(line.timestamp), line.content, !line.partial),
            None => (None, raw, true),
        };
        if let (Some(since), Some(stamp)) = (self.since, timestamp.and_then(parse_timestamp))
            && stamp < since
        {
            return Flow::More;
        }
        let start = out.len();
        if self.timestamps
            && self.at_line_start
            && let Some(stamp) = timestamp
        {
            out.extend_from_slice(stamp);
            out.push(b' ');
        }
        out.extend_from_slice(content);
        if newline {
            out.push(b'\n');
        }
        self.at_line_start = newline;
        let Some(remaining) = self.remaining.as_mut() else { return Flow::More };
        let written = (out.len() - start) as u64;
        if written >= *remaining {
            out.truncate(start + usize::try_from(*remaining).unwrap_or(usize::MAX));
            *remaining = 0;
            return Flow::Limit;
        }
        *remaining -= written;
        Flow::More
    }
}

/// A CRI timestamp (RFC 3339 with nanoseconds).
fn parse_timestamp(text: &[u8]) -> Option<Timestamp> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Where a read starts: a file of the instance and an offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Start {
    pub file: usize,
    pub offset: u64,
}

/// Where the last `tail` raw lines of `files` (oldest first) start, read back from the end of
/// the newest file and into older ones as far as needed; the beginning without a `tail`.
pub(crate) async fn tail_start(files: &[PathBuf], tail: Option<u64>) -> io::Result<Start> {
    let Some(mut wanted) = tail else { return Ok(Start { file: 0, offset: 0 }) };
    for (index, path) in files.iter().enumerate().rev() {
        let mut file = tokio::fs::File::open(path).await?;
        let (offset, found) = last_lines_start(&mut file, wanted).await?;
        if found >= wanted || index == 0 {
            return Ok(Start { file: index, offset });
        }
        wanted -= found;
    }
    Ok(Start { file: 0, offset: 0 })
}

/// The offset where the last `wanted` lines of `file` start, and how many lines it found (fewer
/// than wanted only when the file has fewer, and then the offset is 0). A newline at the very end
/// ends the last line; it starts none.
async fn last_lines_start(file: &mut tokio::fs::File, wanted: u64) -> io::Result<(u64, u64)> {
    let length = file.metadata().await?.len();
    if wanted == 0 {
        return Ok((length, 0));
    }
    let mut block = vec![0u8; CHUNK];
    let mut end = length;
    let mut newlines = 0;
    let mut skip_final_newline = true;
    while end > 0 {
        let begin = end.saturating_sub(CHUNK as u64);
        let size = usize::try_from(end - begin).unwrap_or(CHUNK);
        file.seek(io::SeekFrom::Start(begin)).await?;
        file.read_exact(&mut block[..size]).await?;
        for (at, byte) in block[..size].iter().enumerate().rev() {
            if *byte != b'\n' {
                skip_final_newline = false;
                continue;
            }
            if std::mem::take(&mut skip_final_newline) {
                continue;
            }
            newlines += 1;
            if newlines == wanted {
                return Ok((begin + at as u64 + 1, wanted));
            }
        }
        end = begin;
    }
    let lines = if length == 0 { 0 } else { newlines + 1 };
    Ok((0, lines.min(wanted)))
}

/// Reads one raw line into `line` (cleared first), its newline included; a line longer than
/// `MAX_RAW_LINE` is cut. Returns how many bytes were read: 0 at the end of the file, and a line
/// without a newline when the file ends within it.
async fn read_raw_line(reader: &mut BufReader<tokio::fs::File>, line: &mut Vec<u8>) -> io::Result<usize> {
    let mut read = 0;
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(read);
        }
        let room = MAX_RAW_LINE.saturating_sub(line.len());
        let (taken, complete) = match available.iter().take(room).position(|b| *b == b'\n') {
            Some(newline) => (newline + 1, true),
            None => (available.len().min(room), room <= available.len()),
        };
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken);
        read += taken;
        if complete {
            return Ok(read);
        }
    }
}

/// Where a reader of a log sends its output; closed when the caller goes away.
pub(crate) type Sink = tokio::sync::mpsc::Sender<Result<Bytes, io::Error>>;

/// Whether the container whose logs are followed still runs, as the kubelet last saw it.
pub(crate) type StillRunning = Box<dyn Fn() -> bool + Send + Sync>;

/// Streams `files` (one instance's, oldest first) from `start` as `options` ask to `sink`, then
/// with `follow` what the live file (the last) gets next, until the caller goes away, the
/// container stops running (as upstream's `ReadLogs` ends) or a newer instance of it starts, or
/// `limitBytes` is reached.
pub(crate) async fn send(
    files: Vec<PathBuf>,
    start: Start,
    options: LogOptions,
    still_running: StillRunning,
    sink: Sink,
) {
    let writer = LogWriter::new(&options);
    let mut reader = LogReader { writer, out: Vec::with_capacity(CHUNK), sink, still_running };
    let result = reader.send_all(&files, start, options.follow).await;
    if let Err(error) = result {
        let _ = reader.sink.send(Err(error)).await;
    }
}

/// A read in progress: what it writes, and where to.
struct LogReader {
    writer: LogWriter,
    out: Vec<u8>,
    sink: Sink,
    still_running: StillRunning,
}

/// Why a read stopped early.
enum Stop {
    /// The caller went away, or `limitBytes` is reached.
    Done,
    /// A file could not be read.
    Failed(io::Error),
}

impl From<io::Error> for Stop {
    fn from(error: io::Error) -> Self {
        Stop::Failed(error)
    }
}

impl LogReader {
    async fn send_all(&mut self, files: &[PathBuf], start: Start, follow: bool) -> io::Result<()> {
        let result = self.read_files(files, start, follow).await;
        match result {
            Ok(()) | Err(Stop::Done) => {
                let _ = self.flush().await;
                Ok(())
            }
            Err(Stop::Failed(error)) => Err(error),
        }
    }

    async fn read_files(&mut self, files: &[PathBuf], start: Start, follow: bool) -> Result<(), Stop> {
        let Some(live) = files.last() else { return Ok(()) };
        let mut line = Vec::new();
        for (index, path) in files.iter().enumerate().skip(start.file) {
            let offset = if index == start.file { start.offset } else { 0 };
            let mut reader = open_at(path, offset).await?;
            while read_raw_line(&mut reader, &mut line).await? > 0 {
                let whole = line.ends_with(b"\n") || line.len() >= MAX_RAW_LINE;
                if !whole && follow && index == files.len() - 1 {
                    // The live file's last line is still being written: follow it from there.
                    return self.follow(live, reader, line).await;
                }
                self.write_line(&line).await?;
                line.clear();
            }
            if follow && index == files.len() - 1 {
                return self.follow(live, reader, line).await;
            }
        }
        Ok(())
    }

    /// Goes on reading `live` through `reader` (at its end, `pending` read of a line not yet
    /// ended), into its successor when it is rotated, until the container stops running or a
    /// newer instance starts (checked every `STATE_CHECK_PERIOD`, as upstream checks).
    async fn follow(
        &mut self,
        live: &Path,
        mut reader: BufReader<tokio::fs::File>,
        mut pending: Vec<u8>,
    ) -> Result<(), Stop> {
        use std::os::unix::fs::MetadataExt;
        let mut inode = reader.get_ref().metadata().await?.ino();
        let mut offset = position(&mut reader).await?;
        let mut tick = tokio::time::interval(FOLLOW_PERIOD);
        let mut state_checked = tokio::time::Instant::now();
        loop {
            self.flush().await?;
            tokio::select! {
                () = self.sink.closed() => return Err(Stop::Done),
                _ = tick.tick() => {}
            }
            offset += self.read_available(&mut reader, &mut pending).await?;
            if let Ok(now) = tokio::fs::metadata(live).await
                && (now.ino() != inode || now.len() < offset)
            {
                // Rotated (or cut short): what the old file got last is read (a line it left
                // unended too), then the new one from its beginning.
                self.read_available(&mut reader, &mut pending).await?;
                self.write_unended(&mut pending).await?;
                reader = open_at(live, 0).await?;
                inode = reader.get_ref().metadata().await?.ino();
                offset = 0;
            }
            if state_checked.elapsed() >= STATE_CHECK_PERIOD {
                state_checked = tokio::time::Instant::now();
                if !(self.still_running)() || newer_instance_started(live).await {
                    self.read_available(&mut reader, &mut pending).await?;
                    return self.write_unended(&mut pending).await;
                }
            }
        }
    }

    /// Writes what `pending` holds of a line the file did not end, if anything.
    async fn write_unended(&mut self, pending: &mut Vec<u8>) -> Result<(), Stop> {
        if pending.is_empty() {
            return Ok(());
        }
        let line = std::mem::take(pending);
        self.write_line(&line).await
    }

    /// Reads what `reader` has up to its end, writing each whole line; a line not yet ended
    /// stays in `pending`. Returns the bytes read.
    async fn read_available(
        &mut self,
        reader: &mut BufReader<tokio::fs::File>,
        pending: &mut Vec<u8>,
    ) -> Result<u64, Stop> {
        let mut total = 0;
        loop {
            let read = read_raw_line(reader, pending).await?;
            if read == 0 {
                return Ok(total);
            }
            total += read as u64;
            if pending.ends_with(b"\n") || pending.len() >= MAX_RAW_LINE {
                self.write_line(pending).await?;
                pending.clear();
            }
        }
    }

    async fn write_line(&mut self, raw: &[u8]) -> Result<(), Stop> {
        let flow = self.writer.write(raw, &mut self.out);
        if self.out.len() >= CHUNK {
            self.flush().await?;
        }
        match flow {
            Flow::More => Ok(()),
            Flow::Limit => Err(Stop::Done),
        }
    }

    async fn flush(&mut self) -> Result<(), Stop> {
        if self.out.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.out, Vec::with_capacity(CHUNK)));
        self.sink.send(Ok(chunk)).await.map_err(|_| Stop::Done)
    }
}

/// `path` opened and read from `offset`.
async fn open_at(path: &Path, offset: u64) -> io::Result<BufReader<tokio::fs::File>> {
    let mut file = tokio::fs::File::open(path).await?;
    file.seek(io::SeekFrom::Start(offset)).await?;
    Ok(BufReader::with_capacity(CHUNK, file))
}

/// Where `reader` is in its file: the file's position less what the reader holds unread.
async fn position(reader: &mut BufReader<tokio::fs::File>) -> io::Result<u64> {
    let unread = reader.buffer().len() as u64;
    Ok(reader.get_mut().stream_position().await?.saturating_sub(unread))
}

/// Whether the container directory of `live` has an instance newer than `live`'s.
async fn newer_instance_started(live: &Path) -> bool {
    let Some(dir) = live.parent().map(Path::to_owned) else { return false };
    let Ok(Ok(instances)) = tokio::task::spawn_blocking(move || instances(&dir)).await else { return false };
    let this = live.file_stem().and_then(|s| s.to_str()).and_then(|s| s.parse::<u32>().ok());
    instances.last().is_some_and(|newest| Some(*newest) != this)
}

/// The restart numbers with a log file in a container's log directory, ascending.
pub(crate) fn instances(container_dir: &Path) -> io::Result<Vec<u32>> {
    let mut found: Vec<u32> = std::fs::read_dir(container_dir)?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (number, rest) = name.split_once('.')?;
            rest.starts_with("log").then(|| number.parse().ok()).flatten()
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    Ok(found)
}

/// The files of one container instance, oldest first: rotated files (`N.log.<stamp>`, except
/// compressed ones) in name order, then the live `N.log`.
pub(crate) fn instance_files(container_dir: &Path, restart: u32) -> io::Result<Vec<PathBuf>> {
    let live = format!("{restart}.log");
    let rotated_prefix = format!("{live}.");
    let mut rotated: Vec<PathBuf> = std::fs::read_dir(container_dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(&rotated_prefix) && !name.ends_with(".gz") && !name.ends_with(".tmp"))
        .map(|name| container_dir.join(name))
        .collect();
    rotated.sort();
    let live = container_dir.join(live);
    if live.exists() {
        rotated.push(live);
    }
    Ok(rotated)
}

/// The files to read for `kubectl logs`: the newest instance's, or with `previous` the one
/// before it. An error names what is missing.
pub(crate) fn files_for(container_dir: &Path, previous: bool) -> io::Result<Vec<PathBuf>> {
    let instances = instances(container_dir)?;
    let pick = if previous { instances.iter().rev().nth(1) } else { instances.last() };
    match pick {
        Some(restart) => instance_files(container_dir, *restart),
        None if previous => Err(io::Error::new(io::ErrorKind::NotFound, "no previous terminated container instance")),
        None => Err(io::Error::new(io::ErrorKind::NotFound, "the container has no logs yet")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };

    use super::*;

    /// What `options` show of `text`'s raw lines, read as one.
    fn shown(text: &str, options: &LogOptions) -> String {
        let mut writer = LogWriter::new(options);
        let mut out = Vec::new();
        for line in text.split_inclusive('\n') {
            if writer.write(line.as_bytes(), &mut out) == Flow::Limit {
                break;
            }
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn partial_pieces_are_shown_as_they_come_with_one_timestamp_per_line() {
        let text = "2026-11-22T10:00:00.000000001Z stdout P hello \n\
                    2026-11-22T10:00:00.000000002Z stdout F world\n\
                    2026-11-22T10:00:00.000000003Z stderr F oops\n\
                    2026-11-22T10:00:00.000000004Z stdout F \n\
                    not a cri line\n";
        assert_eq!(shown(text, &LogOptions::default()), "hello world\noops\n\nnot a cri line\n");
        let stamped = LogOptions { timestamps: true, ..LogOptions::default() };
        assert_eq!(
            shown(text, &stamped),
            "2026-11-22T10:00:00.000000001Z hello world\n2026-11-22T10:00:00.000000003Z oops\n\
             2026-11-22T10:00:00.000000004Z \nnot a cri line\n"
        );
    }

    #[test]
    fn raw_lines_parse_or_not() {
        let line = |timestamp: &'static str, partial, content: &'static str| {
            Some(RawLine { timestamp: timestamp.as_bytes(), partial, content: content.as_bytes() })
        };
        assert_eq!(parse_raw(b"t stdout F x y"), line("t", false, "x y"));
        assert_eq!(parse_raw(b"t stderr P:extra x"), line("t", true, "x"));
        assert_eq!(parse_raw(b"t stdout F"), line("t", false, ""));
        assert_eq!(parse_raw(b"t stdin F x"), None);
        assert_eq!(parse_raw(b"t stdout Q x"), None);
        assert_eq!(parse_raw(b"garbage"), None);
    }

    #[test]
    fn since_skips_older_lines_and_limit_bytes_cuts_the_output() {
        let text = "2026-11-22T10:00:01Z stdout F one\n2026-11-22T10:00:02Z stdout F two\n\
                    2026-11-22T10:00:03Z stdout F three\n";
        let since = LogOptions { since: Some("2026-11-22T10:00:02Z".parse().unwrap()), ..LogOptions::default() };
        assert_eq!(shown(text, &since), "two\nthree\n");
        for (limit, expected) in [(1, "o"), (4, "one\n"), (6, "one\ntw"), (100, "one\ntwo\nthree\n")] {
            let limited = LogOptions { limit_bytes: Some(limit), ..LogOptions::default() };
            assert_eq!(shown(text, &limited), expected, "limitBytes {limit}");
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_pass_through_and_hide_nothing() {
        let mut raw = b"2026-11-22T10:00:01Z stdout F before\n".to_vec();
        raw.extend(b"2026-11-22T10:00:02Z stdout F \xff\xfe binary\n");
        raw.extend(b"2026-11-22T10:00:03Z stdout F after\n");
        let mut writer = LogWriter::new(&LogOptions::default());
        let mut out = Vec::new();
        for line in raw.split_inclusive(|b| *b == b'\n') {
            writer.write(line, &mut out);
        }
        assert_eq!(out, b"before\n\xff\xfe binary\nafter\n");
    }

    async fn write_files(dir: &Path, contents: &[&str]) -> Vec<PathBuf> {
        let mut files = Vec::new();
        for (i, content) in contents.iter().enumerate() {
            let path = dir.join(format!("0.log.{i}"));
            tokio::fs::write(&path, content).await.unwrap();
            files.push(path);
        }
        files
    }

    #[tokio::test]
    async fn tail_lines_are_found_from_the_end_and_into_older_files() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_files(dir.path(), &["a\nb\n", "c\nd\ne\n", ""]).await;
        for (tail, expected) in [
            (Some(0), Start { file: 2, offset: 0 }),
            (Some(1), Start { file: 1, offset: 4 }),
            (Some(3), Start { file: 1, offset: 0 }),
            (Some(4), Start { file: 0, offset: 2 }),
            (Some(100), Start { file: 0, offset: 0 }),
            (None, Start { file: 0, offset: 0 }),
        ] {
            assert_eq!(tail_start(&files, tail).await.unwrap(), expected, "tail {tail:?}");
        }
        let unended = write_files(dir.path(), &["a\nb\nc"]).await;
        assert_eq!(tail_start(&unended, Some(1)).await.unwrap(), Start { file: 0, offset: 4 }, "c is a line");
        assert_eq!(tail_start(&unended, Some(2)).await.unwrap(), Start { file: 0, offset: 2 });
    }

    #[tokio::test]
    async fn tail_reads_back_across_blocks() {
        let dir = tempfile::tempdir().unwrap();
        let line = format!("{}\n", "x".repeat(999));
        let files = write_files(dir.path(), &[&line.repeat(300)]).await;
        let start = tail_start(&files, Some(150)).await.unwrap();
        assert_eq!(start, Start { file: 0, offset: 150 * 1000 });
    }

    /// What `send` streams of `files` from `start` with `options`, the caller reading all.
    async fn sent(files: Vec<PathBuf>, start: Start, options: LogOptions) -> Vec<u8> {
        let (sink, mut chunks) = tokio::sync::mpsc::channel(4);
        tokio::spawn(send(files, start, options, Box::new(|| true), sink));
        let mut out = Vec::new();
        while let Some(chunk) = chunks.recv().await {
            out.extend(chunk.unwrap());
        }
        out
    }

    #[tokio::test]
    async fn a_read_streams_every_file_from_its_start_and_an_unended_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let files = write_files(dir.path(), &["t stdout F a\nt stdout F b\n", "t stdout F c\nt stdout P d"]).await;
        let start = tail_start(&files, Some(2)).await.unwrap();
        assert_eq!(sent(files.clone(), start, LogOptions::default()).await, b"c\nd");
        assert_eq!(sent(files, Start { file: 0, offset: 0 }, LogOptions::default()).await, b"a\nb\nc\nd");
    }

    /// A follower of `live` from its start, told the container runs while `running` holds.
    struct Follower {
        chunks: tokio::sync::mpsc::Receiver<Result<Bytes, io::Error>>,
        out: Vec<u8>,
    }

    impl Follower {
        fn start(live: &Path, running: Arc<AtomicBool>) -> Self {
            let (sink, chunks) = tokio::sync::mpsc::channel(4);
            let options = LogOptions { follow: true, ..LogOptions::default() };
            let still_running = Box::new(move || running.load(Ordering::SeqCst));
            tokio::spawn(send(vec![live.to_owned()], Start { file: 0, offset: 0 }, options, still_running, sink));
            Follower { chunks, out: Vec::new() }
        }

        /// All it has sent once what it sent ends with `end` (at most a minute of the test's
        /// paused clock).
        async fn until(&mut self, end: &[u8]) -> String {
            while !self.out.ends_with(end) {
                let chunk = tokio::time::timeout(Duration::from_secs(60), self.chunks.recv()).await;
                self.out.extend(chunk.unwrap().expect("the follower went on").unwrap());
            }
            String::from_utf8_lossy(&self.out).into_owned()
        }

        /// Whether it ends (its stream closes) within `wait`, after anything left to send.
        async fn ends_within(&mut self, wait: Duration) -> bool {
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                match tokio::time::timeout_at(deadline, self.chunks.recv()).await {
                    Err(_) => return false,
                    Ok(None) => return true,
                    Ok(Some(chunk)) => self.out.extend(chunk.unwrap()),
                }
            }
        }
    }

    async fn append(path: &Path, bytes: &[u8]) {
        let mut file = tokio::fs::OpenOptions::new().append(true).open(path).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut file, bytes).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_gets_new_lines_once_and_a_rotated_files_successor() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("0.log");
        tokio::fs::write(&live, "t stdout F first\nt stdout F sec").await.unwrap();
        let mut follower = Follower::start(&live, Arc::new(AtomicBool::new(true)));
        assert_eq!(follower.until(b"first\n").await, "first\n");
        append(&live, b"ond\nt stdout F \xff third\n").await;
        assert_eq!(follower.until(b" third\n").await, "first\nsecond\n\u{fffd} third\n");
        tokio::fs::rename(&live, dir.path().join("0.log.20261122-100000")).await.unwrap();
        tokio::fs::write(&live, "t stdout F after rotation\n").await.unwrap();
        let text = follower.until(b"after rotation\n").await;
        assert_eq!(text.matches("second").count(), 1, "nothing read twice: {text}");
        tokio::fs::write(dir.path().join("1.log"), "").await.unwrap();
        assert!(follower.ends_within(STATE_CHECK_PERIOD * 2).await, "a newer instance ends it");
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_ends_once_its_container_stops_with_what_it_wrote_last() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("0.log");
        tokio::fs::write(&live, "t stdout F one\n").await.unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let mut follower = Follower::start(&live, running.clone());
        follower.until(b"one\n").await;
        assert!(!follower.ends_within(STATE_CHECK_PERIOD * 3).await, "it follows while the container runs");
        append(&live, b"t stdout F last words\nt stdout F unended").await;
        running.store(false, Ordering::SeqCst);
        assert!(follower.ends_within(STATE_CHECK_PERIOD * 2).await, "ended once the container stopped");
        assert_eq!(String::from_utf8_lossy(&follower.out), "one\nlast words\nunended\n");
    }

    #[tokio::test(start_paused = true)]
    async fn a_line_longer_than_a_piece_stalls_no_follower() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("0.log");
        let long = vec![b'x'; MAX_RAW_LINE + MAX_RAW_LINE / 2];
        tokio::fs::write(&live, &long).await.unwrap();
        let mut follower = Follower::start(&live, Arc::new(AtomicBool::new(true)));
        append(&live, b"\nt stdout F next\n").await;
        let text = follower.until(b"next\n").await;
        assert_eq!(text.len(), long.len() + "\n".len() * 2 + "next\n".len(), "every byte, once");
    }

    #[test]
    fn instances_and_rotation_order() {
        let dir = tempfile::tempdir().unwrap();
        for name in
            ["0.log", "1.log.20261122-100000", "1.log.20261122-090000", "1.log.20261122-080000.gz", "1.log", "x.log"]
        {
            std::fs::write(dir.path().join(name), "").unwrap();
        }
        assert_eq!(instances(dir.path()).unwrap(), [0, 1]);
        let names = |files: Vec<PathBuf>| -> Vec<String> {
            files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect()
        };
        assert_eq!(
            names(files_for(dir.path(), false).unwrap()),
            ["1.log.20261122-090000", "1.log.20261122-100000", "1.log"]
        );
        assert_eq!(names(files_for(dir.path(), true).unwrap()), ["0.log"]);
        let only_one = tempfile::tempdir().unwrap();
        std::fs::write(only_one.path().join("0.log"), "").unwrap();
        assert!(files_for(only_one.path(), true).unwrap_err().to_string().contains("previous"));
    }

    use proptest::{prelude::*, test_runner::RngSeed};

    /// The offset where the last `tail` raw lines of `text` start, counted the plain way.
    fn naive_tail_start(text: &[u8], tail: u64) -> u64 {
        let lines: Vec<&[u8]> = text.split_inclusive(|b| *b == b'\n').collect();
        let skipped = lines.len().saturating_sub(usize::try_from(tail).unwrap());
        lines[..skipped].iter().map(|l| l.len() as u64).sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: 500,
            failure_persistence: None,
            rng_seed: RngSeed::Fixed(kubelet_core::testing::proptest_seed(module_path!())),
            ..ProptestConfig::default()
        })]

        /// Reading back from the end finds where the plain count of lines says the tail starts,
        /// whatever the lines' lengths and however they fall across blocks.
        #[test]
        fn the_tail_starts_where_a_plain_count_says(
            lines in proptest::collection::vec((0..CHUNK / 2, any::<bool>()), 0..16),
            tail in 0u64..20,
        ) {
            let mut text = Vec::new();
            for (length, ended) in lines {
                text.extend(std::iter::repeat_n(b'x', length));
                if ended {
                    text.push(b'\n');
                }
            }
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("0.log");
            std::fs::write(&path, &text).unwrap();
            let start = runtime.block_on(tail_start(std::slice::from_ref(&path), Some(tail))).unwrap();
            prop_assert_eq!(start, Start { file: 0, offset: naive_tail_start(&text, tail) });
        }

        /// Whatever the bytes, the writer never panics and never writes past `limitBytes`.
        #[test]
        fn the_writer_takes_any_bytes_and_keeps_to_the_limit(
            lines in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..80), 0..20),
            limit in proptest::option::of(1u64..200),
            timestamps in any::<bool>(),
        ) {
            let options = LogOptions { limit_bytes: limit, timestamps, since: Some(Timestamp::UNIX_EPOCH), ..LogOptions::default() };
            let mut writer = LogWriter::new(&options);
            let mut out = Vec::new();
            for line in &lines {
                if writer.write(line, &mut out) == Flow::Limit {
                    break;
                }
            }
            if let Some(limit) = limit {
                prop_assert!(out.len() as u64 <= limit, "{} bytes over a limit of {limit}", out.len());
            }
        }
    }
}
