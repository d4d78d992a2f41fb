//! The worker's side of [`crate::task`]: a task runs in the least recently used idle
//! slot, whose cached prefix it forgets.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use super::state::{panic_text, timed_out, Worker};
use crate::error::ApiError;
use crate::task::Task;

impl Worker {
    /// Runs `task` in an idle slot and answers it; gives it back when every slot is busy.
    pub(super) fn run_task(&mut self, task: Task) -> Option<Task> {
        if task.reply.is_closed() {
            return None;
        }
        if Instant::now() >= task.deadline {
            let _ = task.reply.send(Err(timed_out()));
            return None;
        }
        let Some(idx) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .min_by_key(|(_, s)| s.last_used)
            .map(|(i, _)| i)
        else {
            return Some(task);
        };
        // The slot's rows are rewritten from position 0: its cached prefix is gone.
        self.slots[idx].cached.clear();
        let (kind, deadline) = (&task.kind, task.deadline);
        let engine = &mut self.engine;
        let out = catch_unwind(AssertUnwindSafe(|| {
            crate::task::compute(engine, idx, kind, deadline)
        }))
        .unwrap_or_else(|p| {
            Err(ApiError::internal(format!(
                "inference panicked: {}",
                panic_text(&*p)
            )))
        });
        let _ = catch_unwind(AssertUnwindSafe(|| self.engine.reset_slot(idx)));
        let _ = task.reply.send(out);
        None
    }
}
