//! The decode step: samples a token for every ready slot, drafts and verifies
//! speculative blocks, runs every slot's next tokens (and admitted prompts) in one batched
//! `step`, and emits text, log-probabilities and the final summary to each request.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use minfer_runtime::{DraftAsk, SeqStep, SlotSnapshot, StopEvent};
use minfer_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use super::state::{engine_error, panic_text, timed_out, Active, Worker};
use crate::error::ApiError;
use crate::job::{logprob_of, post_sampling_of, Event, Fault, Finish, PromptProgress, Summary};
use crate::metrics::Metrics;

impl Worker {
    /// Samples one token for every ready slot, then runs all continuing slots and the
    /// prompts of newly admitted ones together in one step.
    pub(super) fn decode_turn(&mut self) -> bool {
        let mut steps = Vec::new();
        // Slots whose draft model drafts this turn, all together after this loop:
        // (slot, pending token, its position).
        let mut to_draft = Vec::new();
        let shared_draft = self.draft.is_some();
        // Slots whose prompt runs in this step: their blocks go to the prompt cache after.
        let mut prefilled = Vec::new();
        for idx in 0..self.slots.len() {
            let tok = Arc::clone(&self.tok);
            let metrics = Arc::clone(&self.metrics);
            let slot = &mut self.slots[idx];
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if a.job.tx.is_closed() && a.outbox.is_empty() {
                // The client went away: free the slot now; its KV stays valid for reuse.
                slot.active = None;
                continue;
            }
            if a.job.tx.capacity() == 0 && Instant::now() >= a.job.deadline {
                // Past its deadline with a reader that has stopped taking events: nothing
                // more can reach it (the HTTP side ends it with a 504), so free the slot
                // instead of waiting on the reader; its KV stays valid for reuse.
                slot.active = None;
                continue;
            }
            if let Some(tokens) = a.prefill.take() {
                let fault = a.job.fault;
                let tx = a.job.tx.clone();
                // A fault attributed to one request fails only that request.
                if let Err(p) = catch_unwind(|| {
                    if fault == Some(Fault::Panic) {
                        panic!("injected fault");
                    }
                }) {
                    let msg = format!("inference panicked: {}", panic_text(&*p));
                    self.fail_slot(idx, &tx, ApiError::internal(msg));
                    continue;
                }
                let pos0 = slot.cached.len();
                slot.cached.extend(&tokens);
                // A recurrent model copies the slot's state at the prompt's checkpoints.
                self.engine.checkpoint_prompt(idx, pos0 + tokens.len());
                metrics.add_prefilled(tokens.len());
                prefilled.push(idx);
                steps.push(SeqStep {
                    slot: idx,
                    tokens,
                    pos0,
                    n_out: 1,
                });
                continue;
            }
            if a.done || !a.outbox.is_empty() || (a.logits.is_none() && a.next.is_none()) {
                continue;
            }
            if Instant::now() >= a.job.deadline {
                a.outbox.push_back(Event::Error(timed_out()));
                a.done = true;
                continue;
            }
            let pos = slot.cached.len();
            let ctx = self.engine.slot_ctx();
            let r = catch_unwind(AssertUnwindSafe(|| sample_one(a, &tok, &metrics, pos, ctx)));
            match r {
                Ok(Some(t)) if shared_draft && a.spec.is_some() => {
                    slot.cached.push(t);
                    to_draft.push((idx, t, pos));
                }
                Ok(Some(t)) => {
                    // With speculation the step runs `t` and the tokens drafted after
                    // it, all rows wanted; `cached` gains the drafted ones once accepted.
                    let block = match a.spec.as_mut() {
                        Some(sp) => sp
                            .plan(slot.cached.tokens(), t, ctx - pos, &a.sampler)
                            .map(<[u32]>::to_vec),
                        None => Ok(vec![t]),
                    };
                    match block {
                        Ok(tokens) => {
                            a.verifying = a.spec.is_some();
                            slot.cached.push(t);
                            steps.push(SeqStep {
                                slot: idx,
                                n_out: tokens.len(),
                                tokens,
                                pos0: pos,
                            });
                        }
                        Err(e) => {
                            let tx = a.job.tx.clone();
                            self.fail_slot(idx, &tx, engine_error(e));
                        }
                    }
                }
                Ok(None) => {}
                Err(p) => {
                    let tx = a.job.tx.clone();
                    let msg = format!("inference panicked: {}", panic_text(&*p));
                    self.fail_slot(idx, &tx, ApiError::internal(msg));
                }
            }
            if let Some(a) = self.slots[idx].active.as_ref() {
                self.slots[idx].last_generated = a.generated;
            }
        }
        if !to_draft.is_empty() {
            self.draft_turn(&to_draft, &mut steps);
        }
        if steps.is_empty() {
            return false;
        }
        let slow = steps.iter().any(|s| {
            self.slots[s.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.job.fault == Some(Fault::Slow))
        });
        if slow {
            std::thread::sleep(Duration::from_millis(10));
        }
        let slow_prefill = steps.iter().any(|s| {
            self.slots[s.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.job.fault == Some(Fault::SlowPrefill) && a.generated == 0)
        });
        if slow_prefill {
            std::thread::sleep(Duration::from_millis(1500));
        }
        self.metrics.add_decode(steps.len());
        if self.has_fault(&steps, Fault::KernelPanic) {
            // Deep enough to be inside the first layer's kernels.
            self.engine.inject_kernel_panic(12);
        }
        let mut snaps = match self.snapshot_verifying(&steps) {
            Ok(snaps) => snaps,
            Err(e) => {
                self.fail_steps(&steps, engine_error(e));
                return true;
            }
        };
        let engine = &mut self.engine;
        let t0 = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| engine.step(&steps))) {
            Ok(Ok(rows)) => {
                let elapsed = t0.elapsed();
                let mut rewinds = Vec::new();
                for (s, row) in steps.iter().zip(rows) {
                    let Some(a) = self.slots[s.slot].active.as_mut() else {
                        continue;
                    };
                    if std::mem::take(&mut a.verifying) {
                        let kept = self.verify(s, row, elapsed);
                        let snap = snaps.iter().position(|x| x.slot() == s.slot);
                        if let (Some(i), true) = (snap, kept < s.tokens.len()) {
                            let tokens = s.tokens[..kept].to_vec();
                            rewinds.push((snaps.swap_remove(i), s.pos0, tokens));
                        }
                        continue;
                    }
                    if !a.followers.is_empty() {
                        self.fork(s.slot, &row);
                    }
                    if let Some(a) = self.slots[s.slot].active.as_mut() {
                        a.logits = Some(row);
                    }
                }
                self.rewind(rewinds);
                for idx in prefilled {
                    self.offer(idx);
                }
                let st = self.engine.checkpoint_stats();
                self.metrics.set_checkpoints(st.bytes, st.restored);
            }
            Ok(Err(e)) => {
                let err = engine_error(e);
                self.fail_steps(&steps, err);
            }
            Err(p) => {
                let err = ApiError::internal(format!("inference panicked: {}", panic_text(&*p)));
                self.fail_steps(&steps, err);
            }
        }
        true
    }

    /// Drafts for every slot in `to_draft` (slot, pending token, its position) with the
    /// draft model, all of them in shared draft forwards, and adds each slot's block (the
    /// pending token, then what it drafted) to `steps`.
    fn draft_turn(&mut self, to_draft: &[(usize, u32, usize)], steps: &mut Vec<SeqStep>) {
        let ctx = self.engine.slot_ctx();
        let depths: Vec<usize> = to_draft
            .iter()
            .map(|&(idx, _, pos)| {
                self.slots[idx]
                    .active
                    .as_mut()
                    .and_then(|a| a.spec.as_mut())
                    .map_or(0, |sp| sp.depth_for(ctx - pos))
            })
            .collect();
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let mut blocks: Vec<Vec<u32>> = Vec::new();
        let mut secs = 0.0;
        if let (Some(draft), true) = (self.draft.as_mut(), deepest > 0) {
            let slots = &self.slots;
            let asks: Vec<DraftAsk<'_>> = to_draft
                .iter()
                .zip(&depths)
                .filter_map(|(&(idx, _, _), &max)| {
                    let a = slots[idx].active.as_ref()?;
                    Some(DraftAsk {
                        slot: idx,
                        context: slots[idx].cached.tokens(),
                        max,
                        target: &a.sampler,
                    })
                })
                .collect();
            let t0 = Instant::now();
            let r = catch_unwind(AssertUnwindSafe(|| draft.propose(&asks, &mut blocks)));
            // Every drafting slot waited for the whole draft: its cost per drafted token
            // is the deepest draft's.
            secs = t0.elapsed().as_secs_f64() / deepest as f64;
            let asked: Vec<usize> = asks.iter().map(|a| a.slot).collect();
            drop(asks);
            let err = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(engine_error(e)),
                Err(p) => {
                    for &idx in &asked {
                        draft.forget(idx);
                    }
                    let msg = format!("the draft model panicked: {}", panic_text(&*p));
                    Some(ApiError::internal(msg))
                }
            };
            if let Some(err) = err {
                for &(idx, _, _) in to_draft {
                    if let Some(tx) = self.slots[idx].active.as_ref().map(|a| a.job.tx.clone()) {
                        self.fail_slot(idx, &tx, err.clone());
                    }
                }
                return;
            }
            // `blocks` follows `asks`, which skipped the slots that do not draft.
            let mut it = blocks.into_iter();
            blocks = depths
                .iter()
                .map(|&d| {
                    if d > 0 {
                        it.next().unwrap_or_default()
                    } else {
                        Vec::new()
                    }
                })
                .collect();
        }
        for (i, &(idx, t, pos)) in to_draft.iter().enumerate() {
            let Some(a) = self.slots[idx].active.as_mut() else {
                continue;
            };
            let Some(sp) = a.spec.as_mut() else {
                continue;
            };
            let drafted = blocks.get(i).map_or(&[][..], Vec::as_slice);
            let tokens = sp.plan_drafted(pos + 1, t, drafted, secs).to_vec();
            a.verifying = true;
            steps.push(SeqStep {
                slot: idx,
                n_out: tokens.len(),
                tokens,
                pos0: pos,
            });
        }
    }

    /// A copy of the recurrent state of every slot of `steps` that verifies a block of
    /// drafts, taken before the step runs it: a recurrent layer's state cannot be taken
    /// back by moving a position, so a block with rejected drafts is undone from this
    /// copy ([`Self::rewind`]). Empty for a model without recurrent layers.
    fn snapshot_verifying(
        &mut self,
        steps: &[SeqStep],
    ) -> Result<Vec<SlotSnapshot>, minfer_runtime::EngineError> {
        let mut snaps = Vec::new();
        if !self.engine.engine().is_recurrent() {
            return Ok(snaps);
        }
        for s in steps {
            let verifying = self.slots[s.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.verifying);
            if verifying && s.tokens.len() > 1 {
                snaps.extend(self.engine.snapshot_slot(s.slot)?);
            }
        }
        Ok(snaps)
    }

    /// Undoes the rejected part of each block in `rewinds` (the slot's state from before
    /// the block, the block's first position, and its kept tokens: the pending one and
    /// the accepted drafts): the state is put back and the kept tokens run again, all
    /// slots in one step, so each slot's state holds exactly the positions its KV and
    /// `cached` hold, bit for bit what plain decode would have left. A slot whose rewind
    /// fails is failed and forgotten.
    fn rewind(&mut self, rewinds: Vec<(SlotSnapshot, usize, Vec<u32>)>) {
        if rewinds.is_empty() {
            return;
        }
        let mut steps = Vec::with_capacity(rewinds.len());
        for (snap, pos0, tokens) in rewinds {
            let slot = snap.slot();
            if snap.positions() != pos0 {
                // A block runs from where the slot's state stopped; anything else would
                // put back a state for other positions.
                let why = format!(
                    "slot {slot}: a speculative block from position {pos0} over state holding {}",
                    snap.positions()
                );
                self.forget_slot(slot, ApiError::internal(why));
                continue;
            }
            match self.engine.restore_slot(&snap) {
                Ok(()) => steps.push(SeqStep {
                    slot,
                    tokens,
                    pos0,
                    n_out: 1,
                }),
                Err(e) => self.forget_slot(slot, engine_error(e)),
            }
        }
        self.metrics.add_rewinds(steps.len());
        let engine = &mut self.engine;
        let err = match catch_unwind(AssertUnwindSafe(|| engine.step(&steps))) {
            Ok(Ok(_)) => return,
            Ok(Err(e)) => engine_error(e),
            Err(p) => ApiError::internal(format!("inference panicked: {}", panic_text(&*p))),
        };
        for s in &steps {
            self.forget_slot(s.slot, err.clone());
        }
    }

    /// Fails slot `idx`'s request, if it still has one, with `err`, and forgets the
    /// slot's KV and state either way.
    fn forget_slot(&mut self, idx: usize, err: ApiError) {
        match self.slots[idx].active.as_ref().map(|a| a.job.tx.clone()) {
            Some(tx) => self.fail_slot(idx, &tx, err),
            None => {
                self.slots[idx].cached.clear();
                let _ = catch_unwind(AssertUnwindSafe(|| self.engine.reset_slot(idx)));
            }
        }
    }

    /// Verifies a slot's speculative block against its logits rows: the accepted drafted
    /// tokens are emitted now (their KV rows are written: `cached` records them), and the
    /// target's own next token waits in `next` to be emitted and run by the next step.
    /// Returns how many of the block's tokens the sequence keeps (the pending one and the
    /// accepted drafts), the whole block when there is nothing to verify.
    fn verify(&mut self, s: &SeqStep, mut rows: Vec<f32>, elapsed: Duration) -> usize {
        let n_vocab = self.engine.n_vocab();
        let ctx = self.engine.slot_ctx();
        let slot = &mut self.slots[s.slot];
        let Some(a) = slot.active.as_mut() else {
            return s.tokens.len();
        };
        let Some(sp) = a.spec.as_mut() else {
            return s.tokens.len();
        };
        let before = sp.stats();
        let mut out = Vec::with_capacity(s.tokens.len());
        // The sampler rewrites the rows it samples (penalties, biases): log-probabilities
        // are of the model's raw logits, as plain decode reports them.
        let raw = a.job.logprobs.map(|k| (k, rows.clone()));
        sp.verify(&mut a.sampler, &mut rows, n_vocab, elapsed, &mut out);
        let logprob = |i: usize, t: u32| {
            let (k, raw) = raw.as_ref()?;
            let row = raw.get(i * n_vocab..(i + 1) * n_vocab)?;
            Some(logprob_of(&self.tok, row, t, *k))
        };
        let after = sp.stats();
        self.metrics.add_draft(
            (after.drafted - before.drafted) as usize,
            (after.accepted - before.accepted) as usize,
        );
        let kept = out.len();
        let Some(next) = out.pop() else {
            return s.tokens.len();
        };
        a.next_logprob = logprob(out.len(), next);
        for (i, &t) in out.iter().enumerate() {
            // `t` ran at this position; plain decode would have sampled it there.
            let pos = s.pos0 + 1 + i;
            if !self.tok.is_eog(t) {
                if let Some(lp) = logprob(i, t) {
                    a.logprobs.push(lp);
                }
            }
            if emit(a, &self.tok, &self.metrics, t, pos, ctx).is_none() {
                return kept;
            }
            slot.cached.push(t);
        }
        a.next = Some(next);
        slot.last_generated = a.generated;
        kept
    }

    /// Whether a request in `steps` asked for `fault`.
    fn has_fault(&self, steps: &[SeqStep], fault: Fault) -> bool {
        steps.iter().any(|s| {
            self.slots[s.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.job.fault == Some(fault))
        })
    }

    /// Fails every request of `steps` with `err`, forgetting their slots' KV.
    fn fail_steps(&mut self, steps: &[SeqStep], err: ApiError) {
        for s in steps {
            if let Some(tx) = self.slots[s.slot].active.as_ref().map(|a| a.job.tx.clone()) {
                self.fail_slot(s.slot, &tx, err.clone());
            }
        }
    }

    /// Hands queued events to their requests; frees slots whose request is over.
    pub(super) fn flush(&mut self) -> bool {
        let mut progressed = false;
        for idx in 0..self.slots.len() {
            let slot = &mut self.slots[idx];
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            while a.outbox.len() > 1 || (!a.done && !a.outbox.is_empty()) {
                let Some(ev) = a.outbox.pop_front() else {
                    break;
                };
                match a.job.tx.try_send(ev) {
                    Ok(()) => progressed = true,
                    Err(mpsc::error::TrySendError::Full(ev)) => {
                        a.outbox.push_front(ev);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        a.outbox.clear();
                        a.done = true;
                    }
                }
            }
            // The last event goes out only after the slot is released and published, so
            // a client that has its answer sees the slot free in /slots and /metrics.
            if a.done && a.outbox.len() <= 1 && (a.outbox.is_empty() || a.job.tx.capacity() > 0) {
                let last = a.outbox.pop_front();
                slot.last_generated = a.generated;
                let Some(a) = slot.active.take() else {
                    continue;
                };
                self.publish();
                if let Some(ev) = last {
                    // Sole sender with free capacity: this cannot be Full.
                    let _ = a.job.tx.try_send(ev);
                }
                // What the request generated joins the cache too (a later turn of the
                // conversation starts with it).
                self.offer(idx);
                progressed = true;
            }
        }
        progressed
    }
}

