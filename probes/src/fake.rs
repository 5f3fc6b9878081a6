//! Fakes for tests: a scripted [`ExecRunner`].

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::exec::{ExecError, ExecOutput, ExecRunner};

/// One recorded `exec_sync` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCall {
    pub container_id: String,
    pub command: String,
    pub at: Instant,
}

/// Answers `exec_sync` from per-command scripts (the command joined with spaces): queued
/// answers first, then the command's default, then exit code 0. Records every call.
#[derive(Debug, Default)]
pub struct FakeExecRunner {
    state: Mutex<FakeState>,
}

#[derive(Debug, Default)]
struct FakeState {
    queued: HashMap<String, VecDeque<Result<ExecOutput, ExecError>>>,
    defaults: HashMap<String, Result<ExecOutput, ExecError>>,
    calls: Vec<ExecCall>,
}

/// An `ExecOutput` with the given exit code and stdout.
pub fn exit(code: i32, stdout: &str) -> Result<ExecOutput, ExecError> {
    Ok(ExecOutput {
        exit_code: code,
        stdout: stdout.as_bytes().to_vec(),
        stderr: Vec::new(),
    })
}

impl FakeExecRunner {
    pub fn new() -> Self {
        Self::default()
    }

    /// Queues answers for `command`, used once each in order.
    pub fn push(
        &self,
        command: &str,
        answers: impl IntoIterator<Item = Result<ExecOutput, ExecError>>,
    ) {
        let mut s = self.state.lock().unwrap();
        s.queued
            .entry(command.to_string())
            .or_default()
            .extend(answers);
    }

    /// Sets the answer used once the queue for `command` is empty.
    pub fn set_default(&self, command: &str, answer: Result<ExecOutput, ExecError>) {
        self.state
            .lock()
            .unwrap()
            .defaults
            .insert(command.to_string(), answer);
    }

    pub fn calls(&self) -> Vec<ExecCall> {
        self.state.lock().unwrap().calls.clone()
    }

    /// Calls made with `command`.
    pub fn calls_of(&self, command: &str) -> Vec<ExecCall> {
        self.calls()
            .into_iter()
            .filter(|c| c.command == command)
            .collect()
    }
}

impl ExecRunner for FakeExecRunner {
    fn exec_sync(
        &self,
        container_id: &str,
        cmd: &[String],
        _timeout: Duration,
    ) -> BoxFuture<'_, Result<ExecOutput, ExecError>> {
        let command = cmd.join(" ");
        let mut s = self.state.lock().unwrap();
        s.calls.push(ExecCall {
            container_id: container_id.to_string(),
            command: command.clone(),
            at: Instant::now(),
        });
        let answer = s
            .queued
            .get_mut(&command)
            .and_then(VecDeque::pop_front)
            .or_else(|| s.defaults.get(&command).cloned())
            .unwrap_or_else(|| exit(0, ""));
        Box::pin(async move { answer })
    }
}
