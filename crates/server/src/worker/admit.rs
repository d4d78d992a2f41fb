//! Admission: takes a queued job into the free slot holding the longest prefix of its
//! prompt (and, for `n` choices, into followers that copy its prefill), with its sampler,
//! output constraint and speculation set up.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use minfer_runtime::{NgramLookup, Prefetch, Sampler, Speculator, StopScanner};
use minfer_tokenizer::StreamDecoder;

use super::state::{engine_error, panic_text, timed_out, Active, Worker};
use crate::error::ApiError;
use crate::job::{choice_seed, Event, Job, PromptProgress};

impl Worker {
    /// Puts a job into the free slot holding the longest prefix of its prompt; the rest
    /// of the prompt is prefilled by the next step. A job of `n` choices also takes the
    /// `n - 1` least recently used other free slots, which start from a copy of that
    /// prefill; with fewer free slots it waits (returns false) until they are free.
    pub(super) fn admit(&mut self, job: Job) -> bool {
        if job.tx.is_closed() {
            return true;
        }
        if Instant::now() >= job.deadline {
            let _ = job.tx.try_send(Event::Error(timed_out()));
            return true;
        }
        let n = job.n.max(1);
        let free = self.slots.iter().filter(|s| s.active.is_none()).count();
        if free < n {
            if n > self.slots.len() {
                // The HTTP side bounds `n` by the slot count; never wait forever.
                let _ = job.tx.try_send(Event::Error(ApiError::bad_request(format!(
                    "field `n` is {n}: must be in [1, {}], the slots of this model",
                    self.slots.len()
                ))));
                return true;
            }
            self.waiting = Some(job);
            return false;
        }
        if let Some(want) = job.slot {
            // The HTTP side checked the range; a busy slot cannot take the job now.
            if self.slots.get(want).is_none_or(|s| s.active.is_some()) {
                let _ = job.tx.try_send(Event::Error(ApiError::unavailable(
                    format!(
                        "slot {want} is busy with another request; retry later, or let the \
                         server pick a slot"
                    ),
                    1,
                )));
                return true;
            }
        }
        let Some(idx) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, s)| s.active.is_none() && job.slot.is_none_or(|w| w == *i))
            .max_by_key(|(_, s)| (s.cached.matching(&job.prompt), u64::MAX - s.last_used))
            .map(|(i, _)| i)
        else {
            return false;
        };
        let mut others: Vec<usize> = (0..self.slots.len())
            .filter(|&i| i != idx && self.slots[i].active.is_none())
            .collect();
        others.sort_by_key(|&i| self.slots[i].last_used);
        others.truncate(n - 1);
        // Without `cache_prompt` nothing is kept: the whole prompt runs again.
        if !job.cache_prompt {
            self.slots[idx].cached.clear();
        }
        // The conversation engine's reuse rule: the longest held prefix, less the last
        // prompt token, whose logits start the generation, from where the slot can go on
        // (a recurrent model's state: its end, or a state checkpoint inside the prefix).
        let engine = &self.engine;
        let mut keep = self.slots[idx]
            .cached
            .reuse_from(&job.prompt, |k| engine.resume_point(idx, k))
            .kept;
        if job.cache_prompt {
            keep = self.take_cached(idx, &job.prompt, keep);
        }
        self.metrics.add_prompt_tokens(job.prompt.len());
        let mut choices = Vec::with_capacity(n);
        for (choice, &slot) in std::iter::once(&idx).chain(&others).enumerate() {
            let mut job = job.clone();
            job.sampling.seed = choice_seed(job.sampling.seed, choice);
            let constraint = job
                .constraint
                .as_ref()
                .map(|(g, _)| g.start(Prefetch::Helper));
            let mut sampler = match Sampler::new(job.sampling.clone()) {
                Ok(s) => s.with_constraint(constraint),
                Err(e) => {
                    let _ = job
                        .tx
                        .try_send(Event::Error(ApiError::bad_request(e.to_string())));
                    return true;
                }
            };
            for &t in &job.prompt {
                sampler.accept(t);
            }
            choices.push((slot, choice, job, sampler));
        }
        for (slot_idx, choice, job, sampler) in choices {
            self.clock += 1;
            let spec = self.speculator(&job);
            let slot = &mut self.slots[slot_idx];
            slot.last_used = self.clock;
            slot.last_prompt = job.prompt.len();
            slot.last_generated = 0;
            let lead = choice == 0;
            if lead {
                // Only unset here: a job is admitted once.
                let _ = job.ran_in.set(slot_idx);
            }
            let mut outbox = VecDeque::new();
            if lead && job.progress {
                outbox.push_back(Event::Progress(PromptProgress {
                    total: job.prompt.len(),
                    cache: keep,
                    processed: keep,
                    elapsed: Duration::ZERO,
                }));
            }
            slot.active = Some(Active {
                sampler,
                decoder: StreamDecoder::new(false),
                stops: StopScanner::new(&job.stop),
                generated: 0,
                cached_tokens: keep,
                // Only the first choice runs the prompt; the others wait for its rows.
                prefill: lead.then(|| job.prompt[keep..].to_vec()),
                followers: if lead { others.clone() } else { Vec::new() },
                choice,
                logits: None,
                outbox,
                logprobs: Vec::new(),
                lp_spans: Vec::new(),
                text_in: 0,
                text_out: 0,
                last_token: None,
                done: false,
                admitted: Instant::now(),
                first_sample: None,
                spec,
                next: None,
                next_logprob: None,
                verifying: false,
                job,
            });
        }
        true
    }

    /// A speculator for `job` when the server speculates. Requests under a grammar
    /// decode plainly (drafts are verified against the unconstrained chain). Requests for
    /// log-probabilities speculate: a verify row is bitwise the logits plain decode
    /// computes at its position, so each token's log-probabilities come from its row.
    fn speculator(&self, job: &Job) -> Option<Speculator> {
        // A verify step draws from no single distribution a post-sampling report could
        // show; grammars decode plainly too.
        if job.constraint.is_some() || job.post_sampling {
            return None;
        }
        let mut sp = if self.draft.is_some() {
            Speculator::shared_draft(self.draft_max).ok()?
        } else {
            Speculator::new(Box::new(NgramLookup::new()), self.lookup?).ok()?
        };
        sp.set_fixed_depth(self.spec_fixed);
        Some(sp)
    }

    /// Starts the other choices of the request in slot `lead`, whose prompt has just
    /// run: each follower slot gets a copy of its KV rows and of its last logits.
    pub(super) fn fork(&mut self, lead: usize, logits: &[f32]) {
        let Some(a) = self.slots[lead].active.as_mut() else {
            return;
        };
        let followers = std::mem::take(&mut a.followers);
        let tx = a.job.tx.clone();
        let n = self.slots[lead].cached.len();
        for f in followers {
            let engine = &mut self.engine;
            match catch_unwind(AssertUnwindSafe(|| engine.copy_prefix(lead, f, n))) {
                Ok(Ok(())) => {
                    let history = self.slots[lead].cached.clone();
                    let slot = &mut self.slots[f];
                    slot.cached = history;
                    if let Some(fa) = slot.active.as_mut() {
                        fa.logits = Some(logits.to_vec());
                    }
                }
                Ok(Err(e)) => self.fail_slot(f, &tx, engine_error(e)),
                Err(p) => {
                    let msg = format!("inference panicked: {}", panic_text(&*p));
                    self.fail_slot(f, &tx, ApiError::internal(msg));
                }
            }
        }
    }
}