/// Samples the next token of `a` from its pending logits; returns the token when the
/// generation continues (it must then run at position `pos`).
fn sample_one(
    a: &mut Active,
    tok: &Tokenizer,
    metrics: &Metrics,
    pos: usize,
    slot_ctx: usize,
) -> Option<u32> {
    let t = match a.next.take() {
        // Sampled by a verify step, already in the sampler's window.
        Some(t) => {
            if let Some(lp) = a.next_logprob.take().filter(|_| !tok.is_eog(t)) {
                a.logprobs.push(lp);
            }
            t
        }
        None => {
            let mut logits = a.logits.take()?;
            let raw = a
                .job
                .logprobs
                .filter(|_| !a.job.post_sampling)
                .map(|_| logits.clone());
            let t = match a.sampler.try_sample(&mut logits) {
                Ok(t) => t,
                Err(e) => {
                    // The grammar's own failure: the request ends with it, never
                    // unconstrained; a grammar past an engine limit is the caller's error.
                    let field = a.job.constraint.as_ref().map_or("grammar", |c| c.1);
                    let err = ApiError::constraint(field, &e);
                    a.outbox.push_back(Event::Error(err));
                    a.done = true;
                    return None;
                }
            };
            if !tok.is_eog(t) {
                if let (Some(k), Some(raw)) = (a.job.logprobs, raw) {
                    a.logprobs.push(logprob_of(tok, &raw, t, k));
                } else if let (Some(k), true) = (a.job.logprobs, a.job.post_sampling) {
                    a.logprobs
                        .push(post_sampling_of(tok, &a.sampler.drawn_from(t), t, k));
                }
                a.sampler.accept(t);
            }
            t
        }
    };
    emit(a, tok, metrics, t, pos, slot_ctx)
}

