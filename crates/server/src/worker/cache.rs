//! The worker's side of the shared prompt cache ([`crate::prompt_cache`]): a slot taking
//! a prompt copies the rows of its cached blocks instead of prefilling them, and a slot
//! whose prompt has run, or whose request has ended, offers its full blocks to the cache.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::MutexGuard;

use minfer_runtime::{EngineError, KvHistory};

use super::state::Worker;
use crate::prompt_cache::PromptCache;

fn lock(c: &std::sync::Mutex<PromptCache>) -> MutexGuard<'_, PromptCache> {
    // The cache's state is consistent between calls: a panic elsewhere leaves it usable.
    c.lock().unwrap_or_else(|e| e.into_inner())
}

impl Worker {
    /// Extends slot `idx`, which holds the first `keep` tokens of `prompt`, with the rows
    /// of the cached blocks that follow them, and returns how many prompt tokens it now
    /// holds. The last prompt token is never taken from the cache: its logits start the
    /// generation. A failed copy leaves the slot empty (everything is prefilled).
    pub(super) fn take_cached(&mut self, idx: usize, prompt: &[u32], keep: usize) -> usize {
        let Some(cache) = self.prompt_cache.clone() else {
            return keep;
        };
        let usable = &prompt[..prompt.len().saturating_sub(1)];
        let (block, hits) = {
            let mut c = lock(&cache);
            let keys = c.keys(&self.fingerprint, usable);
            (c.block(), c.lookup(&keys))
        };
        let end = hits.len() * block;
        if end <= keep {
            return keep;
        }
        // Whole blocks from the one `keep` falls in: the slot holds every row before it.
        let first = keep / block;
        let engine = &mut self.engine;
        let copied = catch_unwind(AssertUnwindSafe(|| {
            for (i, rows) in hits.iter().enumerate().skip(first) {
                engine.import_rows(idx, i * block, block, rows)?;
            }
            Ok::<(), EngineError>(())
        }));
        let slot = &mut self.slots[idx];
        if matches!(copied, Ok(Ok(()))) {
            slot.cached = KvHistory::from_tokens(usable[..end].to_vec());
            self.metrics.add_cache_hits(end - keep);
            return end;
        }
        slot.cached.clear();
        let _ = catch_unwind(AssertUnwindSafe(|| self.engine.reset_slot(idx)));
        0
    }

    /// Stores the full blocks of what slot `idx` holds that the cache lacks, and marks
    /// the rest used. Rows that cannot be read are simply not offered.
    pub(super) fn offer(&mut self, idx: usize) {
        let Some(cache) = self.prompt_cache.clone() else {
            return;
        };
        let held = self.engine.slot_len(idx).unwrap_or(0);
        let tokens = self.slots[idx].cached.tokens();
        let tokens = &tokens[..tokens.len().min(held)];
        let (block, keys, missing) = {
            let c = lock(&cache);
            let keys = c.keys(&self.fingerprint, tokens);
            let missing: Vec<usize> = (0..keys.len()).filter(|&i| !c.contains(&keys[i])).collect();
            (c.block(), keys, missing)
        };
        // Read without the lock: other models' workers use the cache meanwhile.
        let mut rows = Vec::with_capacity(missing.len());
        for &i in &missing {
            let engine = &mut self.engine;
            match catch_unwind(AssertUnwindSafe(|| {
                engine.export_rows(idx, i * block, block)
            })) {
                Ok(Ok(w)) => rows.push((i, w)),
                _ => break,
            }
        }
        let mut c = lock(&cache);
        for (i, w) in rows {
            if !c.insert(keys[i], w, &keys[..=i]) {
                break;
            }
        }
        c.touch(&keys);
        self.metrics.set_cache_bytes(c.bytes());
    }
}
