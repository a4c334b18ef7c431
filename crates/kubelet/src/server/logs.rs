//! Container logs in the CRI format: `<RFC 3339 time> <stdout|stderr> <P|F> <content>` per line,
//! where `P` marks a partial line the runtime split and `F` the end of one.
//!
//! A container's logs live in `<pod log dir>/<container>/<restart>.log`; the kubelet's log
//! rotation renames a full file to `<restart>.log.<timestamp>` and starts a new one, so one
//! container instance's logs are its rotated files in name order, then the live file.

use std::{
    io,
    path::{Path, PathBuf},
};

/// One line of a container's output, its partial pieces joined.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) struct LogLine {
    /// The time the runtime stamped on its last piece, as written (RFC 3339 with nanoseconds).
    pub timestamp: String,
    /// `stdout` or `stderr`.
    pub stream: String,
    /// The text, without the newline.
    pub content: String,
}

impl LogLine {
    /// The line as `kubectl logs` prints it, with the timestamp first when asked.
    pub(crate) fn render(&self, timestamps: bool) -> String {
        if timestamps { format!("{} {}\n", self.timestamp, self.content) } else { format!("{}\n", self.content) }
    }
}

/// One raw line of a CRI log file, split; `None` when it is not in the CRI format.
pub(crate) fn parse_raw(line: &str) -> Option<(&str, &str, bool, &str)> {
    let mut parts = line.splitn(4, ' ');
    let timestamp = parts.next()?;
    let stream = parts.next()?;
    let tag = parts.next()?;
    let content = parts.next().unwrap_or("");
    if !matches!(stream, "stdout" | "stderr") {
        return None;
    }
    // The tag may carry more flags after `P`/`F`, separated by `:`.
    let partial = match tag.split(':').next()? {
        "P" => true,
        "F" => false,
        _ => return None,
    };
    Some((timestamp, stream, partial, content))
}

/// Joins partial pieces into whole lines, per stream.
#[derive(Debug, Default, Clone)]
pub(crate) struct Reassembler {
    stdout: String,
    stderr: String,
}

impl Reassembler {
    /// Feeds one raw line; returns the whole line it completes, if any. Lines not in the CRI
    /// format are passed through as they are (stdout, no timestamp).
    pub(crate) fn push(&mut self, raw: &str) -> Option<LogLine> {
        let Some((timestamp, stream, partial, content)) = parse_raw(raw) else {
            return Some(LogLine { timestamp: String::new(), stream: "stdout".to_owned(), content: raw.to_owned() });
        };
        let pending = if stream == "stdout" { &mut self.stdout } else { &mut self.stderr };
        pending.push_str(content);
        if partial {
            return None;
        }
        Some(LogLine { timestamp: timestamp.to_owned(), stream: stream.to_owned(), content: std::mem::take(pending) })
    }
}

/// Whole lines of a log text, the last `tail` of them when given.
pub(crate) fn lines(text: &str, tail: Option<usize>) -> Vec<LogLine> {
    let mut reassembler = Reassembler::default();
    let all: Vec<LogLine> = text.lines().filter(|l| !l.is_empty()).filter_map(|l| reassembler.push(l)).collect();
    match tail {
        Some(n) if n < all.len() => all[all.len() - n..].to_vec(),
        _ => all,
    }
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
    use super::*;

    #[test]
    fn partial_lines_are_joined_per_stream() {
        let text = "2026-11-22T10:00:00.000000001Z stdout P hello \n\
                    2026-11-22T10:00:00.000000002Z stderr F oops\n\
                    2026-11-22T10:00:00.000000003Z stdout F world\n\
                    2026-11-22T10:00:00.000000004Z stdout F \n\
                    not a cri line\n";
        let got = lines(text, None);
        let shown: Vec<(&str, &str)> = got.iter().map(|l| (l.stream.as_str(), l.content.as_str())).collect();
        assert_eq!(
            shown,
            [("stderr", "oops"), ("stdout", "hello world"), ("stdout", ""), ("stdout", "not a cri line")]
        );
        assert_eq!(got[1].timestamp, "2026-11-22T10:00:00.000000003Z");
        assert_eq!(got[1].render(true), "2026-11-22T10:00:00.000000003Z hello world\n");
        assert_eq!(got[1].render(false), "hello world\n");
    }

    #[test]
    fn tail_counts_whole_lines() {
        let text = "t stdout F a\nt stdout P b\nt stdout F c\nt stdout F d\n";
        let contents = |tail| lines(text, tail).into_iter().map(|l| l.content).collect::<Vec<_>>();
        assert_eq!(contents(Some(2)), ["bc", "d"]);
        assert_eq!(contents(Some(10)), ["a", "bc", "d"]);
        assert_eq!(contents(Some(0)), Vec::<String>::new());
    }

    #[test]
    fn raw_lines_parse_or_not() {
        assert_eq!(parse_raw("t stdout F x y"), Some(("t", "stdout", false, "x y")));
        assert_eq!(parse_raw("t stderr P:extra x"), Some(("t", "stderr", true, "x")));
        assert_eq!(parse_raw("t stdin F x"), None);
        assert_eq!(parse_raw("t stdout Q x"), None);
        assert_eq!(parse_raw("garbage"), None);
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
}