/// Hands the sampled token `t` of `a` to its request (text, stop strings, limits);
/// returns it when the generation continues (it must then run at position `pos`).
fn emit(
    a: &mut Active,
    tok: &Tokenizer,
    metrics: &Metrics,
    t: u32,
    pos: usize,
    slot_ctx: usize,
) -> Option<u32> {
    let now = Instant::now();
    match a.last_token {
        None => metrics.observe_ttft(now - a.job.arrived),
        Some(prev) => metrics.observe_itl(now - prev),
    }
    a.last_token = Some(now);
    if a.first_sample.is_none() && a.choice == 0 && a.job.progress {
        a.outbox.push_back(Event::Progress(PromptProgress {
            total: a.job.prompt.len(),
            cache: a.cached_tokens,
            processed: a.job.prompt.len(),
            elapsed: now.saturating_duration_since(a.admitted),
        }));
    }
    a.first_sample.get_or_insert(now);
    if tok.is_eog(t) {
        finish(a, metrics, Finish::Stop, true);
        return None;
    }
    a.generated += 1;
    metrics.add_generated(1);
    let piece = match a.decoder.push(tok, t) {
        Ok(p) => p,
        Err(_) => char::REPLACEMENT_CHARACTER.to_string(),
    };
    let start = a.text_in;
    a.text_in += piece.len();
    while a.lp_spans.len() < a.logprobs.len() {
        a.lp_spans.push((start, a.text_in));
    }
    match a.stops.push(&piece) {
        StopEvent::Text(text) => {
            a.text_out += text.len();
            let logprobs = released_logprobs(a);
            if !text.is_empty() || !logprobs.is_empty() {
                a.outbox.push_back(Event::Chunk {
                    choice: a.index(),
                    text,
                    logprobs,
                    generated: a.generated,
                });
            }
        }
        StopEvent::Stopped(text) => {
            a.text_out += text.len();
            let logprobs = released_logprobs(a);
            // The rest are the stop string's tokens, whose text is dropped.
            a.logprobs.clear();
            a.lp_spans.clear();
            a.outbox.push_back(Event::Chunk {
                choice: a.index(),
                text,
                logprobs,
                generated: a.generated,
            });
            finish(a, metrics, Finish::Stop, false);
            return None;
        }
    }
    if a.generated >= a.job.max_tokens || pos + 1 > slot_ctx {
        finish(a, metrics, Finish::Length, true);
        return None;
    }
    Some(t)
}

