//! The log formats of both daemons, as component-base's: klog's text lines (the default) and
//! the JSON lines of `--logging-format=json`, with `--v`/`--vmodule` verbosity.
//!
//! Verbosity: an event's klog level comes from its tracing level: ERROR, WARN and INFO are
//! v0 (shown always), DEBUG is v2 (shown from `--v=2`), TRACE is v5 (from `--v=5`).
//! `--vmodule=pattern=N` raises (or lowers) the level for the source files whose name matches
//! the glob (`*`, `?`): the file name without `.rs`; for a `mod.rs` also its folder's name; a
//! pattern with `/` matches the path without `.rs`. The first matching pattern wins, as klog's.
//! `RUST_LOG`, when set, chooses the events at start instead (a change of verbosity through
//! `/debug/flags/v` replaces it).

mod fields;
mod filter;
mod format;
mod options;
#[cfg(test)]
mod tests;

pub use filter::{KlogFilter, VModule, level_for, verbosity_of};
pub use format::{Json, JsonFields, KlogFields, KlogText};
pub use options::{Flags, Format, LogError, Options};

use std::sync::Arc;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry, fmt, reload};

type BoxedFilter = Box<dyn Layer<Registry> + Send + Sync>;

/// Changes the verbosity at run time (the kubelet's `/debug/flags/v`).
pub type SetVerbosity = Arc<dyn Fn(i32) -> Result<(), VerbosityError> + Send + Sync>;

/// Why the verbosity could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum VerbosityError {
    /// The logger this control belonged to is gone.
    #[error("the logger's filter cannot be replaced: {0}")]
    Reload(#[from] reload::Error),
}

/// Where the lines go: one stream (stderr), or with `splitStream` errors to stderr and the
/// rest to stdout.
#[derive(Clone, Copy, Debug)]
pub struct Output {
    pub split: bool,
}

/// The writer of one line.
pub enum Stream {
    Stdout(std::io::Stdout),
    Stderr(std::io::Stderr),
}

impl std::io::Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Stdout(s) => s.write(buf),
            Stream::Stderr(s) => s.write(buf),
        }
    }
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Stdout(s) => s.write_all(buf),
            Stream::Stderr(s) => s.write_all(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Stdout(s) => s.flush(),
            Stream::Stderr(s) => s.flush(),
        }
    }
}

impl<'a> fmt::MakeWriter<'a> for Output {
    type Writer = Stream;
    fn make_writer(&'a self) -> Stream {
        Stream::Stderr(std::io::stderr())
    }
    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Stream {
        if self.split && *meta.level() != tracing::Level::ERROR {
            Stream::Stdout(std::io::stdout())
        } else {
            Stream::Stderr(std::io::stderr())
        }
    }
}

/// The formatting layer of `format` writing to `writer`.
pub fn format_layer<S, W>(format: Format, writer: W) -> Box<dyn Layer<S> + Send + Sync>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'a> fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    match format {
        Format::Text => fmt::layer()
            .event_format(KlogText)
            .fmt_fields(KlogFields)
            .with_writer(writer)
            .boxed(),
        Format::Json => fmt::layer()
            .event_format(Json)
            .fmt_fields(JsonFields)
            .with_writer(writer)
            .boxed(),
    }
}

/// Installs the process's logger: `opts`' format and verbosity (`RUST_LOG`, when set, chooses
/// the events at start). The returned function sets the verbosity later.
pub fn init(opts: &Options) -> SetVerbosity {
    let vmodule = opts.vmodule.clone();
    let start: BoxedFilter = match std::env::var("RUST_LOG") {
        Ok(s) if !s.is_empty() => Box::new(EnvFilter::new(s)),
        _ => Box::new(KlogFilter::new(opts.verbosity, vmodule.clone())),
    };
    let (filter, handle) = reload::Layer::new(start);
    let output = Output {
        split: opts.split_stream,
    };
    tracing_subscriber::registry()
        .with(filter)
        .with(format_layer(opts.format, output))
        .init();
    Arc::new(move |v: i32| {
        let next: BoxedFilter = Box::new(KlogFilter::new(v, vmodule.clone()));
        handle.reload(next).map_err(VerbosityError::from)
    })
}
