//! A journal that answers from memory and records every run.

use super::*;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default, Clone)]
pub struct FakeJournal {
    /// `--field _SYSTEMD_UNIT`'s answer; None: journalctl fails (no journald).
    pub units: Option<String>,
    /// What every run prints.
    pub output: String,
    /// Every run's arguments.
    pub runs: Arc<Mutex<Vec<Vec<String>>>>,
}

#[async_trait::async_trait]
impl Journal for FakeJournal {
    async fn units(&self, _: Instant) -> Option<String> {
        self.units.clone()
    }

    fn run(&self, args: Vec<String>, _: Instant) -> BoxStream<'static, Chunk> {
        self.runs.lock().unwrap().push(args);
        let out = Chunk::Data(Bytes::from(self.output.clone()));
        Box::pin(futures::stream::iter([out]))
    }
}