/// The log-probabilities of `a`'s tokens whose text has been passed on (a token whose
/// first byte has, or one with no text of its own once the text up to it has), in order.
fn released_logprobs(a: &mut Active) -> Vec<crate::job::TokenLogprob> {
    let out = a.text_out;
    let n = a
        .lp_spans
        .iter()
        .take_while(|&&(s, e)| s < out || (s == e && e <= out))
        .count();
    a.lp_spans.drain(..n);
    a.logprobs.drain(..n).collect()
}

/// Ends a generation; held-back text is released unless a stop string matched.
fn finish(a: &mut Active, metrics: &Metrics, reason: Finish, release: bool) {
    let mut rest = String::new();
    if release {
        rest = a.stops.finish();
        rest.push_str(&a.decoder.flush());
    }
    if !rest.is_empty() || !a.logprobs.is_empty() {
        // Everything held back goes out now (nothing is held without `release`).
        a.lp_spans.clear();
        let logprobs = std::mem::take(&mut a.logprobs);
        a.outbox.push_back(Event::Chunk {
            choice: a.index(),
            text: rest,
            logprobs,
            generated: a.generated,
        });
    }
    let now = Instant::now();
    let first = a.first_sample.unwrap_or(now);
    let stop_word = a
        .stops
        .matched()
        .and_then(|m| a.job.stop.iter().position(|s| s == m));
    let summary = Summary {
        choice: a.index(),
        finish: reason,
        prompt_tokens: a.job.prompt.len(),
        cached_tokens: a.cached_tokens,
        completion_tokens: a.generated,
        prompt_time: first.saturating_duration_since(a.admitted),
        predicted_time: now.saturating_duration_since(first),
        stop_word,
    };
    // The prompt ran once for all choices: only the first counts its time, as the
    // prefill counter counts its tokens once.
    let prompt_time = if a.choice == 0 {
        summary.prompt_time
    } else {
        Duration::ZERO
    };
    metrics.add_phase_times(prompt_time, summary.predicted_time);
    a.outbox.push_back(Event::Done(summary));
    a.done = true;
}
