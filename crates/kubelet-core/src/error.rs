//! [`ErrorChain`]: an error with all its sources, on one line.

use std::{error::Error, fmt};

/// Displays an error followed by each of its sources, joined by `": "`, for logs.
///
/// Library errors here keep their causes as [`Error::source`] rather than in their message, so
/// a log line that should say everything prints the chain:
/// `warn!(error = %ErrorChain(&err), "...")`.
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'a));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn prints_every_source() {
        let err = Outer(std::io::Error::other("inner"));
        assert_eq!(ErrorChain(&err).to_string(), "outer: inner");
        assert_eq!(ErrorChain(&std::io::Error::other("alone")).to_string(), "alone");
    }
}
